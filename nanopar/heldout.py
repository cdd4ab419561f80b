"""Held-out evaluation of a stage's model, kept in its eval.json.

    HeldOut(config, stages, inputs, log, console).evaluate(stage)   {data spec: results}, saved

After a training stage the runner evaluates its `final/` on each --eval-data set
(`evaluation.evaluate`, then `summarize`). The result is kept in `<stage>/eval.json` under a key
of everything that decides the samples (`results.evaluation_key`), and sampled again only when
that changes; the responses are kept beside it (`eval_records.<digest>.jsonl`, the digest of that
key less the rewards), so a run that scores other rewards on the same samples (a stage skipped or
added) scores them again on the saved responses instead of sampling (`rescored`). Under torchrun the sampler calls are shared out over the processes
(`evaluation.evaluate`: the same records as one process makes) and rank 0 writes eval.json. A set
whose records carry a reference response (a held-out slice of traces: parallel-gsm8k:heldout) also
gets the mean log-probability per token of those responses (`reference_logprob`). Every
evaluation also scores the rewards the run's GRPO stages train on, problem by problem
(`held_out_rewards`), so the table can compare a GRPO stage's own reward with its start's.
Not here: the metrics (evaluation.py), the stage loop (runner.py), reading saved results for the
table of stages (results.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from . import distributed
from .curriculum import Stage, TrainConfig, stage_folder
from .data import read_json, read_jsonl, write_json, write_jsonl
from .evaluation import evaluate, summarize
from .metrics import MetricsLog
from .pass_rate import rewards_by_problem
from .model import load_with_policy
from .policy import Policy
from .prompts import build_prompt
from .results import evaluation_key, held_out_instructions, run_rewards
from .run_inputs import RunInputs
from .sampler import SamplerSettings
from .sft import response_loglikelihood
from .show import progress
from .variance import split


class HeldOut:
    """The held-out evaluations of one run: its config and recipe, what it reads (`inputs`: the
    evaluation sets and problems), where it logs and prints."""

    def __init__(self, config: TrainConfig, stages: list[Stage], inputs: RunInputs, log: MetricsLog, console):
        self.config, self.stages, self.inputs, self.log, self.console = config, stages, inputs, log, console

    def evaluate(self, stage: Stage) -> dict | None:
        """{data spec: evaluation.summarize(...)} of the stage's model, from its eval.json when the
        key matches, else sampled now and saved; None when --eval-problems is 0."""
        config, inputs = self.config, self.inputs
        out = stage_folder(config.out, self.stages, stage) / "eval.json"
        if not config.eval_problems or not inputs.eval_sets():
            return None
        key = evaluation_key(config, self.stages, stage)
        saved = read_json(out) if out.exists() else {}
        if saved.get("how") == key:
            return saved["results"]
        kept = records_file(out.parent, key)
        if "how" in saved and samples_key(saved["how"]) == samples_key(key) and kept.exists():
            return self.rescored(stage, saved["results"], key, out, kept)
        path = config.model if stage.kind == "given" else str(out.parent / "final")
        model, tokenizer, policy = load_with_policy(config, path, stage.mode, inputs.schema)
        sampling, results, started, kept_records = SamplerSettings.from_flags(config), {}, time.perf_counter(), []
        with progress(self.console) as bar:
            for spec in inputs.eval_sets():
                problems = inputs.eval_problems(spec)
                task = bar.add_task(f"evaluate {stage.name} on {spec}", total=len(problems))
                records = evaluate(model, tokenizer, problems, policy, sampling, config.eval_samples,
                                   held_out_instructions(stage, spec, inputs.schema), config.chat,
                                   config.eval_batch, progress=lambda done, task=task: bar.update(task, completed=done))
                results[spec] = summarize(records) | held_out_rewards(records, run_rewards(self.stages))
                kept_records += [{"set": spec} | record for record in records]
                references = [(p, (p.extra or {}).get("response")) for p in problems]
                if problems and all(isinstance(response, str) for _, response in references):  # a set of traces
                    results[spec]["reference_logprob"] = self.reference_logprob(model, tokenizer, policy, references,
                                                                                stage, spec)
        if distributed.is_main():  # under torchrun every process holds the results (`evaluate` gathers them)
            write_jsonl(kept, kept_records)  # first: an eval.json is never without its responses
            for other in out.parent.glob("eval_records.*.jsonl"):
                if other != kept:
                    other.unlink()
            write_json(out, {"how": key, "results": results})
        self.log.write({"stage": stage.name, "event": "eval", "seconds": time.perf_counter() - started,
                        "results": {spec: {k: v for k, v in result.items() if k not in ("per_problem", "rewards")}
                                    for spec, result in results.items()}})  # eval.json keeps the per-problem ones
        distributed.barrier("waiting for rank 0 to write eval.json")  # read next on every process
        return results

    def rescored(self, stage: Stage, results: dict, key: dict, out: Path, kept: Path) -> dict:
        """The saved `results`, their rewards scored again on the saved responses in `kept`: the samples'
        settings are this run's, only the rewards it scores differ. Saved in `out` under `key`."""
        rewards, records = run_rewards(self.stages), read_jsonl(kept)
        results = {spec: {k: v for k, v in result.items() if k not in ("rewards", "reward_means", "reward_splits")}
                   | held_out_rewards([r for r in records if r["set"] == spec], rewards)
                   for spec, result in results.items()}
        distributed.barrier("waiting for every process to read eval.json")  # before rank 0 rewrites it
        if distributed.is_main():
            write_json(out, {"how": key, "results": results})
        self.console.print(f"[dim]{stage.name}: its saved responses scored again for the rewards "
                           f"{', '.join(rewards) or '(none)'}, not sampled again[/dim]", highlight=False)
        distributed.barrier("waiting for rank 0 to write eval.json")
        return results

    def reference_logprob(self, model, tokenizer, policy: Policy, references: list, stage: Stage, spec: str) -> float:
        """The mean log-probability per token of a set's reference responses (held-out traces) under
        the stage's model, after the prompt the evaluation samples from: read as SFT reads traces."""
        config, eos = self.config, tokenizer.eos_token_id
        prompts = [build_prompt(problem, tokenizer, held_out_instructions(stage, spec, self.inputs.schema),
                                chat=config.chat) for problem, _ in references]
        responses = [tokenizer.encode(self.inputs.as_trained(response, stage), add_special_tokens=False) + [eos]
                     for _, response in references]
        return response_loglikelihood(model, prompts, responses, policy, tokenizer.pad_token_id or 0,
                                      config.micro_batch, config.head_read)


