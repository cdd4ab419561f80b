"""Supervised fine-tuning on parallel traces: Parallel-R1's cold start, NPR's self-distillation.

The loss is the mean cross-entropy over response tokens — every token of the trace, tags
included, since the model must learn to write them — counted over the whole batch, with the
prompt as context only. In structured mode the batch is read with the layout's mask and
positions, so a path learns to be written without seeing its siblings, exactly as the sampler
will decode it; in causal mode it is a plain causal read. The tags, mode and vocabulary come from
the same `Policy` the sampler takes; the temperature is always 1 (SFT fits the model's own
distribution, whatever temperature RL samples at).
`response_loglikelihood` reads held-out traces the same way, for the mean log-probability per token.
Under torchrun each process passes its share of the batch; the token count the loss divides by
and the gradients are summed over the processes (distributed.py), so the step is one batch's.
Not here: where traces come from (data.load_traces, toy/), the loop over steps (runner.py).
"""

from __future__ import annotations

import dataclasses

import torch

from . import distributed
from .forward import head_read_for, make_batch, micro_batches, trace_logprobs
from .optim import apply_gradients, backward
from .policy import Policy


def sft_step(model, optimizer, prompts: list[list[int]], responses: list[list[int]], policy: Policy, pad_id: int,
             micro_batch: int = 8, max_grad_norm: float = 1.0, scheduler=None, micro_batch_tokens: int = 0,
             head_read: str = "auto", scaler=None) -> dict:
    """One optimiser step on a batch of (prompt ids, response ids); micro-batches of `micro_batch`
    rows, or packed under `micro_batch_tokens` (forward.micro_batches); `head_read` as in
    forward.trace_logprobs; `scaler` a float16 model's loss scaler (optim.loss_scaler). -> metrics"""
    head_read_for(head_read, 0)  # an unknown read fails before any work
    policy = dataclasses.replace(policy, temperature=1.0)
    batch = _shortest_first(model, prompts, responses, pad_id)
    # response tokens in the whole batch: of every process's share under torchrun
    total = distributed.all_reduce(batch.target_mask.sum(), "the count of the step's tokens").clamp(min=1)
    model.train()
    loss_sum = 0.0
    for rows in micro_batches(batch.lengths(), micro_batch, micro_batch_tokens):
        micro = batch.rows(rows)
        logprobs, _ = trace_logprobs(model, micro, policy, head_read=head_read)  # [b, T-1]
        loss = -(logprobs * micro.target_mask).sum() / total  # []
        backward(loss, scaler)
        loss_sum += loss.item()
    norm, skipped = apply_gradients(model, optimizer, max_grad_norm, scheduler, scaler)  # summed over processes
    return {"loss": distributed.sum_over_ranks(loss_sum), "grad_norm": norm, "skipped_step": skipped,
            "tokens": int(total.item())}


def _shortest_first(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int):
    """The batch of (prompt, response) rows, shortest first: each micro-batch is trimmed to its own
    longest row (less padding); the loss is a sum over rows, so the order changes nothing else."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    prompts, responses = [prompts[i] for i in order], [responses[i] for i in order]
    return make_batch(prompts, responses, [[1.0] * len(r) for r in responses], pad_id, next(model.parameters()).device)


@torch.no_grad()
def response_loglikelihood(model, prompts: list[list[int]], responses: list[list[int]], policy: Policy,
                           pad_id: int, micro_batch: int = 8, head_read: str = "auto") -> float:
    """The mean log-probability per response token of reference responses (held-out traces), read
    as `sft_step` reads them (the same layout, temperature 1): minus its loss, without a step."""
    policy = dataclasses.replace(policy, temperature=1.0)
    batch = _shortest_first(model, prompts, responses, pad_id)
    was_training = model.training
    model.eval()
    total = 0.0
    for rows in micro_batches(batch.lengths(), micro_batch, 0):
        micro = batch.rows(rows)
        logprobs, _ = trace_logprobs(model, micro, policy, head_read=head_read)  # [b, T-1]
        total += (logprobs * micro.target_mask).sum().item()
    model.train(was_training)
    return total / max(1, int(batch.target_mask.sum().item()))
