"""Held-out evaluation of a stage's model, kept in its eval.json, and what the table of stages shows.

After a training stage the runner evaluates its `final/` on each --eval-data set
(`evaluation.evaluate`, then `summarize`). The result is kept in `<stage>/eval.json` under a key
of everything that decides the samples (`HeldOut.key`), and sampled again only when that changes.
`stage_result` gathers one stage's numbers (its steps, reward, time, held-out results and change
over the stage it started from) as plain data for `show.stage_table`, which never runs a model.
Not here: the metrics (evaluation.py), the stage loop (runner.py), drawing tables (show.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from .curriculum import Stage, starting_stage
from .data import read_jsonl
from .evaluation import evaluate, paired_difference, summarize
from .policy import Policy
from .prompts import instructions_named
from .sampler import SamplerSettings
from .show import progress


class HeldOut:
    """The held-out evaluations of one run (`runner`: its folders, inputs, models and log)."""

    def __init__(self, runner):
        self.runner = runner

    def evaluate(self, stage: Stage) -> dict | None:
        """{data spec: evaluation.summarize(...)} of the stage's model, from its eval.json when the
        key matches, else sampled now and saved; None when --eval-problems is 0."""
        runner = self.runner
        config, inputs, out = runner.config, runner.inputs, runner.folder(stage) / "eval.json"
        if not config.eval_problems or not inputs.eval_sets():
            return None
        key = self.key(stage)
        saved = json.loads(out.read_text()) if out.exists() else {}
        if saved.get("how") == key:
            return saved["results"]
        model, tokenizer, policy = runner.load(str(runner.folder(stage) / "final"), stage.mode)
        sampling, results, started = SamplerSettings.from_flags(config), {}, time.perf_counter()
        with progress(runner.console) as bar:
            for spec in inputs.eval_sets():
                problems = inputs.eval_problems(spec)
                task = bar.add_task(f"evaluate {stage.name} on {spec}", total=len(problems))
                records = evaluate(model, tokenizer, problems, policy, sampling, config.eval_samples,
                                   instructions_named(stage.instructions, spec, runner.schema), config.chat,
                                   config.eval_batch, progress=lambda done, task=task: bar.update(task, completed=done))
                results[spec] = summarize(records)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"how": key, "results": results}, indent=1) + "\n")
        runner.log.write({"stage": stage.name, "event": "eval", "seconds": time.perf_counter() - started,
                          "results": {spec: {k: v for k, v in result.items() if k != "per_problem"}
                                      for spec, result in results.items()}})  # eval.json keeps the per-problem ones
        return results

    def change_over_start(self, stage: Stage) -> dict[str, tuple[float, float]]:
        """{data spec: (accuracy - that of the stage it started from, standard error)}: held-out
        results compared problem by problem (`evaluation.paired_difference`). {} for a stage that
        starts from the configured --model (it has no evaluation here) or from one not finished."""
        source = starting_stage(self.runner.stages, stage)
        if source is None or source.kind == "distill" or not (self.runner.folder(source) / "final").exists():
            return {}
        before, after = self.evaluate(source) or {}, self.evaluate(stage) or {}
        pairs = {spec: paired_difference(before[spec], after[spec]) for spec in after if spec in before}
        return {spec: pair for spec, pair in pairs.items() if pair is not None}

    def key(self, stage: Stage) -> dict:
        """What decides a held-out evaluation's samples, the key of its eval.json: the sets and
        their fields, every SamplerSettings field, every Policy field the config sets (temperature,
        ...), the stage's prompt and mode, and the batching (each sampler call has its own seed).
        Built from the dataclasses, so a new sampler or policy knob is part of it."""
        config, sets, schema = self.runner.config, self.runner.inputs.eval_sets(), self.runner.schema
        policy = {f.name: getattr(config, f.name) for f in dataclasses.fields(Policy) if hasattr(config, f.name)}
        return {"data": sets, "fields": [config.question_field, config.answer_field],
                "problems": config.eval_problems, "samples": config.eval_samples, "batch": config.eval_batch,
                "instructions": [instructions_named(stage.instructions, spec, schema) for spec in sets],
                "schema": schema.name,
                "chat": config.chat, **dataclasses.asdict(SamplerSettings.from_flags(config)), **policy,
                "mode": stage.mode}


@dataclass
class StageResult:
    """One stage as the table of stages shows it: plain numbers, nothing to compute."""

    sets: list[str]  # its run's evaluation sets ([] without evaluation), rows of the table
    steps: int | None  # steps trained (None: none logged)
    reward: float | None  # mean reward of its last 5 steps (GRPO)
    seconds: float  # training time
    results: dict  # {eval set: evaluation.summarize(...)}; {} when not evaluated
    changes: dict  # {eval set: (accuracy - its start's, standard error)}


def stage_result(runner, stage: Stage) -> StageResult:
    """A stage's numbers from the run's metrics.jsonl and its held-out evaluation (done now if
    its eval.json is missing or stale)."""
    rows = [r for r in read_jsonl(runner.out / "metrics.jsonl") if r.get("stage") == stage.name]
    steps = [r for r in rows if "step" in r]
    rewards = [r["reward"] for r in steps[-5:] if "reward" in r]
    results = (runner.heldout.evaluate(stage) if stage.kind != "distill" else None) or {}
    sets = runner.inputs.eval_sets() if runner.config.eval_problems else []
    return StageResult(sets=sets, steps=steps[-1]["step"] if steps else None,
                       reward=sum(rewards) / len(rewards) if rewards else None,
                       seconds=sum(r["seconds"] for r in rows if r.get("event") == "done"),
                       results=results, changes=runner.heldout.change_over_start(stage) if results else {})