def held_out_rewards(records: list[dict], rewards: list[str]) -> dict:
    """{"rewards": {reward spec: {problem: mean reward of its samples}}, "reward_means": {spec: mean},
    "reward_splits": {spec: its variance between and within problems (`variance.split`)}} of the
    evaluated responses, each reward as GRPO scores it (`evaluation.rescore`)."""
    if not rewards:
        return {}
    per_problem: dict[str, dict[str, float]] = {}
    splits: dict[str, dict | None] = {}
    for reward in rewards:
        totals = rewards_by_problem(records, reward)
        per_problem[reward] = {problem: sum(t) / len(t) for problem, t in totals.items()}
        splits[reward] = split(list(totals.values())) if len(set(map(len, totals.values()))) == 1 else None
    return {"rewards": per_problem, "reward_splits": splits,
            "reward_means": {reward: sum(m.values()) / len(m) for reward, m in per_problem.items()}}


def samples_key(key: dict) -> dict:
    """An evaluation key (`results.evaluation_key`) less the rewards scored: what decides the samples."""
    return {name: value for name, value in key.items() if name != "rewards"}


def records_file(folder: Path, key: dict) -> Path:
    """`<folder>/eval_records.<digest>.jsonl`: the saved responses of the evaluation under `key`,
    named by its `samples_key`, so responses sampled under other settings are never read for it."""
    digest = hashlib.sha256(json.dumps(samples_key(key), sort_keys=True).encode()).hexdigest()[:12]
    return folder / f"eval_records.{digest}.jsonl"


def forget_evaluation(folder: Path) -> None:
    """Remove a stage folder's evaluation, eval.json and its saved responses: its model changed."""
    for path in [folder / "eval.json", *folder.glob("eval_records.*.jsonl")]:
        path.unlink(missing_ok=True)
