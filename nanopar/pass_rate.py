"""A GRPO stage's problems filtered by its starting model's own pass rate, sampled once and kept.

    <stage>/pool.json            what decided the samples, and each problem's rewards
    <stage>/pool_records.jsonl   the responses themselves (evaluation records)

Bae et al. 2025 ("Online difficulty filtering for reasoning oriented reinforcement learning",
arXiv 2504.03380) train on the problems the model solves some of the time (0 < p < 1), where a
group's rewards differ and its advantages are not all 0. Here that is read on the stage's own
reward at its first step, so it serves any reward: a problem is kept when its N responses from the
stage's starting model earned at least two different rewards (for "accuracy" exactly 0 < p < 1).
The filter looks once, before the stage's first step, and never again (the paper filters each
batch online, as DAPO's dynamic sampling does: dynamic_sampling.py).

Its cost is one sampler pass over --pool-problems problems x --pool-samples responses, at the
run's sampler settings and its prompt; the runner logs it (metrics.jsonl, event "pool") and keeps
the result under a key of what decided it, so a resumed run (whose model is a checkpoint, no
longer the starting model) reads it instead of sampling. Not here: sampling and grading
(evaluation.evaluate), the reward (rewards.py), the stage loop (runner.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from . import NanoparError
from .data import Problem, read_json, write_json, write_jsonl
from .evaluation import evaluate, rescore
from .rewards import schedule_from_string
from .sampler import SamplerSettings
from .show import progress

POOL = "pool.json"
RECORDS = "pool_records.jsonl"


def rewards_by_problem(records: list[dict], spec: dict[str, float]) -> dict[str, list[float]]:
    """{"source/id": the rewards of its responses under `spec`}, from evaluation records."""
    rewards: dict[str, list[float]] = {}
    for record, result in zip(records, rescore(records, spec)):
        rewards.setdefault(f"{record['source']}/{record['id']}", []).append(result.total)
    return rewards


def kept_problems(problems: list[Problem], rewards: dict[str, list[float]]) -> list[Problem]:
    """The problems whose rewards hold two different values, in the pool's order.

    >>> pool = [Problem("a", "q", "1", "gsm8k"), Problem("b", "q", "2", "gsm8k")]
    >>> [p.id for p in kept_problems(pool, {"gsm8k/a": [1.0, -1.0], "gsm8k/b": [1.0, 1.0]})]
    ['a']
    """
    return [p for p in problems if len(set(rewards[f"{p.source}/{p.id}"])) > 1]


def saved_pool(folder: Path, key: dict) -> dict[str, list[float]] | None:
    """The rewards a pool.json holds when it was made under `key`; None when there is none or it was
    made otherwise (then the pool is sampled again)."""
    path = folder / POOL
    if not path.exists():
        return None
    saved = read_json(path)
    if not isinstance(saved, dict) or "how" not in saved or not isinstance(saved.get("rewards"), dict):
        raise NanoparError(f"{path}: not a pool written by nanopar (no 'how' and 'rewards'): delete it to sample again")
    return saved["rewards"] if saved["how"] == key else None


def save_pool(folder: Path, key: dict, rewards: dict[str, list[float]], records: list[dict], seconds: float) -> None:
    """The responses first, then pool.json: a pool.json is never without them."""
    write_jsonl(folder / RECORDS, records)
    write_json(folder / POOL, {"how": key, "seconds": seconds, "rewards": rewards})


def signal_pool(config, stage, problems: list[Problem], folder: Path, source: str, starting_model: Callable,
                instructions: str, log, console) -> list[Problem]:
    """The problems of a GRPO stage that carry a signal for its starting model (`source`, loaded by
    `starting_model()` -> (model, tokenizer, policy) only when the pool is not saved yet), sampled
    once and kept in `folder`. `instructions`: the stage's prompt text."""
    pool = problems[: config.pool_problems or None]
    spec = schedule_from_string(stage.reward).spec(0)  # the reward of the stage's first step
    settings = SamplerSettings.from_flags(config)
    key = {"model": source, "data": stage.data, "problems": len(pool), "samples": config.pool_samples,
           "reward": spec, "instructions": instructions, "mode": stage.mode, "chat": config.chat,
           "sampler": dataclasses.asdict(settings)}
    rewards, started = saved_pool(folder, key), time.perf_counter()
    if rewards is None:
        model, tokenizer, policy = starting_model()
        lanes = max(1, config.prompts_per_step * config.group_size // config.pool_samples)  # a GRPO step's lanes
        with progress(console) as bar:
            task = bar.add_task(f"{stage.name}: pass rates of {len(pool)} problems x {config.pool_samples}",
                                total=len(pool))
            records = evaluate(model, tokenizer, pool, policy, settings, config.pool_samples, instructions,
                               config.chat, lanes, progress=lambda done: bar.update(task, completed=done))
        rewards = rewards_by_problem(records, spec)
        save_pool(folder, key, rewards, records, time.perf_counter() - started)
        log.write({"stage": stage.name, "event": "pool", "seconds": time.perf_counter() - started,
                   "problems": len(pool), "available": len(problems), "samples": config.pool_samples})
    missing = [p.id for p in pool if f"{p.source}/{p.id}" not in rewards]
    if missing:
        raise NanoparError(f"{folder / POOL}: no rewards for {len(missing)} of its problems ({missing[0]}, ...): "
                           "delete it to sample again")
    kept = kept_problems(pool, rewards)
    console.print(f"{stage.name}: {len(kept)} of {len(pool)} problems kept, their {config.pool_samples} responses "
                  f"earning different rewards ({len(pool) - len(kept)} dropped: one reward for all); {folder / POOL}",
                  highlight=False)
    if not kept:
        raise NanoparError(f"{stage.name}: none of {len(pool)} problems gave its starting model two different "
                           f"rewards in {config.pool_samples} responses: more --pool-problems or --pool-samples, "
                           "or --pool-samples 0 (no filter)")
    return kept
