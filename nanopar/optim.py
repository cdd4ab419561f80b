"""The optimiser side of a training step: AdamW over trainable parameters, and one careful step.

`apply_gradients` sums the gradients over the processes under torchrun (distributed.py), clips
the gradient norm, skips the step when the norm is not finite (a NaN from one bad batch must not
poison the adapter; the metrics count it and the runner prints it), and clears the gradients. A
model computing in float16 (a T4 or V100) trains under a loss scaler (`loss_scaler`, `backward`). The learning rate: a linear warm-up, then
constant (RL) or a cosine decay to 10% at the stage's last step (SFT from scratch or onto new
tags learns much more per step with it).
Not here: other schedules, other optimisers.
"""

from __future__ import annotations

import math

import torch

from . import NanoparError, distributed

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


def loss_scaler(model) -> torch.amp.GradScaler | None:
    """A loss scaler where the model computes in float16, None elsewhere (float32, bfloat16).

    float16 keeps 5 exponent bits: below ~6e-8 a number is 0, and a token's share of the loss
    gradient (~advantage / tokens in the batch) meets that soon after a few products. The scaler
    multiplies the loss by a large factor before backward (`backward`), divides the gradients back
    before clipping, skips a step whose gradients overflowed and halves the factor, and doubles it
    after 2,000 good steps (torch.amp.GradScaler). The parameters it steps must be float32: a LoRA's
    adapter and tag rows are (model.py); every weight trained in float16 is refused here."""
    if not any(p.dtype == torch.float16 for p in model.parameters()):
        return None
    if any(p.requires_grad and p.dtype != torch.float32 for p in model.parameters()):
        raise NanoparError("float16 trains a LoRA only (its adapter stays float32 under the loss scaler): "
                           "add --lora, or train every weight with --dtype float32")
    return torch.amp.GradScaler(next(model.parameters()).device.type)


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None = None) -> None:
    """loss.backward(), the loss multiplied by the scaler's factor first where there is one."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def apply_gradients(model, optimizer, max_grad_norm: float, scheduler=None,
                    scaler: torch.amp.GradScaler | None = None) -> tuple[float, bool]:
    """Sum the gradients over the processes (torchrun; nothing in one process), divide out the
    loss scaler's factor, clip, step (unless the gradient is not finite), clear.
    -> (gradient norm, skipped)"""
    params = [p for p in model.parameters() if p.requires_grad]
    distributed.all_reduce_gradients(params)  # every process then clips and steps alike
    if scaler is not None:
        scaler.unscale_(optimizer)  # the true gradients (an overflow shows as inf or NaN)
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf")).item()
    skipped = not math.isfinite(norm)
    if not skipped:
        optimizer.step()  # (the scaler's own step would only repeat the finiteness check above)
        if scheduler is not None:
            scheduler.step()
    if scaler is not None:
        scaler.update()  # halves the factor after an overflow, doubles it after a run of good steps
    optimizer.zero_grad(set_to_none=True)
    return norm, skipped
