"""The policy's next-token distribution, as both the sampler and the trainer read it.

The policy is softmax(logits / temperature) over the *real* vocabulary: Qwen pads its embedding
to 151,936 rows, more than its tokenizer has (151,665 + our tags), and those rows were never
trained, so ids >= `vocab_size` are cut away everywhere. The sampler records these log-probs for
the tokens it samples; the trainer recomputes them from a forward; on-policy they agree.

Sampling may restrict the policy further (top-k, top-p, a structural ban such as no more
`<Parallel>` once the block budget is spent). Those restrictions shape *which* token is drawn,
not the recorded log-prob: GRPO compares the policy with itself, and the trainer cannot see them.
Greedy decoding (temperature 0) records log-probs at temperature 1.

`Policy` is the one value that says which distribution that is (tags, attention mode, path
position stride, temperature, vocabulary): the sampler and the trainer both take it, so
on-policy training does not depend on two roads of arguments agreeing.
`plain_draw` is the sampler's draw as the algorithm reads: softmax, sample, record the log-prob.
Not here: the same draw in fewer passes at a real vocabulary (draw_in_place.py, which the sampler
calls), the sampling loop (sampler.py), the training read of a whole trace (forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import NanoparError
from .layout import MODES
from .tags import PARALLEL_R1, TagIds, TagSchema


@dataclass(frozen=True)
class Policy:
    """Everything that decides the distribution sampled and trained, in one frozen value."""

    tag_ids: TagIds | None  # the schema's tags as token ids (tag_ids.schema); None = plain decoding (nothing forks)
    mode: str = "structured"  # attention layout: "structured" (Unseen: paths isolated) or "causal" (Seen)
    temperature: float = 1.0  # softmax(logits / T); 0 = greedy sampling, log-probs then read at T = 1
    vocab_size: int | None = None  # len(tokenizer): ids >= it (Qwen's padded rows) are cut away; None = all
    path_stride: int = 0  # structured: path k starts at start + k * stride; 0 = shared, >= longest path = disjoint

    def __post_init__(self):
        if self.mode not in MODES:
            raise NanoparError(f"unknown attention mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.temperature < 0:
            raise NanoparError(f"temperature must be >= 0, not {self.temperature}")
        if self.path_stride < 0:
            raise NanoparError(f"path_stride must be >= 0, not {self.path_stride}")

    @classmethod
    def for_tokenizer(cls, tokenizer, mode: str = "structured", temperature: float = 1.0, path_stride: int = 0,
           schema: TagSchema = PARALLEL_R1) -> "Policy":
        """The policy of a model with this tokenizer, in `schema`'s tags (each must be a single token)."""
        return cls(TagIds.from_tokenizer(tokenizer, schema), mode, temperature, len(tokenizer), path_stride)

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T) over the real vocabulary. [..., V] -> [..., vocab_size]"""
        return policy_logprobs(logits, self.temperature, self.vocab_size)


def policy_logprobs(logits: torch.Tensor, temperature: float, vocab_size: int | None) -> torch.Tensor:
    """log softmax(logits / T) over the real vocabulary. [..., V] -> [..., vocab_size], float32."""
    return torch.log_softmax(policy_scores(logits, temperature, vocab_size), dim=-1)


def policy_scores(logits: torch.Tensor, temperature: float, vocab_size: int | None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """logits / T over the real vocabulary, the policy's log-probs before normalisation; T = 0
    (greedy) reads at T = 1. [..., V] -> [..., vocab_size], float32: a view of `logits` when
    they are float32 at T = 0 or 1, else a new tensor, or `out` (float32, the result's shape) when
    given: a chunked read writes every chunk into one buffer instead of a fresh one each."""
    if vocab_size is not None and vocab_size < logits.shape[-1]:
        logits = logits[..., :vocab_size]  # (a slice costs a full copy in backward: only when needed)
    scaled = temperature_divisor(temperature) != 1.0
    if out is not None and not scores_are_a_view(logits, temperature):  # the same numbers as below, no gradient
        out.copy_(logits)
        return out.div_(temperature) if scaled else out
    if scaled and logits.dtype != torch.float32:
        # bf16/fp16: the float32 copy is new, so divide it in place; `logits.float() / T` gives the same numbers
        # through a second [..., V] tensor, which costs more than the division (bench/races.py)
        return logits.float().div_(temperature)
    logits = logits.float()  # float32 already: a view, not a copy
    if scaled:
        logits = logits / temperature
    return logits


def temperature_divisor(temperature: float) -> float:
    """What `policy_scores` divides the logits by: T, or 1 at T = 0 (greedy reads at T = 1).
    d scores / d logits is 1 / this."""
    return temperature if temperature > 0 else 1.0


def scores_are_a_view(logits: torch.Tensor, temperature: float) -> bool:
    """Whether `policy_scores` returns a view of `logits` (float32 at T = 0 or 1), writing no new tensor."""
    return logits.dtype == torch.float32 and temperature_divisor(temperature) == 1.0


def plain_draw(
    logits: torch.Tensor,  # [N, V] raw logits of the next token
    temperature: float,  # 0 = greedy
    vocab_size: int | None,  # ids >= vocab_size are never drawn
    top_k: int = 0,  # keep the k most likely tokens (0 = all)
    top_p: float = 1.0,  # keep the smallest set with this much probability (1.0 = all)
    banned: torch.Tensor | None = None,  # [N, V] bool: tokens this row may not draw
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row, the plain way: the policy's log-softmax, the bans and top-k / top-p
    as -inf, a softmax, the inverse CDF. -> (tokens [N] long, their policy log-probs [N])"""
    logits = logits[:, :vocab_size].float()  # [N, V'] (no grad here: the slice is free)
    if banned is not None:
        banned = banned[:, : logits.shape[-1]]
    if temperature <= 0:  # greedy: the argmax, and its log-prob at temperature 1
        scores = logits if banned is None else logits.masked_fill(banned, float("-inf"))
        tokens = scores.argmax(-1)  # [N]
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = policy_logprobs(logits, temperature, None)  # [N, V']
    scores = logprobs if banned is None else logprobs.masked_fill(banned, float("-inf"))
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # [N, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # [N, V']
        probs = sorted_scores.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # mass before a token; the first is kept
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    tokens = sample_categorical(scores.softmax(-1), generator)  # [N]
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row by inverting the CDF: [N, V] probabilities (or weights proportional to them) -> [N] ids.

    The same distribution as `torch.multinomial(probs, 1)`, which on a CPU draws a random number per
    vocabulary entry; this draws one per row, finds where it falls in the row's cumulative sum, and
    never lands on a zero-probability id. (At a real vocabulary the sampler inverts in two levels
    instead: draw_in_place.py.)"""
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device)  # [N, 1] in [0, 1)
    cdf = probs.cumsum(-1)  # [N, V]
    return first_above(cdf, u * cdf[:, -1:])


def first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """cdf [N, K] nondecreasing, target [N, 1] -> [N] the first k with cdf[k] > target, the target
    held inside [0, the row's total): rounding may put it on either edge, and an id found past
    the last positive entry, or before the first, would have probability 0."""
    inside = torch.minimum(target.clamp(min=0.0), cdf[:, -1:].nextafter(torch.zeros_like(target)))
    return torch.searchsorted(cdf, inside, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
