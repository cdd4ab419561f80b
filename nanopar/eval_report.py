"""What eval.py reports beside each benchmark's summary: decode speed and NPR's speedup, and the
distribution of a reward re-scored on saved responses.

    decode_rate(records)["tokens_per_second"]           # the evaluation's own sampler calls, timed
    speedup(model, tokenizer, problems, policy, settings)["speedup"]   # forking vs not, best of 2 rounds
    reward_report(rescore(records, "accuracy:1,format:0.2"), groups=group_keys(records))   # mean, histogram, no-gradient share

Speed reads the records' wall times (`decode_rate`, `forked`) or decodes the prompts again as
`evaluation.evaluate` would, same batches, seeds and budget, only timed (`speedup`,
`sequential_rate`). The reward report reads `evaluation.rescore`'s results and, grouped by prompt,
what GRPO would see of the reward before any training: the share of groups it learns nothing from
and how often its advantages point the way accuracy's do. Nothing here is part of
a training run: its held-out evaluation needs only evaluation.py.
Not here: sampling and grading records, their summary, re-scoring itself (evaluation.py); the
tables and files (eval.py); the sampler's own benchmarks (bench/).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter

from . import NanoparError
from .data import Problem
from .evaluation import call_settings
from .metrics import group_signal
from .policy import Policy
from .prompts import build_prompt, stop_ids
from .rewards import RewardResult
from .sampler import SamplerSettings, sample


# ----------------------------------------------------------------------------- speed


def decode_rate(records: list[dict], batches: int | None = None) -> dict:
    """Response tokens (sampled and inserted) per second of sampler wall time, over the sampler
    calls behind `records` (only calls 0..batches-1 when given). Grading time is not counted."""
    chosen = [r for r in records if batches is None or r["batch"] < batches]
    walls = {r["batch"]: r["stats"]["wall_time"] for r in chosen}  # one wall time per call
    return _rate(sum(r["new_tokens"] for r in chosen), sum(walls.values()))


def sequential_rate(model, tokenizer, problems: list[Problem], policy: Policy, settings: SamplerSettings,
                    samples: int = 1, instructions: str = "", chat: bool = True, batch_size: int = 32) -> dict:
    """Decode the same prompts, in the same batches, seeds and budget, as `evaluate` would, but
    sequentially: the policy gets no tag ids, so `<Parallel>` forks nothing and every tag is a
    token like any other. -> {"tokens", "seconds", "tokens_per_second"} of the sampler calls."""
    plain = dataclasses.replace(policy, tag_ids=None)
    return decode_rate_again(model, tokenizer, problems, plain, settings, samples, instructions, chat, batch_size)


def decode_rate_again(model, tokenizer, problems: list[Problem], policy: Policy, settings: SamplerSettings,
                      samples: int = 1, instructions: str = "", chat: bool = True, batch_size: int = 32) -> dict:
    """Decode the prompts as `evaluate` would (same batches, seeds, budget), only timed, under
    `policy`. -> {"tokens", "seconds", "tokens_per_second"} of the sampler calls."""
    eos, tokens, seconds = stop_ids(model, tokenizer), 0, 0.0
    for batch, start in enumerate(range(0, len(problems), batch_size)):
        prompts = [build_prompt(p, tokenizer, instructions, chat=chat) for p in problems[start : start + batch_size]]
        rollouts = sample(model, prompts, policy, call_settings(settings, batch), eos, samples)
        tokens += sum(r.stats.new_tokens for r in rollouts)
        seconds += rollouts[0].stats.wall_time
    return _rate(tokens, seconds)


def forked(records: list[dict], batches: int | None = None, mode: str = "structured") -> bool:
    """Whether any response of sampler calls 0..batches-1 (all when None) forked: holds a block of
    two or more branches (a one-plan NPR guideline is a step of the main chain, no fork). In causal
    `mode` (the policy's) nothing forks, whatever blocks the model wrote.

    >>> plain, block = {"batch": 0, "paths_per_block": []}, {"batch": 1, "paths_per_block": [1, 3]}
    >>> forked([plain, block]), forked([plain, block], batches=1), forked([plain, block], mode="causal")
    (True, False, False)
    """
    chosen = [r for r in records if batches is None or r["batch"] < batches]
    return mode == "structured" and any(n >= 2 for r in chosen for n in r["paths_per_block"])


def speedup(model, tokenizer, problems: list[Problem], policy: Policy, settings: SamplerSettings, samples: int = 1,
            instructions: str = "", chat: bool = True, batch_size: int = 32, repeats: int = 2) -> dict:
    """NPR's speedup, timed as the benchmarks time (bench/speed.py): the same prompts decoded with
    forking (`policy`) and sequentially (no tag ids), taking turns for `repeats` rounds so a drift in
    machine speed hits both alike, the best round of each counting. Call it after a warm-up (eval.py:
    after the evaluation itself, which decoded these prompts once). -> {"parallel", "sequential":
    rates as `decode_rate`'s, the best of each; "speedup": parallel / sequential tokens/s (None
    when either has no rate)}. Whether anything forks is the caller's to check (`forked`):
    without a fork the two decodes are the same work and their ratio is noise."""
    if repeats < 1:
        raise NanoparError(f"the speedup needs at least one timed round, got {repeats}")
    plain = dataclasses.replace(policy, tag_ids=None)
    best: dict[str, dict] = {}
    for _ in range(repeats):
        for name, which in (("parallel", policy), ("sequential", plain)):
            rate = decode_rate_again(model, tokenizer, problems, which, settings, samples, instructions, chat,
                                     batch_size)
            if name not in best or (rate["tokens_per_second"] or 0.0) > (best[name]["tokens_per_second"] or 0.0):
                best[name] = rate
    parallel, sequential = best["parallel"]["tokens_per_second"], best["sequential"]["tokens_per_second"]
    return best | {"speedup": parallel / sequential if parallel and sequential else None}


def _rate(tokens: int, seconds: float) -> dict:
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds if seconds > 0 else None}


# ----------------------------------------------------------------------------- a re-scored reward


def reward_report(results: list[RewardResult], saved_correct: list[bool | None] | None = None,
                  groups: list | None = None) -> dict:
    """The distribution of re-scored rewards, how it goes with correctness, and what GRPO sees of it.

    `histogram` maps each value to its count (ranges of ten equal bins when there are more than
    ten distinct values); `correlation` is Pearson's r between the reward and the 0/1 correctness of the same grading
    (None when either is constant); `regraded_changed` counts responses whose correctness now
    differs from the saved one (`saved_correct`, None entries skipped): grading changed since.
    `groups` names each response's group (`group_keys`: the responses of one prompt; None: every
    response alone); the group numbers are `group_signal`'s, for the reward (`no_gradient`,
    `agreement`, `group_std`) and for accuracy (`no_gradient_accuracy`). `per_component` gives, for
    each reward of the spec (its value before weighting), its mean, std, histogram and group numbers.
    """
    if not results:
        raise NanoparError("no records to re-score")
    totals = [r.total for r in results]
    correct = [r.grade.correct for r in results]
    groups = list(range(len(results))) if groups is None else groups
    right = [t for t, c in zip(totals, correct) if c]
    wrong = [t for t, c in zip(totals, correct) if not c]
    constant = len(set(totals)) < 2 or len(set(correct)) < 2
    signal = group_signal(totals, correct, groups)
    return {
        "count": len(totals),
        "mean": statistics.fmean(totals),
        "std": statistics.pstdev(totals),
        "min": min(totals),
        "max": max(totals),
        "histogram": histogram(totals),
        "components": {name: statistics.fmean(r.components[name] for r in results) for name in results[0].components},
        "accuracy": statistics.fmean(correct),
        "parse_failures": statistics.fmean(r.grade.error is not None for r in results),
        "mean_if_correct": statistics.fmean(right) if right else None,
        "mean_if_wrong": statistics.fmean(wrong) if wrong else None,
        "correlation": None if constant else statistics.correlation(totals, [float(c) for c in correct]),
        "regraded_changed": sum(s is not None and s != c for s, c in zip(saved_correct or [], correct)),
        **signal,
        "no_gradient_accuracy": group_signal([float(c) for c in correct], correct, groups)["no_gradient"],
        "per_component": {name: _component(results, name, correct, groups) for name in results[0].components},
    }


def _component(results: list[RewardResult], name: str, correct: list[bool], groups: list) -> dict:
    values = [r.components[name] for r in results]
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values), "histogram": histogram(values),
            **group_signal(values, correct, groups)}


def group_keys(records: list[dict]) -> list[tuple]:
    """Each record's group, the responses of one prompt: (stage, step, source, id). A training step
    samples a problem once (its G rollouts); an evaluation's samples of a problem are its group."""
    return [(r.get("stage"), r.get("step"), r.get("source"), r.get("id")) for r in records]


def histogram(values: list[float], bins: int = 10) -> dict[str, int]:
    """{value: count} for few distinct values, else {"[low, high)": count} over `bins` equal bins.

    >>> histogram([1.0, -1.0, -1.0]), histogram([0.1 * i for i in range(20)], bins=2)
    ({'-1': 2, '1': 1}, {'[0, 0.95)': 10, '[0.95, 1.9]': 10})
    """
    distinct = sorted(set(values))
    if len(distinct) <= bins:
        counts = Counter(f"{v:g}" for v in values)
        return dict(sorted(counts.items(), key=lambda item: float(item[0])))
    low, width = distinct[0], (distinct[-1] - distinct[0]) / bins
    counts = Counter(min(int((v - low) / width), bins - 1) for v in values)
    return {f"[{low + b * width:.3g}, {low + (b + 1) * width:.3g}{']' if b == bins - 1 else ')'}": counts[b]
            for b in range(bins)}
