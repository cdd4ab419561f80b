"""A run's saved results as the table of stages shows them, read from its files and never by a model.

    stage_result(config, stages, stage)   one stage's numbers: StageResult
      metrics.jsonl          its steps, last rewards and training seconds
      <stage>/eval.json      its held-out results, when their key is this run's (`evaluation_key`)
      <its start>/eval.json  the change over the stage it started from, problem by problem
      <its twin>/eval.json   with --baseline: the difference from accuracy-only GRPO with its RL steps

An evaluation is kept in `<stage>/eval.json` under a key of everything that decides its samples
(`evaluation_key`); heldout.py writes it after each training stage, and a result is read here
only while the key matches (an eval.json written under other settings is as good as missing). A
stage without one shows its training numbers and no held-out results: nothing here samples.
The table itself is drawn by `show.stage_table`.
Not here: sampling an evaluation (heldout.py, evaluation.py), drawing the table (show.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .curriculum import Stage, TrainConfig, baseline_of, eval_sets, given_stage, stage_folder, starting_stage
from .data import read_json, read_jsonl
from .evaluation import paired_difference
from .policy import Policy
from .prompts import instructions_named
from .rewards import Constant, schedule_from_string
from .sampler import SamplerSettings
from .tags import TagSchema, schema_named


def evaluation_key(config: TrainConfig, stages: list[Stage], stage: Stage) -> dict:
    """What decides a held-out evaluation's samples, the key of its eval.json: the sets and
    their fields, every SamplerSettings field, every Policy field the config sets (temperature,
    ...), the stage's prompt and mode, the batching (each sampler call has its own seed), the
    arithmetic the model runs in (dtype, 4-bit) and the rewards scored. Built from the
    dataclasses, so a new sampler or policy knob is part of it."""
    sets, schema = eval_sets(config), schema_named(config.schema)
    policy = {f.name: getattr(config, f.name) for f in dataclasses.fields(Policy) if hasattr(config, f.name)}
    return {"data": sets, "fields": [config.question_field, config.answer_field],
            "problems": config.eval_problems, "samples": config.eval_samples, "batch": config.eval_batch,
            "instructions": [held_out_instructions(stage, spec, schema) for spec in sets],
            "schema": schema.name,
            "chat": config.chat, "dtype": config.dtype, "load_in_4bit": config.load_in_4bit,
            **dataclasses.asdict(SamplerSettings.from_flags(config)), **policy,
            "mode": stage.mode, "rewards": run_rewards(stages)}


def held_out_instructions(stage: Stage, spec: str, schema: TagSchema) -> str:
    """The instructions a stage's model reads on the evaluation set `spec`, as that set's source
    words the stage's --instructions: the one place the key above and heldout.py's samples take
    them from, so an eval.json cannot be kept under a prompt it was not sampled with."""
    return instructions_named(stage.instructions, spec, schema)


def run_rewards(stages: list[Stage]) -> list[str]:
    """The rewards the run's GRPO stages train on (`own_reward`), scored on every evaluation."""
    return sorted({reward for stage in stages if (reward := own_reward(stage))})


def own_reward(stage: Stage) -> str | None:
    """The reward spec a GRPO stage trains on at every step; None for other stages and for a
    schedule (alternating, two-phase: no one reward of its own)."""
    if stage.kind != "grpo":
        return None
    schedule = schedule_from_string(stage.reward)
    return stage.reward if isinstance(schedule, Constant) else None


def saved_evaluation(config: TrainConfig, stages: list[Stage], stage: Stage) -> dict | None:
    """{data spec: evaluation.summarize(...)} of the stage's model from its eval.json; None when
    --eval-problems is 0, or there is none whose key matches this run's settings."""
    if not config.eval_problems or not eval_sets(config):
        return None
    path = stage_folder(config.out, stages, stage) / "eval.json"
    saved = read_json(path) if path.exists() else {}
    return saved["results"] if saved.get("how") == evaluation_key(config, stages, stage) else None


def start_of(config: TrainConfig, stages: list[Stage], stage: Stage) -> Stage | None:
    """The evaluated stage `stage` started from: a finished training stage, or the configured
    --model's (`given_stage`, with --eval-model); None when there is none to compare with."""
    if stage.kind == "given":
        return None
    source = starting_stage(stages, stage)
    if source is None:
        return given_stage(config, stages)
    if source.kind == "distill" or not (stage_folder(config.out, stages, source) / "final").exists():
        return None
    return source


