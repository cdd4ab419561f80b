"""Out of memory, said so that a user knows what to do: the phase, torch's figures, how to go on.

torch raises `torch.OutOfMemoryError` with a report of what was asked and of the memory reserved
but unallocated (fragmentation, which `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` helps).
The code that may run out names its phase (`phase`: sampling, the training read, an evaluation);
the runner turns the error into one line (`advice`): the phase, torch's own first line, the
checkpoint the same command resumes from and the flags that fit the run into less memory without
changing it, or with `--restart`. docs/gpu.md, "Out of memory", has the figures behind each flag.
Not here: predicting memory (bench/memory.py).
"""

from __future__ import annotations

import contextlib

import torch

SAMPLING, TRAINING_READ, EVALUATION = "sampling", "the training read", "the evaluation"


@contextlib.contextmanager
def phase(name: str):
    """Name the phase an out-of-memory error inside the block ran out in (the innermost name wins)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        if not hasattr(error, "phase"):
            error.phase = name
        raise


def torch_said(error: BaseException) -> str:
    """torch's report, its first line less its pointer to the allocator's docs: the allocation that
    failed, the card's free memory, and what PyTorch holds reserved but unallocated."""
    lines = str(error).strip().splitlines()
    return lines[0].split(" See documentation")[0].strip() if lines else "(torch gave no message)"


def said(error: BaseException, where: str, name: str, todo: str) -> str:
    """The one line: where and in which phase it ran out, torch's figures, what to do."""
    return f"out of memory {where}, {name}: {torch_said(error)} -> {todo}; docs/gpu.md, Out of memory"


def advice(error: BaseException, where: str, config, resumes_from: str = "", default: str = TRAINING_READ) -> str:
    """One line for a run that ran out of memory in `where` ("rl-easy, step 3"; "sft"): its phase (as
    `phase` named it, else `default`) and torch's figures, then what to do there with `config`'s values."""
    name = getattr(error, "phase", default)
    tokens = config.micro_batch_tokens // 2 if config.micro_batch_tokens else 2048
    if name == EVALUATION:
        todo = (f"the same command with --eval-batch {max(config.eval_batch // 2, 1)} evaluates it again "
                "(the stage's model is saved; no --restart)")
    elif name == SAMPLING:
        todo = (f"{resumes_from} resumes with less only with a run that samples less: --prompts-per-step, "
                "--group-size or --max-new-tokens, with --restart (or another --out)")
    else:
        todo = (f"the same command resumes from {resumes_from} with --micro-batch-tokens {tokens} or "
                "--gradient-checkpointing (no --restart)")
    return said(error, f"in {where}", name, todo)
