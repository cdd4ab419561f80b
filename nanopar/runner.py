"""Running the stages of a curriculum: folders, input models, resume, the step loop, evaluation.

    run/
      config.json            the resolved TrainConfig
      metrics.jsonl          one line per step of every stage
      1-pretrain/            checkpoint-<step>/ while it runs, final/ and eval.json when done
      2-cold-start-data/     traces.jsonl (a distill stage writes traces, not a model)
      3-sft/ ...

A stage whose `final/` (or `traces.jsonl`) exists is done and skipped, and a stage with checkpoints
resumes from the latest, when the command would train it the same way (else `open_run` refuses
the folder, run_folder.py): model, optimiser, scheduler and RNG states, and the step. Everything a
step draws is seeded from (seed, stage, step), so a resumed run repeats exactly what the
interrupted one would have done. Ctrl-C saves a checkpoint first. Under torchrun every process
runs this loop on its share of each step (distributed.py) and rank 0 alone writes the folders,
the log and the checkpoints; every process resumes from the same checkpoint. One GRPO step is
`grpo.grpo_step`, one SFT step `sft.sft_step`; `open_run` makes a checked Runner from a resolved
config, refusing a folder whose stages were trained with other settings (run_folder.py). Not here: the stage lists (curriculum.py), what a run reads (run_inputs.py), held-out
evaluation (heldout.py), the final table (show.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console

from . import NanoparError, distributed
from .checkpoint import latest_checkpoint, load_trainer_state, prune_checkpoints, save_checkpoint
from .config import save_config
from .curriculum import Stage, TrainConfig, recipe, select, starting_stage
from .data import write_jsonl
from .distill import KEEP, keep_traces
from .forward import head_read_for
from .grpo import GRPOSettings, Reference, grpo_step
from .heldout import HeldOut
from .metrics import MetricsLog
from .model import ModelSettings, load_model
from .optim import make_optimizer
from .policy import Policy
from .prompts import instructions_named, stop_ids
from .rewards import schedule_from_string
from .run_folder import check_reuse
from .run_inputs import RunInputs
from .sampler import SamplerSettings
from .sft import sft_step
from .show import progress, trace_tree
from .tags import schema_named

transformers.logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint


class Runner:
    """The stages of one recipe in one run folder: which to run, from what, and how to resume."""

    def __init__(self, config: TrainConfig, stages: list[Stage], console: Console | None = None):
        self.config = config
        self.stages = stages  # the whole recipe (inputs are found by position in it)
        self.out = Path(config.out)
        self.log = MetricsLog(self.out / "metrics.jsonl")
        self.console = console or Console()
        self.schema = schema_named(config.schema)  # the tags every stage writes and reads
        self.inputs = RunInputs(config, stages, self.schema, self.folder)  # problems, traces, prompts
        self.heldout = HeldOut(self)  # held-out evaluation of each stage's model

    # --- the loop -------------------------------------------------------------------------------
    def train(self, stage: Stage) -> None:
        """An SFT or GRPO stage: resume or start, step, log, checkpoint, finish with `final/`."""
        config, folder = self.config, self.folder(stage)
        checkpoint = latest_checkpoint(folder)
        model, tokenizer, policy = self.load(str(checkpoint) if checkpoint else self.input_model(stage), stage.mode)
        model.train()
        # The tag rows' own rate serves the stages that teach the tags (SFT); GRPO moves them at its rate:
        # AdamW moves every entry by ~lr a step whatever the signal, and on SmolLM2 a GRPO stage with the
        # rows at 10x undid much of the cold start's format (docs/real-checkpoint.md)
        optimizer, scheduler = make_optimizer(model, stage.lr, config.weight_decay, config.warmup_steps,
                                              config.sft_schedule if stage.kind == "sft" else "constant", stage.steps,
                                              config.tag_lr_scale if stage.kind == "sft" else 1.0)
        step = load_trainer_state(checkpoint, optimizer, scheduler) if checkpoint else 0
        if checkpoint:
            self.log.drop_after(stage.name, step)
            self.console.print(f"{stage.name}: resumed from {checkpoint.name}")
        if stage.kind == "sft":
            examples = self.inputs.sft_examples(stage, tokenizer)  # (prompt ids, response ids) pairs
        else:
            problems, schedule = self.inputs.problems(stage.data), schedule_from_string(stage.reward)
            reference = self.reference(stage, model, resumed=checkpoint is not None)
            settings = self.grpo_settings(stage)

        def save(name: str) -> None:  # under torchrun rank 0 writes: every process holds the same state
            if distributed.is_main():
                save_checkpoint(folder / name, model, tokenizer, optimizer, scheduler, step,
                                vars(config) | {"stage": stage.name, "mode": stage.mode,  # the mode and prompt
                                                "instructions": stage.instructions})  # it was trained with

        with progress(self.console) as bar:
            title = f"{stage.name} ({stage.instructions} prompt, {stage.mode})"
            task = bar.add_task(title, total=stage.steps, completed=step)
            try:
                while step < stage.steps:
                    communicated = distributed.seconds_communicating()
                    if stage.kind == "sft":  # under torchrun each process trains its share of the batch
                        batch = distributed.share(self.inputs.batch_of_step(examples, config.sft_batch, stage, step))
                        started = time.perf_counter()
                        metrics = sft_step(model, optimizer, [p for p, _ in batch], [r for _, r in batch], policy,
                                           tokenizer.pad_token_id or 0, config.micro_batch, config.max_grad_norm,
                                           scheduler, config.micro_batch_tokens, head_read=config.head_read)
                        metrics["train_seconds"] = time.perf_counter() - started
                    else:
                        batch = distributed.share(self.inputs.batch_of_step(problems, config.prompts_per_step, stage,
                                                                            step))  # whole groups per process
                        prompts = [self.inputs.prompt(problem, tokenizer, stage) for problem in batch]
                        sampling = SamplerSettings.from_flags(config, seed=self.sampling_seed(stage, step))
                        rollouts, metrics = grpo_step(model, tokenizer, optimizer, batch, prompts, policy, sampling,
                                                      settings, schedule.spec(step), reference, scheduler)
                        if config.sample_every and (step + 1) % config.sample_every == 0:
                            self.console.print(trace_tree(rollouts[0], tokenizer, title=f"{stage.name} step {step + 1}"))
                    step += 1
                    if distributed.active():  # time inside collectives this step (transfer + waiting)
                        metrics["communication_seconds"] = distributed.seconds_communicating() - communicated
                    self.log.write({"stage": stage.name, "step": step, **metrics})
                    bar.update(task, advance=1, description=f"{title} " + _brief(metrics))
                    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < stage.steps:
                        save(f"checkpoint-{step}")
                        prune_checkpoints(folder, config.keep_checkpoints)
            except KeyboardInterrupt:
                save(f"checkpoint-{step}")
                raise SystemExit(f"interrupted: saved {folder / f'checkpoint-{step}'}; the same command resumes")
        save("final")
        distributed.barrier("waiting for rank 0 to save the stage's model")  # the next stage loads it on every process

    def run(self, stage: Stage) -> None:
        """Run a stage unless it is done, then evaluate its model (training stages)."""
        done = self.done(stage)
        distributed.barrier("waiting for every process to look at the stage")  # before rank 0 writes in it
        if done:
            self.console.print(f"[dim]{stage.name}: done already ({self.folder(stage)}), skipped[/]")
        else:
            self.folder(stage).mkdir(parents=True, exist_ok=True)
            if distributed.is_main():
                (self.folder(stage) / "eval.json").unlink(missing_ok=True)  # a new model: its old evaluation is stale
            started = time.perf_counter()
            if stage.kind == "distill":
                try:
                    self.distill(stage)
                except KeyboardInterrupt:  # traces.jsonl is written only when the stage ends: nothing half-made
                    raise SystemExit(f"interrupted: {stage.name} kept nothing yet; the same command starts it "
                                     "again") from None
            elif stage.shipped:
                self.copy_shipped(stage)
            else:
                self.train(stage)
            self.log.write({"stage": stage.name, "event": "done", "seconds": time.perf_counter() - started})
        if stage.kind != "distill":
            try:
                self.heldout.evaluate(stage)
            except KeyboardInterrupt:  # the stage's model is saved; its evaluation is redone on the next run
                raise SystemExit(f"interrupted during the evaluation of {stage.name}: its model is saved in "
                                 f"{self.folder(stage) / 'final'}; the same command evaluates it again") from None

    def copy_shipped(self, stage: Stage) -> None:
        """A stage whose result ships with nanopar (the toy's pretrained bases): its folder becomes
        the stage's final/, copied whole under a temporary name first (as a checkpoint is). An
        eval.json shipped beside the model (its held-out evaluation at the defaults) becomes the
        stage's: `HeldOut.evaluate` reuses it only where its key matches the run's settings."""
        final = self.folder(stage) / "final"
        evaluation = Path(stage.shipped) / "eval.json"
        if distributed.is_main():  # under torchrun rank 0 copies, the others wait for it
            temporary = final.with_name(".final.incomplete")
            shutil.rmtree(temporary, ignore_errors=True)
            shutil.copytree(stage.shipped, temporary, ignore=shutil.ignore_patterns("eval.json"))
            os.replace(temporary, final)
            if evaluation.exists():
                shutil.copyfile(evaluation, self.folder(stage) / "eval.json")
        distributed.barrier("waiting for rank 0 to copy the shipped base")
        self.log.write({"stage": stage.name, "event": "shipped", "from": stage.shipped})
        self.console.print(f"{stage.name}: copied the pretrained base {stage.shipped}, not trained here "
                           "(--pretrained-base '' pretrains it)" + (", with its held-out evaluation at the default "
                                                                    "settings" if evaluation.exists() else ""),
                           highlight=False)

    def distill(self, stage: Stage) -> None:
        """Sample `tries` responses per problem from the stage's teacher (Parallel-R1: --teacher, a
        strong model) or its input model (NPR's rejection: self-distillation); keep one correct trace
        per problem that passes the stage's filter (`stage.keep`: Parallel-R1's a valid parallel
        trace; NPR's its format, a round of one plan too)."""
        model, tokenizer, policy = self.load(stage.teacher or self.input_model(stage), stage.mode)
        problems = self.inputs.problems(stage.data)[: self.config.distill_problems or None]
        with progress(self.console) as bar:
            task = bar.add_task(stage.name, total=len(problems))
            kept = keep_traces(model, tokenizer, policy, problems, lambda p: self.inputs.prompt(p, tokenizer, stage),
                               lambda start: SamplerSettings.from_flags(self.config, seed=self.config.seed + start),
                               stop_ids(model, tokenizer), stage.tries, max(1, self.config.prompts_per_step),
                               done=lambda seen, n: bar.update(task, completed=seen,
                                                               description=f"{stage.name} kept {n}"),
                               keep=stage.keep)
        fraction = len(kept) / len(problems)
        self.log.write({"stage": stage.name, "event": "distill", "problems": len(problems), "kept": len(kept),
                        "kept_fraction": fraction})
        self.console.print(f"{stage.name}: kept {len(kept)} of {len(problems)} problems ({fraction:.1%})")
        if not kept:
            fix = ("give ready traces with --sft-data" if self.config.recipe == "parallel-r1" else
                   "NPR distils its own traces, so it needs a model that follows its format some of the time "
                   "(an instruct model prompted with it): raise --distill-tries or --rl-easy-steps (format RL), "
                   "or run --recipe parallel-r1, whose cold start reads --sft-data")
            raise NanoparError(f"{stage.name}: no {KEEP[stage.keep]} in {len(problems)} problems; "
                               f"the model cannot write them yet: {fix}")
        if distributed.is_main():  # every process holds them all (keep_traces gathers)
            write_jsonl(self.folder(stage) / "traces.jsonl", kept)
        distributed.barrier("waiting for rank 0 to write the traces")

    # --- where things are -------------------------------------------------------------------
    def folder(self, stage: Stage) -> Path:
        if stage.kind == "given":  # the configured --model: its evaluation only
            return self.out / f"0-{stage.name}"
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
                            advantage=stage.advantage, updates=config.updates, clip=config.clip,
                            kl_beta=config.kl_beta, micro_batch=config.micro_batch,
                            micro_batch_tokens=config.micro_batch_tokens,
                            max_grad_norm=config.max_grad_norm, head_read=config.head_read)

    def sampling_seed(self, stage: Stage, step: int) -> int:
        """The seed of a GRPO step's sampling: one stream per process under torchrun (rank r > 0
        adds "/rank-r"; rank 0's is the single process's), so a run repeats for a given N."""
        rank = distributed.rank()
        return random.Random(f"{self.config.seed}/{stage.name}/sample/{step}" + (f"/rank-{rank}" if rank else "")
                             ).randrange(2**31)

    def write_config(self, resolved: dict | None = None) -> None:
        """<out>/config.json: every flag as resolved, what `defaults.resolve` changed, and the
        stages of the recipe this run holds. Rank 0 writes it under torchrun."""
        if not distributed.is_main():
            return
        save_config(self.config, self.out, extra={"resolved_by_defaults": resolved or {},
                                                  "resolved_stages": [dataclasses.asdict(s) for s in self.stages]})

    def validate(self, chosen: list[Stage]) -> None:
        """Fail on a bad setting, reward, data set or traces file before any model loads (not an
        hour in): the sampler's settings and every stage's prompt, mode and reward for the whole
        recipe (a misspelt reward of a later stage too), the data of the stages that will run."""
        SamplerSettings.from_flags(self.config).check()
        if self.config.eval_batch < 1:
            raise NanoparError(f"--eval-batch must be >= 1, not {self.config.eval_batch}")
        kinds = {stage.kind for stage in chosen if not stage.shipped}
        if "grpo" in kinds:  # torchrun: every process samples whole groups, the same number of them
            distributed.check_divides(self.config.prompts_per_step, "--prompts-per-step")
        if "sft" in kinds:
            distributed.check_divides(self.config.sft_batch, "--sft-batch")
        head_read_for(self.config.head_read, 0)  # a known training read
        for stage in self.stages:
            instructions_named(stage.instructions)
            Policy(None, stage.mode)  # a known attention mode
            if stage.kind == "grpo":
                schedule_from_string(stage.reward)
        for stage in chosen:
            if stage.shipped and not (Path(stage.shipped) / "config.json").is_file():
                raise NanoparError(f"--pretrained-base {stage.shipped}: not a model folder (no config.json); "
                                   "give a stage's final/ folder, or '' to pretrain here")
            if stage.kind in ("grpo", "distill"):
                self.inputs.problems(stage.data)
            if stage.kind == "sft" and stage.traces not in {s.name for s in self.stages}:
                note = self.inputs.check_traces(stage)  # how many are parallel where they should be
                if note:
                    self.console.print(note, markup=False, highlight=False, soft_wrap=True)
        for spec in self.inputs.eval_sets() if self.config.eval_problems else []:
            self.inputs.eval_problems(spec)


def open_run(config: TrainConfig, console: Console | None = None) -> tuple[Runner, list[Stage]]:
    """The run a resolved `config` describes, checked and ready: its Runner (over the whole
    recipe) and the stages --stages chooses. Every input is checked before any model loads
    (`Runner.validate`)."""
    stages = recipe(config)
    chosen = select(stages, config.stages)
    runner = Runner(config, stages, console)
    runner.validate(chosen)
    restarted = check_reuse(config, stages, runner.folder, runner.log)  # a folder trained otherwise: refused
    if restarted:
        runner.console.print(f"--restart: deleted {', '.join(restarted)} of {config.out}; they train again")
    return runner, chosen


def _brief(metrics: dict) -> str:
    """A few numbers for the progress line."""
    keys = ("reward", "accuracy", "parallel_ratio", "loss")
    return " ".join(f"{k.split('_')[0]}={metrics[k]:.2f}" for k in keys if isinstance(metrics.get(k), float))