def change_over_start(config: TrainConfig, stages: list[Stage], stage: Stage, results: dict,
                      reward: str | None = None) -> dict[str, tuple[float, float]]:
    """{data spec: (accuracy - that of the stage it started from, standard error)}: the stage's
    held-out `results` (its `saved_evaluation`) and its start's compared problem by problem
    (`evaluation.paired_difference`), over the sets both hold. With `reward`: the held-out mean of
    that reward instead. {} for a stage that starts from the configured --model without
    --eval-model, or from one not evaluated."""
    source = start_of(config, stages, stage)
    return paired_changes(config, stages, source, results, reward) if source is not None else {}


def change_over_baseline(config: TrainConfig, stages: list[Stage], stage: Stage, results: dict
                         ) -> dict[str, tuple[float, float]]:
    """{data spec: (accuracy - that of its --baseline twin, standard error)}: the recipe's GRPO stage
    (its held-out `results`) against accuracy-only GRPO from the same base with the same RL steps
    (`curriculum.baseline_of`), problem by problem, the papers' headline comparison. {} without a
    twin or its eval.json."""
    twin = baseline_of(stages, stage)
    return paired_changes(config, stages, twin, results) if twin is not None else {}


def paired_changes(config: TrainConfig, stages: list[Stage], before: Stage, after: dict, reward: str | None = None
                   ) -> dict[str, tuple[float, float]]:
    """{data spec: (accuracy in `after`, a stage's saved evaluation, - that of stage `before`,
    standard error of the per-problem differences)} over the sets both hold; with `reward`, that
    reward's held-out mean instead."""
    def read(result: dict) -> dict | None:
        if reward is None:
            return result
        return {"per_problem": result["rewards"][reward]} if reward in result.get("rewards", {}) else None

    first = saved_evaluation(config, stages, before) or {}
    pairs = {spec: paired_difference(read(first[spec]), read(after[spec])) for spec in after
             if spec in first and read(first[spec]) is not None and read(after[spec]) is not None}
    return {spec: pair for spec, pair in pairs.items() if pair is not None}


@dataclass
class StageResult:
    """One stage as the table of stages shows it: plain numbers, nothing to compute."""

    sets: list[str]  # its run's evaluation sets ([] without evaluation), rows of the table
    steps: int | None  # steps trained (None: none logged)
    reward: float | None  # mean reward of its last 5 steps (GRPO)
    seconds: float  # training time
    results: dict  # {eval set: evaluation.summarize(...)}; {} when not evaluated
    changes: dict  # {eval set: (accuracy - its start's, standard error)}
    own_reward: str | None = None  # a GRPO stage's reward spec (None: none, or a schedule)
    reward_changes: dict = dataclasses.field(default_factory=dict)  # {eval set: (its reward's mean - its start's, SE)}
    baseline_changes: dict = dataclasses.field(default_factory=dict)  # {eval set: (accuracy - its --baseline twin's, SE)}


def stage_result(config: TrainConfig, stages: list[Stage], stage: Stage) -> StageResult:
    """A stage's numbers from the run's metrics.jsonl and its eval.json (`saved_evaluation`):
    without a matching eval.json, its training numbers alone."""
    rows = [r for r in read_jsonl(Path(config.out) / "metrics.jsonl") if r.get("stage") == stage.name]
    steps = [r for r in rows if "step" in r]
    rewards = [r["reward"] for r in steps[-5:] if "reward" in r]
    results = (saved_evaluation(config, stages, stage) if stage.kind != "distill" else None) or {}
    reward = own_reward(stage)
    return StageResult(sets=eval_sets(config) if config.eval_problems else [],
                       steps=steps[-1]["step"] if steps else None,
                       reward=sum(rewards) / len(rewards) if rewards else None,
                       seconds=sum(r["seconds"] for r in rows if r.get("event") == "done"),
                       results=results, changes=change_over_start(config, stages, stage, results) if results else {},
                       own_reward=reward,
                       reward_changes=change_over_start(config, stages, stage, results, reward) if results and reward else {},
                       baseline_changes=change_over_baseline(config, stages, stage, results) if results else {})
