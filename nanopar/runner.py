"""Running the stages of a curriculum: folders, input models, resume, the step loop, evaluation.

    run/
      config.json            the resolved TrainConfig
      metrics.jsonl          one line per step of every stage
      1-pretrain/            checkpoint-<step>/ while it runs, final/ and eval.json when done
      2-cold-start-data/     traces.jsonl (a distill stage writes traces, not a model)
      3-sft/ ...

A stage whose `final/` (or `traces.jsonl`) exists is done and skipped; a stage with checkpoints
resumes from the latest: model, optimiser, scheduler and RNG states, and the step. Everything a
step draws is seeded from (seed, stage, step), so a resumed run repeats exactly what the
interrupted one would have done. Ctrl-C saves a checkpoint first. The runner is bookkeeping only:
one GRPO step is `grpo.grpo_step`, one SFT step `sft.sft_step`; `open_run` makes a checked
Runner from a config (train.py's run and each arm of --ablations). Not here: the stage lists and
the config (curriculum.py), the flags (train.py), the final table (show.py).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console

from . import NanoparError
from .checkpoint import latest_checkpoint, load_trainer_state, prune_checkpoints, save_checkpoint
from .config import save_config
from .curriculum import Stage, TrainConfig, recipe, run_schema, select, starting_stage
from .data import SLICE, Problem, load_problems, load_traces, test_set_of, write_jsonl
from .evaluation import evaluate, paired_difference, summarize
from .grpo import GRPOSettings, Reference, grpo_step
from .metrics import MetricsLog
from .model import ModelSettings, load_model
from .optim import make_optimizer
from .policy import Policy
from .prompts import build_prompt, instructions_named, stop_ids
from .rewards import response_text, schedule_from_string, score
from .sampler import SamplerSettings, sample
from .sft import sft_step
from .show import progress, trace_tree

transformers.logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint


class Runner:
    """The stages of one recipe in one run folder: which to run, from what, and how to resume."""

    def __init__(self, config: TrainConfig, stages: list[Stage], console: Console | None = None):
        self.config = config
        self.stages = stages  # the whole recipe (inputs are found by position in it)
        self.out = Path(config.out)
        self.log = MetricsLog(self.out / "metrics.jsonl")
        self.console = console or Console()
        self._problems: dict[str, list[Problem]] = {}  # loaded training sets, by spec
        self._auto_eval: list[str] | None = None  # what --eval-data auto stands for, once worked out
        self.schema = run_schema(config)  # the tags every stage writes and reads

    # --- the loop -------------------------------------------------------------------------------
    def train(self, stage: Stage) -> None:
        """An SFT or GRPO stage: resume or start, step, log, checkpoint, finish with `final/`."""
        config, folder = self.config, self.folder(stage)
        checkpoint = latest_checkpoint(folder)
        model, tokenizer, policy = self.load(str(checkpoint) if checkpoint else self.input_model(stage), stage.mode)
        model.train()
        optimizer, scheduler = make_optimizer(model, stage.lr, config.weight_decay, config.warmup_steps,
                                              config.sft_schedule if stage.kind == "sft" else "constant", stage.steps)
        step = load_trainer_state(checkpoint, optimizer, scheduler) if checkpoint else 0
        if checkpoint:
            self.log.drop_after(stage.name, step)
            self.console.print(f"{stage.name}: resumed from {checkpoint.name}")
        if stage.kind == "sft":
            examples = self.sft_examples(stage, tokenizer)  # (prompt ids, response ids) pairs
        else:
            problems, schedule = self.problems(stage.data), schedule_from_string(stage.reward)
            reference = self.reference(stage, model, resumed=checkpoint is not None)
            settings = self.grpo_settings(stage)

        def save(name: str) -> None:
            save_checkpoint(folder / name, model, tokenizer, optimizer, scheduler, step,
                            vars(config) | {"stage": stage.name})

        with progress(self.console) as bar:
            title = f"{stage.name} ({stage.instructions} prompt, {stage.mode})"
            task = bar.add_task(title, total=stage.steps, completed=step)
            try:
                while step < stage.steps:
                    if stage.kind == "sft":
                        batch = self.batch_of_step(examples, config.sft_batch, stage, step)
                        started = time.perf_counter()
                        metrics = sft_step(model, optimizer, [p for p, _ in batch], [r for _, r in batch], policy,
                                           tokenizer.pad_token_id or 0, config.micro_batch, config.max_grad_norm,
                                           scheduler, config.micro_batch_tokens)
                        metrics["train_seconds"] = time.perf_counter() - started
                    else:
                        batch = self.batch_of_step(problems, config.prompts_per_step, stage, step)
                        prompts = [self.prompt(problem, tokenizer, stage) for problem in batch]
                        sampling = SamplerSettings.from_flags(config, seed=self.sampling_seed(stage, step))
                        rollouts, metrics = grpo_step(model, tokenizer, optimizer, batch, prompts, policy, sampling,
                                                      settings, schedule.spec(step), reference, scheduler)
                        if config.sample_every and (step + 1) % config.sample_every == 0:
                            self.console.print(trace_tree(rollouts[0], tokenizer, title=f"{stage.name} step {step + 1}"))
                    step += 1
                    self.log.write({"stage": stage.name, "step": step, **metrics})
                    bar.update(task, advance=1, description=f"{title} " + _brief(metrics))
                    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < stage.steps:
                        save(f"checkpoint-{step}")
                        prune_checkpoints(folder, config.keep_checkpoints)
            except KeyboardInterrupt:
                save(f"checkpoint-{step}")
                raise SystemExit(f"interrupted: saved {folder / f'checkpoint-{step}'}; the same command resumes")
        save("final")

    def run(self, stage: Stage) -> None:
        """Run a stage unless it is done, then evaluate its model (training stages)."""
        if self.done(stage):
            self.console.print(f"[dim]{stage.name}: done already ({self.folder(stage)}), skipped[/]")
        else:
            self.folder(stage).mkdir(parents=True, exist_ok=True)
            (self.folder(stage) / "eval.json").unlink(missing_ok=True)  # a new model: its old evaluation is stale
            started = time.perf_counter()
            if stage.kind == "distill":
                try:
                    self.distill(stage)
                except KeyboardInterrupt:  # traces.jsonl is written only when the stage ends: nothing half-made
                    raise SystemExit(f"interrupted: {stage.name} kept nothing yet; the same command starts it "
                                     "again") from None
            else:
                self.train(stage)
            self.log.write({"stage": stage.name, "event": "done", "seconds": time.perf_counter() - started})
        if stage.kind != "distill":
            try:
                self.evaluate(stage)
            except KeyboardInterrupt:  # the stage's model is saved; its evaluation is redone on the next run
                raise SystemExit(f"interrupted during the evaluation of {stage.name}: its model is saved in "
                                 f"{self.folder(stage) / 'final'}; the same command evaluates it again") from None

    def distill(self, stage: Stage) -> None:
        """Sample `tries` responses per problem from the stage's teacher (Parallel-R1: --teacher, a
        strong model) or its input model (NPR's rejection: self-distillation); keep one correct,
        valid parallel trace per problem."""
        model, tokenizer, policy = self.load(stage.teacher or self.input_model(stage), stage.mode)
        problems = self.problems(stage.data)[: self.config.distill_problems or None]
        eos, kept = stop_ids(model, tokenizer), []
        chunk = max(1, self.config.prompts_per_step)
        with progress(self.console) as bar:
            task = bar.add_task(stage.name, total=len(problems))
            for start in range(0, len(problems), chunk):
                batch = problems[start : start + chunk]
                prompts = [self.prompt(p, tokenizer, stage) for p in batch]
                sampling = SamplerSettings.from_flags(self.config, seed=self.config.seed + start)
                rollouts = sample(model, prompts, policy, sampling, eos, stage.tries)
                for k, problem in enumerate(batch):
                    for rollout in rollouts[k * stage.tries : (k + 1) * stage.tries]:
                        text = response_text(rollout, tokenizer, eos)
                        # `parallel` is +1 only for a correct answer in a valid parallel trace
                        # (format.check_parallel, in the run's schema): exactly the traces worth keeping
                        if score("parallel", text, rollout.trace, problem).total > 0:
                            kept.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                                         "response": text})
                            break
                bar.update(task, advance=len(batch), description=f"{stage.name} kept {len(kept)}")
        fraction = len(kept) / len(problems)
        self.log.write({"stage": stage.name, "event": "distill", "problems": len(problems), "kept": len(kept),
                        "kept_fraction": fraction})
        self.console.print(f"{stage.name}: kept {len(kept)} of {len(problems)} problems ({fraction:.1%})")
        if not kept:
            fix = ("give ready traces with --sft-data" if self.config.recipe == "parallel-r1" else
                   "NPR distils its own traces: raise --distill-tries or --rl-easy-steps (format RL), or run "
                   "--recipe parallel-r1, whose cold start reads --sft-data")
            raise NanoparError(f"{stage.name}: no correct, valid parallel trace in {len(problems)} problems; "
                               f"the model cannot write them yet: {fix}")
        write_jsonl(self.folder(stage) / "traces.jsonl", kept)

    def evaluate(self, stage: Stage) -> dict | None:
        """Held-out evaluation of a stage's model on each --eval-data set, kept in its eval.json and
        done again only when something that changes what it samples changes (`eval_key`).
        -> {data spec: evaluation.summarize(...)}, or None when --eval-problems is 0."""
        config, out = self.config, self.folder(stage) / "eval.json"
        if not config.eval_problems or not self.eval_sets():
            return None
        how = self.eval_key(stage)
        saved = json.loads(out.read_text()) if out.exists() else {}
        if saved.get("how") == how:
            return saved["results"]
        model, tokenizer, policy = self.load(str(self.folder(stage) / "final"), stage.mode)
        sampling, per_call = SamplerSettings.from_flags(config), self.eval_batch()
        results, started = {}, time.perf_counter()
        with progress(self.console) as bar:
            for spec in self.eval_sets():
                problems = self.eval_problems(spec)
                task = bar.add_task(f"evaluate {stage.name} on {spec}", total=len(problems))
                records = evaluate(model, tokenizer, problems, policy, sampling, config.eval_samples,
                                   instructions_named(stage.instructions, spec, self.schema), config.chat, per_call,
                                   progress=lambda done, task=task: bar.update(task, completed=done))
                results[spec] = summarize(records)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"how": how, "results": results}, indent=1) + "\n")
        self.log.write({"stage": stage.name, "event": "eval", "seconds": time.perf_counter() - started,
                        "results": {spec: {key: value for key, value in result.items() if key != "per_problem"}
                                    for spec, result in results.items()}})  # eval.json keeps the per-problem ones
        return results

    def change_over_start(self, stage: Stage) -> dict[str, tuple[float, float]]:
        """{data spec: (accuracy - that of the stage it started from, standard error)}: held-out
        results compared problem by problem (`evaluation.paired_difference`). {} for a stage that
        starts from the configured --model (it has no evaluation here) or from one not finished."""
        source = starting_stage(self.stages, stage)
        if source is None or source.kind == "distill" or not (self.folder(source) / "final").exists():
            return {}
        before, after = self.evaluate(source) or {}, self.evaluate(stage) or {}
        pairs = {spec: paired_difference(before[spec], after[spec]) for spec in after if spec in before}
        return {spec: pair for spec, pair in pairs.items() if pair is not None}

    def eval_key(self, stage: Stage) -> dict:
        """What decides a held-out evaluation's samples, the key of its eval.json: the sets and
        their fields, every SamplerSettings field, every Policy field the config sets (temperature,
        ...), the stage's prompt and mode, and the batching (each sampler call has its own seed).
        Built from the dataclasses, so a new sampler or policy knob is part of it."""
        config = self.config
        policy = {f.name: getattr(config, f.name) for f in dataclasses.fields(Policy) if hasattr(config, f.name)}
        return {"data": self.eval_sets(), "fields": [config.question_field, config.answer_field],
                "problems": config.eval_problems, "samples": config.eval_samples, "batch": self.eval_batch(),
                "instructions": [instructions_named(stage.instructions, spec, self.schema) for spec in self.eval_sets()],
                "schema": self.schema.name,
                "chat": config.chat, **dataclasses.asdict(SamplerSettings.from_flags(config)), **policy,
                "mode": stage.mode}

    def eval_batch(self) -> int:
        """Problems per sampler call of an evaluation (--eval-batch; sized on its own, not by the
        GRPO step: a small RL step would evaluate two problems at a time)."""
        if self.config.eval_batch < 1:
            raise NanoparError(f"--eval-batch must be >= 1, not {self.config.eval_batch}")
        return self.config.eval_batch

    # --- where things are -------------------------------------------------------------------
    def folder(self, stage: Stage) -> Path:
        return self.out / f"{self.stages.index(stage) + 1}-{stage.name}"

    def done(self, stage: Stage) -> bool:
        return (self.folder(stage) / ("traces.jsonl" if stage.kind == "distill" else "final")).exists()

    def input_model(self, stage: Stage) -> str:
        """The `final/` of the stage `stage.start` names (by default the last training stage before
        it), or the configured model."""
        source = starting_stage(self.stages, stage)
        if source is None:
            return self.config.model
        final = self.folder(source) / "final"
        if not final.exists():
            raise NanoparError(f"stage {stage.name} starts from stage {source.name}, which is not done "
                               f"({final} is missing): run it first, or leave it out with --skip {source.name}")
        return str(final)

    # --- what a stage reads -----------------------------------------------------------------
    def load(self, name: str, mode: str) -> tuple:
        """(model, tokenizer, the Policy it samples and trains with in attention mode `mode`)."""
        config = self.config
        torch.manual_seed(config.seed)  # LoRA's initial A matrices
        model, tokenizer = load_model(ModelSettings(
            name, dtype=config.dtype, device=config.device, load_in_4bit=config.load_in_4bit,
            gradient_checkpointing=config.gradient_checkpointing, lora=config.lora, lora_rank=config.lora_rank,
            lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout), self.schema)
        return model, tokenizer, Policy.for_tokenizer(tokenizer, mode, config.temperature, config.path_stride, self.schema)

    def problems(self, spec: str) -> list[Problem]:
        """A training set (--limit: its first N), less any tail of it an evaluation set holds out:
        with the evaluation set "x.jsonl[-100:]" the run trains on "x.jsonl[:-100]"."""
        if spec not in self._problems:
            config = self.config
            held = max((count for base, count in map(_tail, self.eval_sets()) if base == spec), default=0)
            self._problems[spec] = load_problems(f"{spec}[:-{held}]" if held else spec, config.question_field or None,
                                                 config.answer_field or None, config.limit or None)
            if not self._problems[spec]:
                raise NanoparError(f"no problems in {spec}")
        return self._problems[spec]

    def traces(self, stage: Stage) -> list[dict]:
        """The SFT traces: a distill stage's output, or a data spec (a .jsonl, toy:parallel, ...)."""
        by_name = {s.name: s for s in self.stages}
        spec = str(self.folder(by_name[stage.traces]) / "traces.jsonl") if stage.traces in by_name else stage.traces
        try:
            return load_traces(spec, self.schema)
        except NanoparError as error:  # the same error, saying which stage asked
            raise NanoparError(f"{stage.name}: {error}") from None

    def sft_examples(self, stage: Stage, tokenizer) -> list[tuple[list[int], list[int]]]:
        """The traces as (prompt ids, response ids + EOS) pairs; a record that names its own
        "instructions" (the toy's instruction-following traces) is prompted with them."""
        eos = tokenizer.eos_token_id
        return [(self.prompt(Problem(str(r.get("id", "")), r["question"], r.get("answer", "")), tokenizer, stage,
                             r.get("instructions")),
                 tokenizer.encode(r["response"], add_special_tokens=False) + [eos]) for r in self.traces(stage)]

    def reference(self, stage: Stage, model, resumed: bool) -> Reference | None:
        """The KL reference (--kl-beta > 0): the policy at the start of the stage, also when resuming."""
        if self.config.kl_beta <= 0:
            return None
        values = None
        if resumed:
            start = self.load(self.input_model(stage), stage.mode)[0]
            values = [p.detach().clone() for p in start.parameters() if p.requires_grad]
            del start
        return Reference(model, values)

    def grpo_settings(self, stage: Stage) -> GRPOSettings:
        config = self.config
        return GRPOSettings(group_size=config.group_size, drop_invalid=stage.drop_invalid,
                            advantage=stage.advantage or config.advantage, updates=config.updates, clip=config.clip,
                            kl_beta=config.kl_beta, micro_batch=config.micro_batch,
                            micro_batch_tokens=config.micro_batch_tokens,
                            max_grad_norm=config.max_grad_norm)

    def prompt(self, problem: Problem, tokenizer, stage: Stage, instructions: str | None = None) -> list[int]:
        """The prompt ids of a problem, with the stage's instructions (or the named ones) as the
        stage's data source words them."""
        text = instructions_named(instructions or stage.instructions, stage.data or stage.traces, self.schema)
        return build_prompt(problem, tokenizer, text, chat=self.config.chat)

    def batch_of_step(self, items: list, count: int, stage: Stage, step: int) -> list:
        """The `count` items step `step` trains on: a seeded shuffle per epoch, so a resumed run
        takes the same ones."""
        picked = []
        for position in range(step * count, (step + 1) * count):
            epoch, index = divmod(position, len(items))
            order = list(range(len(items)))
            random.Random(f"{self.config.seed}/{stage.name}/{epoch}").shuffle(order)
            picked.append(items[order[index]])
        return picked

    def sampling_seed(self, stage: Stage, step: int) -> int:
        return random.Random(f"{self.config.seed}/{stage.name}/sample/{step}").randrange(2**31)

    def eval_sets(self) -> list[str]:
        """The --eval-data sets. "auto" follows the run's easy and hard data: the held-out set that
        goes with each (`data.test_set_of`: "toy:easy" -> "toy:easy:heldout", gsm8k_train -> gsm8k),
        else the set's last --eval-problems problems (at most half of it: "x.jsonl[-100:]"), which
        `problems` leaves out of training. Never a problem the run trains on."""
        config = self.config
        if config.eval_data != "auto":
            return [spec.strip() for spec in config.eval_data.split(",") if spec.strip()]
        if self._auto_eval is None:
            self._auto_eval = []
            for spec in dict.fromkeys(s for s in (config.easy_data, config.hard_data) if s and config.eval_problems):
                test_set = test_set_of(spec)
                if test_set is not None:
                    self._auto_eval.append(test_set)
                else:
                    whole = load_problems(spec, config.question_field or None, config.answer_field or None)
                    if len(whole) >= 2:
                        self._auto_eval.append(f"{spec}[-{min(config.eval_problems, len(whole) // 2)}:]")
        return self._auto_eval

    def eval_problems(self, spec: str) -> list[Problem]:
        """The first --eval-problems problems of an evaluation set (a fixed list: every stage sees the same)."""
        config = self.config
        return load_problems(spec, config.question_field or None, config.answer_field or None, config.eval_problems)

    def write_config(self) -> None:
        """<out>/config.json: every flag as resolved, and the stages of the recipe this run holds."""
        save_config(self.config, self.out, extra={"resolved_stages": [dataclasses.asdict(s) for s in self.stages]})

    def validate(self, chosen: list[Stage]) -> None:
        """Fail on a bad setting, reward, data set or traces file before any model loads (not an
        hour in): the sampler's settings and every stage's prompt, mode and reward for the whole
        recipe (a misspelt reward of a later stage too), the data of the stages that will run."""
        SamplerSettings.from_flags(self.config).check()
        self.eval_batch()
        for stage in self.stages:
            instructions_named(stage.instructions)
            Policy(None, stage.mode)  # a known attention mode
            if stage.kind == "grpo":
                schedule_from_string(stage.reward)
        for stage in chosen:
            if stage.kind in ("grpo", "distill"):
                self.problems(stage.data)
            if stage.kind == "sft" and stage.traces not in {s.name for s in self.stages} and not self.traces(stage):
                raise NanoparError(f"{stage.name}: no traces in {stage.traces}")
        for spec in self.eval_sets() if self.config.eval_problems else []:
            self.eval_problems(spec)


def open_run(config: TrainConfig, console: Console | None = None) -> tuple[Runner, list[Stage]]:
    """The run `config` describes, checked and ready: its Runner (over the whole recipe) and the
    stages --stages chooses. "auto" evaluation data and the "" schema are resolved in `config`, so
    the config.json saved from it says what was held out and which tags the checkpoints hold.
    Every input is checked before any model loads (`Runner.validate`)."""
    stages = recipe(config)
    chosen = select(stages, config.stages)
    runner = Runner(config, stages, console)
    config.eval_data = ",".join(runner.eval_sets())
    config.schema = runner.schema.name
    runner.validate(chosen)
    return runner, chosen


def _tail(spec: str) -> tuple[str, int]:
    """"x.jsonl[-100:]" -> ("x.jsonl", 100); a spec that is not a tail -> (spec, 0)."""
    sliced = SLICE.match(spec)
    if sliced and sliced[2].startswith("-") and not sliced[3]:
        return sliced[1], -int(sliced[2])
    return spec, 0


def _brief(metrics: dict) -> str:
    """A few numbers for the progress line."""
    keys = ("reward", "accuracy", "parallel_ratio", "loss")
    return " ".join(f"{k.split('_')[0]}={metrics[k]:.2f}" for k in keys if isinstance(metrics.get(k), float))
