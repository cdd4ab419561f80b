"""The training forward of a batch of traces: pad, lay out, run the model, read log-probs.

GRPO and SFT both call `trace_logprobs`: sequences (prompt + response) are right-padded into a
batch, `layout.build_layout` gives the structured or causal mask and positions (prompt read as
plain text, exactly as the sampler prefilled it), and the policy's log-prob of every next token
comes from `Policy.logprobs` (temperature, real vocabulary) — the same numbers the sampler
recorded, because the sampler was handed the same `Policy`. Also the entropy of the policy at each position (the real one,
-sum p log p over the vocabulary, not the mean -log p of the chosen tokens).

    sequence   p0 p1 p2 | r0 r1 r2          (| = end of prompt)
    targets       p1 p2 | r0 r1 r2          position t predicts token t + 1
    mask           0  0 | m0 m1 m2          m = 1 where the token was sampled (GRPO) / is response (SFT)

Not here: losses (grpo.py, sft.py), optimisers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import build_layout, mask_dtype
from .policy import Policy


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T] 1 = token, 0 = pad
    target_mask: torch.Tensor  # [B, T-1] float: weight of predicting token t+1 (0 = no loss)
    prompt_lengths: list[int]  # per row: tokens read as plain text
    recorded: torch.Tensor | None = None  # [B, T-1] the sampler's log-prob of each target (GRPO)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice) -> "TokenBatch":
        """A micro-batch, trimmed to its longest row."""
        T = int(self.attention_mask[index].sum(-1).max())
        recorded = None if self.recorded is None else self.recorded[index, : T - 1]
        return TokenBatch(self.input_ids[index, :T], self.attention_mask[index, :T],
                          self.target_mask[index, : T - 1], self.prompt_lengths[index], recorded)


def make_batch(prompts: list[list[int]], responses: list[list[int]], weights: list[list[float]],
               pad_id: int, device="cpu", recorded: list[list[float]] | None = None) -> TokenBatch:
    """Right-pad prompt + response rows; `weights[i][j]` is the loss weight of response token j,
    `recorded[i][j]` (optional) the log-prob the sampler recorded for it."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    B, T = len(lengths), max(lengths)
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


def trace_logprobs(model, batch: TokenBatch, policy: Policy, with_entropy: bool = False):
    """Log-probs of each next token under the policy. -> ([B, T-1], entropy [B, T-1] or None)"""
    layout = build_layout(batch.input_ids, policy.tag_ids, policy.mode, batch.attention_mask, batch.prompt_lengths,
                          dtype=mask_dtype(model), path_stride=policy.path_stride)
    logits = model(input_ids=batch.input_ids, attention_mask=layout.attention_mask,
                   position_ids=layout.position_ids).logits[:, :-1]  # [B, T-1, V]
    logprobs = policy.logprobs(logits)  # [B, T-1, V']
    chosen = logprobs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    entropy = None
    if with_entropy:  # only where a loss is taken: a full [B, T, V] pass costs as much as the loss
        with torch.no_grad():
            entropy = torch.zeros_like(chosen)  # [B, T-1]
            where = batch.target_mask > 0
            picked = logprobs[where]  # [n, V']
            entropy[where] = -(picked.exp() * picked).sum(-1)
    return chosen, entropy
