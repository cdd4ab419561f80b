"""The training forward of a batch of traces: pad, lay out, run the model, read log-probs.

GRPO and SFT both call `trace_logprobs`: sequences (prompt + response) are right-padded into a
batch, `layout.build_layout` gives the structured or causal mask and positions (prompt read as
plain text, exactly as the sampler prefilled it), the model runs, and the policy's log-prob of
every next token that carries a weight is read from its logits: `policy.logprobs` (temperature,
real vocabulary), the same numbers the sampler recorded, because the sampler was handed the same
`Policy`. Also the entropy of the policy at each of those positions (the real one, -sum p log p
over the vocabulary, not the mean -log p of the chosen tokens).

    sequence   p0 p1 p2 | r0 r1 r2          (| = end of prompt)
    targets       p1 p2 | r0 r1 r2          position t predicts token t + 1
    mask           0  0 | m0 m1 m2          m = 1 where the token was sampled (GRPO) / is response (SFT)

Two reads of the LM head, the same numbers: "plain" (the full logits, log_softmax, gather: read
this one) and "chunked" (head.py: the head applied a chunk of positions at a time, never the
full [B, T, V] logits, for a real vocabulary); "auto" takes the chunked one from
CHUNKED_HEAD_FROM_VOCAB rows. Positions of weight 0 (prompt, padding, inserted tags) read 0
(the chunked read skips them). A batch goes through in micro-batches (`micro_batches`): a number of
rows, or rows sorted by length and packed under a token budget. Not here: losses (grpo.py,
sft.py), optimisers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import NanoparError
from .head import decoder_and_head, head_logprobs
from .layout import build_layout, mask_dtype, sliding_window
from .policy import Policy

HEAD_READS = ("plain", "chunked", "auto")
# "auto" reads the head chunk by chunk from this many vocabulary rows: from here the chunked read's
# saving grows with the vocabulary (the logits dominate the read's memory); below it both reads
# cost about the same and the plain one, the one to read, runs (bench/races.py's head_read, its figures
# in bench/README.md). The toy's ~120 rows get the plain read, Qwen's 151,936 the chunked one
CHUNKED_HEAD_FROM_VOCAB = 8_192


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T] 1 = token, 0 = pad
    target_mask: torch.Tensor  # [B, T-1] float: weight of predicting token t+1 (0 = no loss)
    prompt_lengths: list[int]  # per row: tokens read as plain text
    recorded: torch.Tensor | None = None  # [B, T-1] the sampler's log-prob of each target (GRPO)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: list[int]) -> "TokenBatch":
        """A micro-batch of these rows, trimmed to its longest row."""
        at = torch.tensor(index, device=self.input_ids.device)
        T = int(self.attention_mask[at].sum(-1).max())
        recorded = None if self.recorded is None else self.recorded[at, : T - 1]
        return TokenBatch(self.input_ids[at, :T], self.attention_mask[at, :T], self.target_mask[at, : T - 1],
                          [self.prompt_lengths[i] for i in index], recorded)

    def lengths(self) -> list[int]:
        """Tokens of each row (prompt + response)."""
        return self.attention_mask.sum(-1).tolist()


def micro_batches(lengths: list[int], rows: int, tokens: int = 0) -> list[list[int]]:
    """The rows of each forward/backward: `rows` at a time in order (`tokens` = 0), or sorted by
    length and packed so that rows x longest row <= `tokens` (a longer row goes alone).

    >>> micro_batches([5, 9, 3, 4], rows=3)
    [[0, 1, 2], [3]]
    >>> micro_batches([5, 9, 3, 4], rows=3, tokens=12)
    [[2, 3], [0], [1]]
    """
    if rows < 1 or tokens < 0:
        raise NanoparError(f"a micro-batch needs rows >= 1 and a token budget >= 0, not {rows} and {tokens}")
    if not tokens:
        return [list(range(i, min(i + rows, len(lengths)))) for i in range(0, len(lengths), rows)]
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= tokens:  # sorted: row i is the longest so far
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def make_batch(prompts: list[list[int]], responses: list[list[int]], weights: list[list[float]],
               pad_id: int, device="cpu", recorded: list[list[float]] | None = None) -> TokenBatch:
    """Right-pad prompt + response rows; `weights[i][j]` is the loss weight of response token j,
    `recorded[i][j]` (optional) the log-prob the sampler recorded for it."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    B, T = len(lengths), max(lengths, default=1)  # no rows: a process under torchrun that kept none
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    real = torch.zeros(B, T, dtype=torch.long)
    target, logged = torch.zeros(B, T - 1), torch.zeros(B, T - 1)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(response))  # targets of the response
        ids[i, : lengths[i]] = torch.tensor(prompt + response)
        real[i, : lengths[i]] = 1
        target[i, span] = torch.tensor(weights[i], dtype=torch.float)
        if recorded is not None:
            logged[i, span] = torch.tensor(recorded[i], dtype=torch.float)
    return TokenBatch(ids.to(device), real.to(device), target.to(device), [len(p) for p in prompts],
                      logged.to(device) if recorded is not None else None)


