"""The optimiser side of a training step: AdamW over trainable parameters, and one careful step.

`apply_gradients` sums the gradients over the processes under torchrun (distributed.py), clips
the gradient norm, skips the step when the norm is not finite (a NaN from one bad batch must not
poison the adapter), and clears the gradients. The learning rate: a linear warm-up, then
constant (RL) or a cosine decay to 10% at the stage's last step (SFT from scratch or onto new
tags learns much more per step with it).
Not here: other schedules, other optimisers.
"""

from __future__ import annotations

import math

import torch

from . import distributed

SCHEDULES = ("constant", "cosine")
TAG_ROWS = "trainable_tokens"  # in the names of peft's tag-row parameters
FINAL_LR_RATIO = 0.1  # where the cosine ends, as a fraction of the peak


def make_optimizer(model, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0, schedule: str = "constant",
                   total_steps: int = 0, tag_lr_scale: float = 1.0):
    """AdamW over the parameters that require grad (LoRA + tag rows, or all), with linear warm-up,
    then a constant rate or a cosine decay that reaches FINAL_LR_RATIO * lr at `total_steps`.
    The tag rows of a LoRA model (peft's trainable tokens, `model.apply_lora`) learn at
    `tag_lr_scale` x lr: new tokens start from their pieces' rows and have the most to move.

    >>> _, scheduler = make_optimizer(torch.nn.Linear(1, 1), 1.0, warmup_steps=2, schedule="cosine", total_steps=6)
    >>> [round(scheduler.lr_lambdas[0](step), 3) for step in range(7)]
    [0.5, 1.0, 1.0, 0.868, 0.55, 0.232, 0.1]
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    tags = [p for name, p in trainable if TAG_ROWS in name]
    groups = [{"params": [p for name, p in trainable if TAG_ROWS not in name]}]
    if tags:
        groups.append({"params": tags, "lr": lr * tag_lr_scale})
    optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)

    def factor(step: int) -> float:  # the multiplier of lr at optimiser step `step` (0-based)
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant" or total_steps <= warmup_steps + 1:
            return 1.0
        done = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))  # 0 -> 1 after warm-up
        return FINAL_LR_RATIO + (1 - FINAL_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * done))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def apply_gradients(model, optimizer, max_grad_norm: float, scheduler=None) -> tuple[float, bool]:
    """Sum the gradients over the processes (torchrun; nothing in one process), clip, step (unless
    the gradient is not finite), clear. -> (gradient norm, skipped)"""
    params = [p for p in model.parameters() if p.requires_grad]
    distributed.all_reduce_gradients(params)  # every process then clips and steps alike
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf")).item()
    skipped = not math.isfinite(norm)
    if not skipped:
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, skipped
