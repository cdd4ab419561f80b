"""The sampler's draw at a real vocabulary: the same distribution as policy.py's `plain_draw`, in
fewer passes over [N, V].

policy.py is the draw to read: softmax(logits / T), the bans as -inf, one draw by inverting the
CDF, the drawn token's log-prob. At Qwen's 151,936 ids each float32 pass over a decode step's
[N, V] logits is a visible share of the step, so from DRAW_IN_PLACE_FROM_VOCAB ids (at T > 0,
without top-k or top-p) `draw` takes `draw_in_place`: one float32 buffer, kept by the sampler
from step to step, turned in place into exp(scores - max), and a CDF inverted in two levels
(a sum per block of ids, then a cumulative sum inside the chosen block). Tokens and log-probs
are the plain draw's up to float rounding (tests/test_policy.py). The toy and the tests' tiny
models stay under the threshold and run the plain draw, so their documented tokens are its
tokens. The race between the two is in bench/races.py; its figures in bench/README.md.
Not here: the policy's distribution itself (policy.py), the sampling loop (sampler.py).
"""

from __future__ import annotations

import torch

from .policy import Policy, first_above, plain_draw, policy_scores, sample_categorical

DRAW_IN_PLACE_FROM_VOCAB = 8_192  # `draw` draws in place from this many vocabulary ids; below it, the plain draw
CDF_BLOCK = 1024  # ids per block of the two-level inverse CDF
TWO_LEVELS_FROM_BLOCKS = 8  # rows shorter than this many blocks take one cumulative sum