def head_read_for(head_read: str, vocab_size: int) -> str:
    """The read `head_read` names for a policy of `vocab_size` rows: "plain" or "chunked"."""
    if head_read not in HEAD_READS:
        raise NanoparError(f"unknown head read {head_read!r}: use one of {', '.join(HEAD_READS)}")
    if head_read == "auto":
        return "chunked" if vocab_size >= CHUNKED_HEAD_FROM_VOCAB else "plain"
    return head_read


def trace_logprobs(model, batch: TokenBatch, policy: Policy, with_entropy: bool = False, chunk: int | None = None,
                   head_read: str = "auto"):
    """Log-probs under the policy of each next token that carries a weight (0 elsewhere), and
    (`with_entropy`, no gradient) the policy's entropy there. `head_read`: "plain", "chunked"
    (`chunk` positions at a time, head.py) or "auto". -> ([B, T-1] float32, entropy [B, T-1] or None)"""
    read = head_read_for(head_read, policy.vocab_size or model.config.vocab_size)
    layout = build_layout(batch.input_ids, policy.tag_ids, policy.mode, batch.attention_mask, batch.prompt_lengths,
                          dtype=mask_dtype(model), path_stride=policy.path_stride, window=sliding_window(model))
    where = batch.target_mask > 0  # [B, T-1] the positions a loss or a metric reads
    targets = batch.input_ids[:, 1:]  # [B, T-1] the token each position predicts
    if read == "chunked":
        return _chunked_read(model, batch, layout, policy, where, targets, with_entropy, chunk)
    logits = model(input_ids=batch.input_ids, attention_mask=layout.attention_mask,
                   position_ids=layout.position_ids, use_cache=False).logits[:, :-1]  # [B, T-1, V]
    logprobs = policy.logprobs(logits)  # [B, T-1, V'] float32, V' = the real vocabulary
    chosen = logprobs.gather(-1, targets[..., None]).squeeze(-1).masked_fill(~where, 0.0)  # [B, T-1]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1).masked_fill(~where, 0.0)  # [B, T-1]
    return chosen, entropy


def _chunked_read(model, batch: TokenBatch, layout, policy: Policy, where, targets, with_entropy: bool,
                  chunk: int | None):
    """trace_logprobs' numbers from the decoder's final hidden states, the head applied to the
    positions read only, `chunk` at a time (head.py)."""
    decoder, head = decoder_and_head(model)
    hidden = decoder(input_ids=batch.input_ids, attention_mask=layout.attention_mask,
                     position_ids=layout.position_ids, use_cache=False).last_hidden_state  # [B, T, d]
    chosen, entropy = head_logprobs(hidden[:, :-1][where], targets[where], head, policy.temperature,
                                    policy.vocab_size, with_entropy, chunk)  # [n] each
    spread = lambda values: torch.zeros(where.shape, device=where.device).masked_scatter(where, values)  # [B, T-1]
    return spread(chosen), None if entropy is None else spread(entropy)
