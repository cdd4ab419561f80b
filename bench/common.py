"""What the benchmarks share: a piece of work's peak resident-memory rise, the load average beside it,
taking turns in a race, the closing report, a reward that gives every group a signal, a training batch with a parallel block,
and the real-model preamble (the model as train.py loads it, GSM8K prompts). `from common import
peak_rise`: a script's folder is on sys.path. Not here: what is measured (each script says)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import json
import os
import threading
import time
from pathlib import Path

import psutil

MB = 2**20
ORDER = itertools.count()


def bench_order(text, trace, problem) -> float:
    """The response's place among all scored (0, 1, 2, ...): never equal in a group, so every group has
    a signal and a timed step's update always runs. Registered by its users, never on import."""
    return float(next(ORDER))


def load_average(before: float) -> str:
    """The 1-minute load average at a piece of work's start and now: "1.2 -> 1.4"."""
    return f"{before:.1f} -> {os.getloadavg()[0]:.1f}"


def race(fns, rounds: int, sync=lambda: None, prepare=lambda i: None, check=None):
    """Each function's best wall seconds over `rounds` rounds after a warm-up call of each, taking turns (who goes
    first alternates); `prepare(i)` runs untimed before each call of fns[i], `sync()` around each timed one (a
    GPU's queue), `check(*warm-up results)` before any timing. -> ([seconds], [warm-up results], what check
    said, the load average before -> after)"""
    before, results, best = os.getloadavg()[0], [], [float("inf")] * len(fns)
    for i, fn in enumerate(fns):
        prepare(i)
        results.append(fn())
    agreed = check(*results) if check else ""
    for round_ in range(rounds):
        for i in range(len(fns)) if round_ % 2 == 0 else reversed(range(len(fns))):
            prepare(i)
            sync()
            started = time.perf_counter()
            fns[i]()
            sync()
            best[i] = min(best[i], time.perf_counter() - started)
    return best, results, agreed, load_average(before)


def write_report(report: dict, out: str, console) -> dict:
    """Print the run's seconds and the load average now; write `report` as JSON to `out` ("" = don't)."""
    console.print(f"{report['seconds']:.0f} s; load average now {os.getloadavg()[0]:.1f}", highlight=False)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    return report


def peak_rise(fn) -> tuple[int, object]:
    """(fn()'s peak resident bytes above those at the start, sampled every 2 ms; fn's result). Freed heap
    pages go back to the system first (glibc's `malloc_trim`), so the rise is fn's own."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    process, done = psutil.Process(), threading.Event()
    start = process.memory_info().rss
    peak = [start]

    def watch():
        while not done.wait(0.002):
            peak[0] = max(peak[0], process.memory_info().rss)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = fn()
    finally:
        done.set()
        watcher.join()
    return max(peak[0], process.memory_info().rss) - start, result


def load_bench_model(args, console, dtype: str = ""):
    """(model, tokenizer, resolved dtype) of `args.model` in `dtype` or `args.dtype` as train.py loads it (LoRA
    r16, B = 0, and the tag rows), after a header line: the dtype, threads, load average."""
    import torch

    from nanopar.defaults import cpu_dtype, on_cpu
    from nanopar.model import ModelSettings, cpu_bf16_instructions, load_model

    dtype = dtype or args.dtype
    dtype = cpu_dtype(False) if dtype == "auto" and on_cpu("auto") else dtype
    console.print(f"{args.model}, dtype {dtype} (bfloat16 instructions: {cpu_bf16_instructions()}), "
                  f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}", highlight=False)
    torch.manual_seed(0)
    return *load_model(ModelSettings(args.model, dtype=dtype, lora=True)), dtype


def gsm8k_prompts(tokenizer, count: int, split: str = "gsm8k_train") -> list[list[int]]:
    """The first `count` questions of `split` as prompt ids, with the qwen preset's one-line answer request."""
    from nanopar.data import load_problems
    from nanopar.prompts import build_prompt, instructions_named

    return [build_prompt(p, tokenizer, instructions_named("answer")) for p in load_problems(split, limit=count)]


def block_batch(tags, words: int, rows: int, tokens: int, device="cpu"):
    """`rows` rows of `tokens` random ids below `words` (seeded): a quarter prompt, the rest a response holding one
    parallel block of two paths, every response token weighted. -> TokenBatch"""
    import torch

    from nanopar.forward import make_batch

    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(1, words, (n,), generator=g).tolist()  # noqa: E731
    third = (tokens - tokens // 4 - 8) // 3  # a third of the response's ids, less its 8 tags
    responses = [ids(third) + [tags.block_open, tags.path_open] + ids(third) + [tags.path_close, tags.path_open]
                 + ids(tokens - tokens // 4 - 8 - 2 * third)
                 + [tags.path_close, tags.block_close, tags.summary_open, tags.summary_close] for _ in range(rows)]
    return make_batch([ids(tokens // 4) for _ in range(rows)], responses, [[1.0] * len(r) for r in responses], 0, device)
