"""What the benchmarks share: peak resident memory of a piece of work, the load average beside it,
the closing report, and `bench_order` (a reward that gives every group a signal).

On CPU a part's memory is the peak resident set (psutil, sampled every 2 ms by a thread) minus
the one at its start, after freed heap pages are handed back to the system (glibc `malloc_trim`),
so that each part's rise is its own. (The logit bias that makes a tiny random model write tags
is the library's `nanopar.tiny.bias_logits`, shared with the tests.)

Imported by the scripts beside it (`from common import PeakRSS`: a script's folder is on sys.path).
`model_flags` and `load_bench_model` are the real-model preamble of the one-comparison benchmarks
(kv_append.py, lora_casts.py, row_skip.py): the model as train.py loads it, GSM8K prompts.
Not here: what is measured (train_step.py, head_read.py, memory_measure.py, sampler.py).
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

import psutil

MB = 2**20
PAD = 0  # the padding id of the benchmarks' batches


ORDER = itertools.count()


def bench_order(text, trace, problem) -> float:
    """The response's place among all scored (0, 1, 2, ...): meaningless, but never equal in a group,
    so every GRPO group has a signal and a timed step's update always runs. Registered by the scripts
    that pay it (bench/qwen.py, trl_grpo.py), not on import: a test that imports this file keeps the
    reward registry as the library has it."""
    return float(next(ORDER))


def load_average(before: float) -> str:
    """The 1-minute load average at a piece of work's start and now: "1.2 -> 1.4"."""
    return f"{before:.1f} -> {os.getloadavg()[0]:.1f}"


def write_report(report: dict, out: str, console) -> dict:
    """Print the run's seconds and the load average now; write `report` as JSON to `out` ("" = don't)."""
    console.print(f"{report['seconds']:.0f} s; load average now {os.getloadavg()[0]:.1f}", highlight=False)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return report


def hand_back_free_memory() -> None:
    """Return freed heap pages to the system (glibc), so the next part's RSS rise is its own."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class PeakRSS:
    """`with PeakRSS() as p:` ... `p.rise`: peak resident bytes above those at the start."""

    def __enter__(self):
        hand_back_free_memory()
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
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
        self.peak = max(self.peak, self.process.memory_info().rss)
        self.rise = self.peak - self.start


def peak_rise(fn) -> tuple[int, object]:
    """(peak resident bytes above those at the start, fn's result)."""
    gc.collect()
    with PeakRSS() as watch:
        result = fn()
    return watch.rise, result




def model_flags(parser) -> None:
    """--model and --dtype, as the real-model benchmarks take them."""
    parser.add_argument("--model", default="pypi:qwen2.5-coder-0.5b", help="the model (tiny:qwen2: a random tiny one)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, or auto (defaults.cpu_dtype)")


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A real-model benchmark's parser: its docstring's first line, --model and --dtype (`model_flags`)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_flags(parser)
    return parser


def bench_args(parser: argparse.ArgumentParser, argv: list[str] | None, rounds: tuple[int, str], quick: dict,
               quick_help: str) -> argparse.Namespace:
    """`parser` with --rounds (its default and help), --quick and --out, parsed from `argv`; --quick
    sets the fields of `quick` (the sizes and rounds it stands for, `quick_help` says which)."""
    parser.add_argument("--rounds", type=int, default=rounds[0], help=rounds[1])
    parser.add_argument("--quick", action="store_true", help=f"{quick_help} (overrides the size flags)")
    parser.add_argument("--out", default="", help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args


def load_bench_model(args, console):
    """(model, tokenizer, resolved dtype) of --model as train.py loads it: LoRA r16 on the seven
    projections (B = 0) and the tag rows, after a header line (dtype, threads, load average)."""
    import torch

    from nanopar.defaults import cpu_dtype, on_cpu
    from nanopar.model import QWEN_PROJECTIONS, ModelSettings, cpu_bf16_instructions, load_model

    dtype = cpu_dtype(False) if args.dtype == "auto" and on_cpu("auto") else args.dtype
    console.print(f"{args.model}, dtype {dtype} (bfloat16 instructions: {cpu_bf16_instructions()}), "
                  f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}", highlight=False)
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelSettings(args.model, dtype=dtype, lora=True, lora_target_modules=QWEN_PROJECTIONS))
    return model, tokenizer, dtype


def gsm8k_prompts(tokenizer, count: int) -> list[list[int]]:
    """The first `count` GSM8K train questions as prompt ids, with Qwen's one-line answer request."""
    from nanopar.data import load_problems
    from nanopar.prompts import build_prompt, instructions_named

    return [build_prompt(p, tokenizer, instructions_named("answer")) for p in load_problems("gsm8k_train", limit=count)]
