"""Held-out evaluation of a stage's model, kept in its eval.json, and what the table of stages shows.

After a training stage the runner evaluates its `final/` on each --eval-data set
(`evaluation.evaluate`, then `summarize`). The result is kept in `<stage>/eval.json` under a key
of everything that decides the samples (`HeldOut.key`), and sampled again only when that changes.
Under torchrun the sampler calls are shared out over the processes (`evaluation.evaluate`: the
same records as one process makes) and rank 0 writes eval.json. A set whose records carry a
reference response (a held-out slice of traces: parallel-gsm8k:heldout) also gets the mean
log-probability per token of those responses (`reference_logprob`). Every evaluation also
scores the rewards the run's GRPO stages train on, problem by problem, so a GRPO stage's own
reward is compared with its start's on the same problems (`reward_change_over_start`).
`stage_result` gathers one stage's numbers (its steps, reward, time, held-out results and change
over the stage it started from) as plain data for `show.stage_table`, which never runs a model.
Not here: the metrics (evaluation.py), the stage loop (runner.py), drawing tables (show.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from . import distributed
from .curriculum import Stage, starting_stage
from .data import read_jsonl
from .evaluation import evaluate, paired_difference, rescore, summarize
from .policy import Policy
from .prompts import build_prompt, instructions_named
from .rewards import Constant, schedule_from_string
from .sampler import SamplerSettings
from .sft import response_loglikelihood
from .show import progress


class HeldOut:
    """The held-out evaluations of one run (`runner`: its folders, inputs, models and log)."""

    def __init__(self, runner):
        self.runner = runner
        first = next((s for s in runner.stages if s.kind in ("sft", "grpo")), None)
        # --eval-model: the configured model, prompted and read as the first training stage will be
        self.given = Stage("model", "given", "", instructions=first.instructions if first else "none",
                           mode=first.mode if first else "structured") if runner.config.eval_model else None

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
        path = runner.config.model if stage.kind == "given" else str(runner.folder(stage) / "final")
        model, tokenizer, policy = runner.load(path, stage.mode)
        sampling, results, started = SamplerSettings.from_flags(config), {}, time.perf_counter()
        with progress(runner.console) as bar:
            for spec in inputs.eval_sets():
                problems = inputs.eval_problems(spec)
                task = bar.add_task(f"evaluate {stage.name} on {spec}", total=len(problems))
                records = evaluate(model, tokenizer, problems, policy, sampling, config.eval_samples,
                                   instructions_named(stage.instructions, spec, runner.schema), config.chat,
                                   config.eval_batch, progress=lambda done, task=task: bar.update(task, completed=done))
                results[spec] = summarize(records) | held_out_rewards(records, self.rewards())
                references = [(p, (p.extra or {}).get("response")) for p in problems]
                if problems and all(isinstance(response, str) for _, response in references):  # a set of traces
                    results[spec]["reference_logprob"] = self.reference_logprob(model, tokenizer, policy, references,
                                                                                stage, spec)
        if distributed.is_main():  # under torchrun every process holds the results (`evaluate` gathers them)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"how": key, "results": results}, indent=1) + "\n")
        runner.log.write({"stage": stage.name, "event": "eval", "seconds": time.perf_counter() - started,
                          "results": {spec: {k: v for k, v in result.items() if k not in ("per_problem", "rewards")}
                                      for spec, result in results.items()}})  # eval.json keeps the per-problem ones
        distributed.barrier("waiting for rank 0 to write eval.json")  # read next on every process
        return results

    def reference_logprob(self, model, tokenizer, policy: Policy, references: list, stage: Stage, spec: str) -> float:
        """The mean log-probability per token of a set's reference responses (held-out traces) under
        the stage's model, after the prompt the evaluation samples from: read as SFT reads traces."""
        config, eos = self.runner.config, tokenizer.eos_token_id
        prompts = [build_prompt(problem, tokenizer, instructions_named(stage.instructions, spec, self.runner.schema),
                                chat=config.chat) for problem, _ in references]
        responses = [tokenizer.encode(self.runner.inputs.as_trained(response, stage), add_special_tokens=False) + [eos]
                     for _, response in references]
        return response_loglikelihood(model, prompts, responses, policy, tokenizer.pad_token_id or 0,
                                      config.micro_batch, config.head_read)

    def change_over_start(self, stage: Stage) -> dict[str, tuple[float, float]]:
        """{data spec: (accuracy - that of the stage it started from, standard error)}: held-out
        results compared problem by problem (`evaluation.paired_difference`). {} for a stage that
        starts from the configured --model without --eval-model, or from one not finished."""
        return self._paired_over_start(stage, lambda result: result)

    def start_of(self, stage: Stage) -> Stage | None:
        """The evaluated stage `stage` started from: a finished training stage, or the configured
        --model's (`given`, with --eval-model); None when there is none to compare with."""
        if stage.kind == "given":
            return None
        source = starting_stage(self.runner.stages, stage)
        if source is None:
            return self.given
        if source.kind == "distill" or not (self.runner.folder(source) / "final").exists():
            return None
        return source

    def reward_change_over_start(self, stage: Stage) -> dict[str, tuple[float, float]]:
        """{data spec: (held-out mean of the stage's own reward - that of its start's model, standard
        error)}, paired problem by problem; {} where the stage has no reward of its own."""
        reward = own_reward(stage)
        if reward is None:
            return {}
        return self._paired_over_start(stage, lambda result: {"per_problem": result["rewards"][reward]}
                                       if reward in result.get("rewards", {}) else None)

    def _paired_over_start(self, stage: Stage, read) -> dict[str, tuple[float, float]]:
        """{data spec: paired_difference(read(its start's result), read(its result))} over the sets
        both evaluations hold and `read` finds (None: not there)."""
        source = self.start_of(stage)
        if source is None:
            return {}
        before, after = self.evaluate(source) or {}, self.evaluate(stage) or {}
        pairs = {spec: paired_difference(read(before[spec]), read(after[spec])) for spec in after
                 if spec in before and read(before[spec]) is not None and read(after[spec]) is not None}
        return {spec: pair for spec, pair in pairs.items() if pair is not None}

    def key(self, stage: Stage) -> dict:
        """What decides a held-out evaluation's samples, the key of its eval.json: the sets and
        their fields, every SamplerSettings field, every Policy field the config sets (temperature,
        ...), the stage's prompt and mode, the batching (each sampler call has its own seed) and
        the arithmetic the model runs in (dtype, 4-bit). Built from the dataclasses, so a new
        sampler or policy knob is part of it."""
        config, sets, schema = self.runner.config, self.runner.inputs.eval_sets(), self.runner.schema
        policy = {f.name: getattr(config, f.name) for f in dataclasses.fields(Policy) if hasattr(config, f.name)}
        return {"data": sets, "fields": [config.question_field, config.answer_field],
                "problems": config.eval_problems, "samples": config.eval_samples, "batch": config.eval_batch,
                "instructions": [instructions_named(stage.instructions, spec, schema) for spec in sets],
                "schema": schema.name,
                "chat": config.chat, "dtype": config.dtype, "load_in_4bit": config.load_in_4bit,
                **dataclasses.asdict(SamplerSettings.from_flags(config)), **policy,
                "mode": stage.mode, "rewards": self.rewards()}

    def rewards(self) -> list[str]:
        """The rewards the run's GRPO stages train on (`own_reward`), scored on every evaluation."""
        return sorted({reward for stage in self.runner.stages if (reward := own_reward(stage))})


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
                       results=results, changes=runner.heldout.change_over_start(stage) if results else {},
                       own_reward=own_reward(stage),
                       reward_changes=runner.heldout.reward_change_over_start(stage) if results else {})


def own_reward(stage: Stage) -> str | None:
    """The reward spec a GRPO stage trains on at every step; None for other stages and for a
    schedule (alternating, two-phase: no one reward of its own)."""
    if stage.kind != "grpo":
        return None
    schedule = schedule_from_string(stage.reward)
    return stage.reward if isinstance(schedule, Constant) else None


def held_out_rewards(records: list[dict], rewards: list[str]) -> dict:
    """{"rewards": {reward spec: {problem: mean reward of its samples}}, "reward_means": {spec: mean}}
    of the evaluated responses, each reward as GRPO scores it (`evaluation.rescore`)."""
    if not rewards:
        return {}
    per_problem: dict[str, dict[str, float]] = {}
    for reward in rewards:
        totals: dict[str, list[float]] = {}
        for record, result in zip(records, rescore(records, reward)):
            totals.setdefault(f"{record['source']}/{record['id']}", []).append(result.total)
        per_problem[reward] = {problem: sum(t) / len(t) for problem, t in totals.items()}
    return {"rewards": per_problem,
            "reward_means": {reward: sum(m.values()) / len(m) for reward, m in per_problem.items()}}
