"""The optimiser side of a training step: AdamW over trainable parameters, and one careful step.

`apply_gradients` clips the gradient norm, skips the step when the norm is not finite (a NaN
from one bad batch must not poison the adapter), and clears the gradients. Not here: learning
rate schedules beyond a linear warm-up (a small model on one GPU rarely needs more).
"""

from __future__ import annotations

import math

import torch


def make_optimizer(model, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0):
    """AdamW over the parameters that require grad (LoRA + tag rows, or all), with linear warm-up."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warmup = lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)


def apply_gradients(model, optimizer, max_grad_norm: float, scheduler=None) -> tuple[float, bool]:
    """Clip, step (unless the gradient is not finite), clear. -> (gradient norm, skipped)"""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf")).item()
    skipped = not math.isfinite(norm)
    if not skipped:
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, skipped
