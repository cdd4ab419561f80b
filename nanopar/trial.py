"""A trial run: every stage a few steps, each evaluation one batch, then the whole run's time
projected from what the trial measured (`train.py --trial N`).

    full = trim(config, argv, N)          # config now runs N steps a stage, one --eval-batch per set
    ... the trial runs as any run does ...
    projection(full, stages, records)     # a row per stage: seconds a step, its steps in the run, projected

A stage of the trial runs its first N steps with the run's own batch, lengths and memory
settings, so its steps cost what the run's will, and an evaluation samples one full --eval-batch,
so its peak memory is the run's too; a stage's pass-rate pool (--pool-samples) samples one sampler
call's problems. The projection of a training stage is its fixed cost (the stage's time less its
steps' and its pool's: loading, the final save) plus its pool's time per problem times the run's
pool, plus the median step times the run's steps; of an evaluation, its time per sampler call
times the run's calls. A lower bound where a
stage samples from a model that trimmed stages trained less than the run's will be (a cold start of
N steps writes shorter answers, with fewer blocks to fork): the table shows the trial's response
lengths beside the budget (docs/gpu.md, "The first hour", compares a trial with its run). Not projected: the
distill stages (the trial runs them whole), the run's own checkpoints (one save a
--checkpoint-every steps, like the final one), steps that grow longer as a stage goes on.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from . import NanoparError
from .config import flags_given

TRIMMED = ("pretrain_steps", "sft_steps", "rl_easy_steps", "rl_hard_steps")  # steps of each kind of stage


def trim(config, argv: list[str], steps: int) -> tuple[object, dict]:
    """The full run's config (a copy), and `config` trimmed in place to a trial of `steps` steps a
    stage, its evaluations one --eval-batch, its folder <out>-trial unless --out is given.
    -> (full config, {field: new value})"""
    if steps < 1:
        raise NanoparError(f"--trial must be >= 1 steps a stage, not {steps}")
    full, changed = dataclasses.replace(config), {}
    pool_call = max(1, config.prompts_per_step * config.group_size // max(config.pool_samples, 1))  # pass_rate.py's
    for field, value in [(name, min(getattr(config, name), steps)) for name in TRIMMED] + [
            ("eval_problems", min(config.eval_problems, config.eval_batch)),
            ("pool_problems", min(config.pool_problems or pool_call, pool_call) if config.pool_samples
             else config.pool_problems),  # --pool-samples: one sampler call of the pool
            ("out", config.out if "out" in flags_given(argv) else f"{config.out}-trial")]:
        if getattr(config, field) != value:
            setattr(config, field, value)
            changed[field] = value
    return full, changed


def projection(full, trial_stages, full_stages, records: list[dict]) -> list[dict]:
    """One row per stage the trial ran: its steps, the median seconds a step, the run's steps, and
    the stage's projected seconds, its evaluation's included. `records`: the trial's metrics.jsonl."""
    by_name = {s.name: s for s in full_stages}
    rows = []
    for stage in trial_stages:
        lines = [r for r in records if r.get("stage") == stage.name]
        steps = [r for r in lines if "step" in r]
        done = next((r["seconds"] for r in lines if r.get("event") == "done"), None)
        evaluated = next((r["seconds"] for r in lines if r.get("event") == "eval"), 0.0)
        pool = next((r for r in lines if r.get("event") == "pool"), None)  # --pool-samples: one call's problems
        pooled = pool["seconds"] if pool else 0.0
        if done is None and stage.kind != "given":
            continue  # not run by this trial (done before, or skipped)
        done = done or 0.0  # the configured --model (--eval-model): evaluated only
        seconds = [r.get("sample_seconds", 0.0) + r.get("train_seconds", 0.0) for r in steps]
        per_step = statistics.median(seconds) if seconds else None
        run_steps = by_name[stage.name].steps if stage.name in by_name else 0
        fixed = max(done - sum(seconds) - pooled, 0.0)
        evaluation = evaluated * math.ceil(full.eval_problems / full.eval_batch)  # the trial: one call a set
        pooling = pooled * (full.pool_problems or pool["available"]) / pool["problems"] if pool else 0.0
        training = fixed + pooling + per_step * run_steps if seconds else done  # a distill stage: run whole
        lengths = [r["response_length"] for r in steps if "response_length" in r]  # GRPO steps: tokens a response
        rows.append({"stage": stage.name, "trial_steps": len(steps), "seconds_a_step": per_step,
                     "response_tokens": statistics.fmean(lengths) if lengths else None,
                     "run_steps": run_steps if seconds else None, "stage_seconds": training,
                     "eval_seconds": evaluation, "projected_seconds": training + evaluation})
    return rows
