"""Benchmark `policy.policy_scores` (logits / T over the real vocabulary, float32) against the
plain form it replaced, `logits.float() / T`, side by side in one process.

    python bench/policy_scores.py                 # Qwen's vocabulary, 220-row chunks (head.py's)
    python bench/policy_scores.py --rows 64 --repeats 5

Both give the same numbers (checked here, bit for bit); the plain form makes a second [rows, V]
float32 tensor for the division, the library's divides its one copy in place. Each is timed as
the median of `repeats` calls after a warm-up, alternating, on bf16 logits (a bf16 model's head)
and on float32 ones, at T = 0.7 (the Qwen presets'): the chunked training read calls it twice per
chunk (forward, and the recompute in backward), the sampler once per decode step.
Not here: the read as a whole (bench/head_read.py), a decode step (bench/floor.py).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from nanopar.config import parse_config
from nanopar.policy import policy_scores


@dataclass
class ScoresConfig:
    rows: int = 220  # rows of a call: head.py's chunk on Qwen's vocabulary (128 MB of float32 logits)
    vocab: int = 151_936  # the logits' width (the embedding's rows)
    real_vocab: int = 151_665  # the policy's vocabulary (Qwen's tokenizer + the tags): a slice of it
    temperature: float = 0.7  # T
    repeats: int = 9  # timed calls of each form (the median counts)


def plain(logits: torch.Tensor, temperature: float, vocab_size: int) -> torch.Tensor:
    """The form `policy_scores` replaced: a float32 copy, then a second tensor for the division."""
    return logits[..., :vocab_size].float() / temperature


def median_ms(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    return [_timed(fn) for _ in range(repeats)]


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def main(argv: list[str] | None = None) -> list[dict]:
    config = parse_config(ScoresConfig, argv, description=__doc__.split("\n")[0])
    console, rows = Console(), []
    console.print(f"load average before: {os.getloadavg()[0]:.2f}; threads {torch.get_num_threads()}")
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(config.rows, config.vocab).to(dtype)
        ours = lambda: policy_scores(logits, config.temperature, config.real_vocab)
        theirs = lambda: plain(logits, config.temperature, config.real_vocab)
        if not torch.equal(ours(), theirs()):
            raise SystemExit("policy_scores and the plain form disagree: the benchmark compares nothing")
        times = {"plain": [], "policy_scores": []}
        for _ in range(config.repeats):  # alternating, so a drift in the machine's speed hits both
            times["plain"] += median_ms(theirs, 1)
            times["policy_scores"] += median_ms(ours, 1)
        a, b = statistics.median(times["plain"]), statistics.median(times["policy_scores"])
        rows.append({"dtype": str(dtype).removeprefix("torch."), "plain_ms": a, "policy_scores_ms": b, "ratio": b / a})
    table = Table(title=f"logits / T over the real vocabulary, [{config.rows} x {config.vocab}], T = {config.temperature}")
    for column in ("logits", "plain: .float() / T (ms)", "policy_scores (ms)", "x plain"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["dtype"], f"{r['plain_ms']:.1f}", f"{r['policy_scores_ms']:.1f}", f"{r['ratio']:.2f}")
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
