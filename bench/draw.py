"""Benchmark the sampler's draw at a real vocabulary: the plain draw against the in-place one.

    python bench/draw.py                            # Qwen's 151,936 rows, 1 .. 128 lanes, bfloat16 logits
    python bench/draw.py --lanes 64 --repeats 3

Every decode step ends in `policy.draw`: one token per lane from softmax(logits / T) over the real
vocabulary, with its log-prob, under the step's bans. The plain draw (`draw` below
DRAW_IN_PLACE_FROM_VOCAB rows) builds the log-softmax, a masked copy and a softmax of [lanes, V] in
float32; `draw_in_place` turns one float32 buffer into exp(scores - max) in place and draws from it
unnormalised. Here both draw from the same random logits (bfloat16, as a bf16 model's head writes
them; a few banned ids, as the structural bans set) with the same generator, at T = 0.7: the
median of `repeats` alternating calls each, their ratio, whether they drew the same tokens, and
each one's largest log-prob error against a float64 log-softmax of the same logits; and the
in-place draw into a buffer kept from call to call (`out=`, as the sampler keeps one for its
decode steps) against a new one each call. A second
table races the draw's last part alone, `sample_categorical` on the in-place draw's weights: the
inverse CDF in two levels (a sum per block of CDF_BLOCK ids, then a cumulative sum inside one
block: the library's from TWO_LEVELS_FROM_BLOCKS blocks) against one cumulative sum of the whole
row (`block=None`, the draw before), the same generator, whether they drew the same ids.
Not here: the model's forward (bench/qwen.py times whole decode steps), top-k / top-p (the plain
draw serves them).
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
from nanopar.policy import draw_in_place, plain_draw, policy_scores, sample_categorical


@dataclass
class DrawConfig:
    lanes: tuple[int, ...] = (1, 8, 32, 64, 128)  # rows drawn at once (a decode step's lanes)
    vocab: int = 151_936  # logits per row (Qwen2.5's embedding rows)
    real_vocab: int = 151_665  # the policy's vocabulary (ids above it are never drawn)
    temperature: float = 0.7  # the policy's T
    repeats: int = 7  # timed calls of each draw (the median counts), alternating, after a warm-up


def errors(logits: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, config: DrawConfig) -> float:
    """Largest |log-prob - float64 log-softmax| over the drawn tokens."""
    exact = torch.log_softmax(logits[:, : config.real_vocab].double() / config.temperature, -1)  # [N, V']
    return float((logprobs.double() - exact.gather(-1, tokens[:, None]).squeeze(-1)).abs().max())


def measure(lanes: int, config: DrawConfig) -> dict:
    """One row of the table: both draws on the same logits and bans."""
    g = torch.Generator().manual_seed(lanes)
    logits = (3 * torch.randn(lanes, config.vocab, generator=g)).bfloat16()  # [N, V]
    banned = torch.zeros(lanes, config.vocab, dtype=torch.bool)  # [N, V]
    banned[:, config.real_vocab - 6 : config.real_vocab] = True  # the tags a structural ban would hold back
    kept = torch.empty(lanes, config.real_vocab)  # [N, V'] the sampler's buffer, kept across calls
    draws = {"plain": plain_draw, "in place": draw_in_place,
             "kept buffer": lambda *a, **k: draw_in_place(*a, **k, out=kept)}
    args = (logits, config.temperature, config.real_vocab)
    drawn = {name: fn(*args, banned=banned, generator=torch.Generator().manual_seed(0)) for name, fn in draws.items()}
    times = {name: [] for name in draws}
    for _ in range(config.repeats):
        for name, fn in draws.items():
            start = time.perf_counter()
            fn(*args, banned=banned)
            times[name].append(time.perf_counter() - start)
    plain, in_place, kept_ms = (1e3 * statistics.median(times[name]) for name in draws)
    scores = policy_scores(logits, config.temperature, config.real_vocab)  # [N, V'] the in-place draw's weights:
    weights = scores.sub_(scores.amax(-1, keepdim=True)).exp_().masked_fill_(banned[:, : scores.shape[-1]], 0.0)
    levels = {"one": None, "two": sample_categorical.__defaults__[-1]}  # block=None: one cumulative sum
    ids = {name: sample_categorical(weights, torch.Generator().manual_seed(1), block) for name, block in levels.items()}
    cdf_times = {name: [] for name in levels}
    for _ in range(config.repeats):
        for name, block in levels.items():
            start = time.perf_counter()
            sample_categorical(weights, torch.Generator().manual_seed(1), block)
            cdf_times[name].append(time.perf_counter() - start)
    one, two = (1e3 * statistics.median(cdf_times[name]) for name in levels)
    assert all(torch.equal(a, b) for a, b in zip(drawn["in place"], drawn["kept buffer"])), "the buffer drew otherwise"
    return {"lanes": lanes, "plain_ms": plain, "in_place_ms": in_place, "ratio": in_place / plain,
            "kept_buffer_ms": kept_ms,
            "cdf_one_ms": one, "cdf_two_ms": two, "cdf_same_ids": bool(torch.equal(ids["one"], ids["two"])),
            "same_tokens": bool(torch.equal(drawn["plain"][0], drawn["in place"][0])),
            "plain_error": errors(logits, *drawn["plain"], config),
            "in_place_error": errors(logits, *drawn["in place"], config)}


def main(argv: list[str] | None = None) -> list[dict]:
    config = parse_config(DrawConfig, argv, description=__doc__.splitlines()[0])
    console = Console(width=200)
    console.print(f"CPU, {torch.get_num_threads()} threads; load average before: {os.getloadavg()[0]:.2f}")
    table = Table(title=f"one draw per lane from \\[lanes, {config.vocab:,}] bfloat16 logits, T = {config.temperature:g}")
    for column in ("lanes", "plain ms", "in place ms", "x plain", "kept buffer ms", "x in place", "same tokens",
                   "plain: largest error", "in place: largest error"):
        table.add_column(column, justify="right")
    rows = [measure(lanes, config) for lanes in config.lanes]
    for r in rows:
        table.add_row(str(r["lanes"]), f"{r['plain_ms']:.1f}", f"{r['in_place_ms']:.1f}", f"{r['ratio']:.2f}",
                      f"{r['kept_buffer_ms']:.1f}", f"{r['kept_buffer_ms'] / r['in_place_ms']:.2f}",
                      "yes" if r["same_tokens"] else "no", f"{r['plain_error']:.1e}", f"{r['in_place_error']:.1e}")
    table.caption = (f"median of {config.repeats} alternating calls after a warm-up; kept buffer: the in-place draw "
                     f"into one buffer every call (the same tokens and log-probs, checked); same tokens: plain against "
                     f"in place; error = largest |log-prob - float64 log-softmax| over the drawn tokens")
    console.print(table)
    cdf = Table(title=f"its inverse CDF alone: \\[lanes, {config.real_vocab:,}] weights, one draw a lane")
    for column in ("lanes", "one cumulative sum ms", "two levels ms", "x one", "same ids"):
        cdf.add_column(column, justify="right")
    for r in rows:
        cdf.add_row(str(r["lanes"]), f"{r['cdf_one_ms']:.2f}", f"{r['cdf_two_ms']:.2f}",
                    f"{r['cdf_two_ms'] / r['cdf_one_ms']:.2f}", "yes" if r["cdf_same_ids"] else "no")
    cdf.caption = f"median of {config.repeats} alternating calls; the same generator seed for both"
    console.print(cdf)
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