def draw(
    logits: torch.Tensor,  # [N, V] raw logits of the next token
    temperature: float,  # 0 = greedy
    vocab_size: int | None,  # ids >= vocab_size are never drawn
    top_k: int = 0,  # keep the k most likely tokens (0 = all)
    top_p: float = 1.0,  # keep the smallest set with this much probability (1.0 = all)
    banned: torch.Tensor | None = None,  # [N, V] bool: tokens this row may not draw
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,  # float32 [N, V'] the in-place draw may write into (a sampler keeps one)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's draw: `draw_in_place` where `draws_in_place` says so, else policy.py's `plain_draw`.
    -> (tokens [N] long, their policy log-probs [N])"""
    if draws_in_place(temperature, vocab_size or logits.shape[-1], top_k, top_p):
        return draw_in_place(logits, temperature, vocab_size, banned, generator, out)
    return plain_draw(logits, temperature, vocab_size, top_k, top_p, banned, generator)


class CallDraw:
    """The draw of one sampler call: `draw` with the policy's temperature and vocabulary, the call's
    top-k / top-p, and the float32 [lanes, V'] buffer every in-place draw of the call writes into."""

    def __init__(self, policy: Policy, top_k: int, top_p: float, generator: torch.Generator | None):
        self.policy, self.top_k, self.top_p, self.generator = policy, top_k, top_p, generator
        self.kept: torch.Tensor | None = None  # float32 [lanes, V']: `buffer`

    def __call__(self, logits: torch.Tensor, banned: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [N, V], bans [N, V] or None -> (tokens [N], their log-probs [N])"""
        return draw(logits, self.policy.temperature, self.policy.vocab_size, self.top_k, self.top_p, banned,
                    self.generator, self.buffer(logits))

    def buffer(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The rows this step's in-place draw writes its scores into: one buffer for the call, doubled
        when the lanes outgrow it. On a CPU a new [N, V'] tensor each step costs the first touch of its
        pages, more than the passes that fill it at a real vocabulary, and rows never written cost no
        memory. None where the plain draw runs, and on a GPU, whose caching allocator reuses the step's
        tensor for the model's activations."""
        rows = self.policy.vocab_size or logits.shape[-1]
        if logits.device.type != "cpu" or not draws_in_place(self.policy.temperature, rows, self.top_k, self.top_p):
            return None
        if self.kept is None or self.kept.shape[0] < logits.shape[0]:
            lanes = max(logits.shape[0], 2 * (0 if self.kept is None else self.kept.shape[0]))
            self.kept = logits.new_empty(lanes, min(rows, logits.shape[-1]), dtype=torch.float32)
        return self.kept[: logits.shape[0]]


def draws_in_place(temperature: float, rows: int, top_k: int = 0, top_p: float = 1.0) -> bool:
    """Whether `draw` takes `draw_in_place` over `rows` vocabulary ids: T > 0, no top-k or top-p,
    from DRAW_IN_PLACE_FROM_VOCAB ids."""
    return temperature > 0 and not 0 < top_k < rows and top_p >= 1.0 and rows >= DRAW_IN_PLACE_FROM_VOCAB


def draw_in_place(
    logits: torch.Tensor,  # [N, V] raw logits of the next token
    temperature: float,  # > 0
    vocab_size: int | None,  # ids >= vocab_size are never drawn
    banned: torch.Tensor | None = None,  # [N, V] bool: tokens this row may not draw
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,  # float32 [N, V'] to write the buffer into (None: a new one)
) -> tuple[torch.Tensor, torch.Tensor]:
    """`plain_draw` at T > 0 without top-k or top-p: the plain draw builds the log-softmax, a masked
    copy and a softmax; here one float32 buffer becomes exp(scores - max) in place, which
    `sample_in_blocks` draws from unnormalised, and the drawn token's log-prob is its score
    - max - log Z, as head.py's training read computes it. A buffer kept from step to step (`out`)
    spares each step the first touch of a new one's pages. -> (tokens [N] long, log-probs [N])"""
    scores = policy_scores(logits, temperature, vocab_size, out=out)  # [N, V'] float32
    if scores.data_ptr() == logits.data_ptr():  # float32 logits at T = 1: a view, and the passes below write
        scores = scores.clone() if out is None else out.copy_(scores)
    top = scores.amax(-1, keepdim=True)  # [N, 1]
    weights = scores.sub_(top).exp_()  # [N, V'] the policy's probabilities times Z
    Z = weights.sum(-1, keepdim=True)  # [N, 1] over the whole policy: a banned token still counts
    if banned is not None:
        weights.masked_fill_(banned[:, : weights.shape[-1]], 0.0)
    tokens = sample_in_blocks(weights, generator)  # [N]
    chosen = policy_scores(logits.gather(-1, tokens[:, None]), temperature, None)  # [N, 1] the same score as above
    return tokens, (chosen - top - Z.log()).squeeze(-1)


def sample_in_blocks(probs: torch.Tensor, generator: torch.Generator | None = None,
                     block: int = CDF_BLOCK) -> torch.Tensor:
    """policy.py's `sample_categorical` in two levels: [N, V] probabilities (or weights) -> [N] ids.

    A cumulative sum of a whole row costs a pass and a new [N, V] tensor, at Qwen's vocabulary
    most of the draw. From TWO_LEVELS_FROM_BLOCKS blocks of `block` ids a row: the block whose mass
    holds the random number (one sum per block), then the id inside that block (a cumulative sum of
    `block` ids): the id one cumulative sum of the row finds, with the same random number, up to
    the float rounding of the sums. Shorter rows: `sample_categorical` itself.
    """
    N, V = probs.shape
    if V < TWO_LEVELS_FROM_BLOCKS * block:
        return sample_categorical(probs, generator)
    u = torch.rand(N, 1, generator=generator, device=probs.device)  # [N, 1] in [0, 1), as sample_categorical's
    whole = V // block * block
    mass = probs[:, :whole].view(N, whole // block, block).sum(-1)  # [N, nb] each block's mass
    if whole < V:
        mass = torch.cat([mass, probs[:, whole:].sum(-1, keepdim=True)], -1)  # the short last block
    block_cdf = mass.cumsum(-1)  # [N, nb]
    target = u * block_cdf[:, -1:]  # [N, 1]
    chosen = first_above(block_cdf, target)  # [N] the block holding it
    start = chosen * block  # [N] its first id
    ids = start[:, None] + torch.arange(block, device=probs.device)  # [N, block]
    inside = probs.gather(-1, ids.clamp(max=V - 1)).masked_fill(ids >= V, 0.0)  # [N, block]
    rest = target - (block_cdf - mass).gather(-1, chosen[:, None])  # [N, 1] less the mass before the block
    return (start + first_above(inside.cumsum(-1), rest)).clamp(max=V - 1)  # a row of no mass: its last id, as one sum
