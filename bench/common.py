"""What the benchmarks share: a piece of work's peak resident memory (psutil, every 2 ms, after
glibc's `malloc_trim` so each part's rise is its own), the load average beside it, the closing
report, a reward that gives every group a signal, and the real-model preamble (--model, --dtype,
the model as train.py loads it, GSM8K prompts). `from common import PeakRSS`: a script's folder is
on sys.path. Not here: what is measured (each script says).
"""

from __future__ import annotations

import argparse
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
PAD = 0  # the padding id of the benchmarks' batches
ORDER = itertools.count()


def bench_order(text, trace, problem) -> float:
    """The response's place among all scored (0, 1, 2, ...): never equal in a group, so every group has
    a signal and a timed step's update always runs. Registered by its users, never on import."""
    return float(next(ORDER))


def load_average(before: float) -> str:
    """The 1-minute load average at a piece of work's start and now: "1.2 -> 1.4"."""
    return f"{before:.1f} -> {os.getloadavg()[0]:.1f}"


def write_report(report: dict, out: str, console) -> dict:
    """Print the run's seconds and the load average now; write `report` as JSON to `out` ("" = don't)."""
    console.print(f"{report['seconds']:.0f} s; load average now {os.getloadavg()[0]:.1f}", highlight=False)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    return report


def hand_back_free_memory() -> None:
    """Return freed heap pages to the system (glibc), so the next part's RSS rise is its own."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class PeakRSS:
    """`with PeakRSS() as p:` ... `p.rise`: peak resident bytes above those at the start."""

    def __enter__(self):
        hand_back_free_memory()
        self.process, self.running = psutil.Process(), True
        self.start = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()
        return self

    def watch(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.rise = max(self.peak, self.process.memory_info().rss) - self.start


def peak_rise(fn) -> tuple[int, object]:
    """(peak resident bytes above those at the start, fn's result)."""
    gc.collect()
    with PeakRSS() as watch:
        result = fn()
    return watch.rise, result


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with the docstring's first line, --model and --dtype."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="pypi:qwen2.5-coder-0.5b", help="the model (tiny:qwen2: a random tiny one)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, or auto (defaults.cpu_dtype)")
    return parser


def bench_args(parser, argv: list[str] | None, rounds: tuple[int, str], quick: dict, quick_help: str):
    """`parser` with --rounds (default, help), --quick (sets `quick`'s fields) and --out, parsed from `argv`."""
    parser.add_argument("--rounds", type=int, default=rounds[0], help=rounds[1])
    parser.add_argument("--quick", action="store_true", help=f"{quick_help} (overrides the size flags)")
    parser.add_argument("--out", default="", help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    for name, value in quick.items() if args.quick else ():
        setattr(args, name, value)
    return args


def load_bench_model(args, console):
    """(model, tokenizer, resolved dtype) of `args.model` in `args.dtype` as train.py loads it (LoRA r16,
    B = 0, and the tag rows), after a header line: the dtype, threads, load average."""
    import torch

    from nanopar.defaults import cpu_dtype, on_cpu
    from nanopar.model import ModelSettings, cpu_bf16_instructions, load_model

    dtype = cpu_dtype(False) if args.dtype == "auto" and on_cpu("auto") else args.dtype
    console.print(f"{args.model}, dtype {dtype} (bfloat16 instructions: {cpu_bf16_instructions()}), "
                  f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}", highlight=False)
    torch.manual_seed(0)
    return *load_model(ModelSettings(args.model, dtype=dtype, lora=True)), dtype


def gsm8k_prompts(tokenizer, count: int, split: str = "gsm8k_train") -> list[list[int]]:
    """The first `count` questions of `split` as prompt ids, with the qwen preset's one-line answer request."""
    from nanopar.data import load_problems
    from nanopar.prompts import build_prompt, instructions_named

    return [build_prompt(p, tokenizer, instructions_named("answer")) for p in load_problems(split, limit=count)]
