"""Running the stages of a curriculum: folders, input models, resume, the step loop, evaluation.

    runs/default/            the run folder (--out)
      config.json            the resolved TrainConfig
      metrics.jsonl          one line per step of every stage, and one per evaluation
      metrics.png, results.md  the plot and the final table (train.py writes them at the end)
      0-model/               with --eval-model: the configured model's eval.json
      1-pretrain/            checkpoint-<step>/ while it runs, final/ and eval.json when done
      2-sft/ 3-rl-easy/ 4-rl-hard/   the default recipe's other stages, alike
      <n>-<name>/traces.jsonl  a distill stage (--sft-data "": cold-start-data; NPR's rejection) writes
                             traces, not a model

A stage whose `final/` (or `traces.jsonl`) exists is done and skipped, and a stage with checkpoints
resumes from the latest, when the command would train it the same way (else `open_run` refuses
the folder, run_folder.py): model, optimiser, scheduler and RNG states, and the step. A training
stage's loop is resume -> step -> log -> checkpoint, its step chosen before it: one SFT or GRPO
step with the data of that step (`StageSteps`, stage_steps.py), seeded from (seed, stage, step),
so a resumed run repeats exactly what the interrupted one would have done. Ctrl-C saves a
checkpoint first. Under torchrun every process runs this loop on its share of each step
(distributed.py) and rank 0 alone writes the folders, the log and the checkpoints; every process
resumes from the same checkpoint. `open_run` makes a checked Runner from a resolved config.
Not here: the stage lists (curriculum.py), what a run reads and checking it (run_inputs.py), what
a step takes (stage_steps.py), held-out evaluation (heldout.py), the final table (results.py,
show.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console

from . import NanoparError, distributed
from .checkpoint import copy_model_folder, latest_checkpoint, load_trainer_state, prune_checkpoints, save_checkpoint
from .config import save_config
from .curriculum import Stage, TrainConfig, recipe, select, stage_folder, starting_stage
from .data import write_jsonl
from .distill import BUDGET_CUTS, keep_traces, nothing_kept
from .heldout import HeldOut, forget_evaluation
from .metrics import MetricsLog
from .model import load_with_policy
from .optim import loss_scaler, make_optimizer
from .out_of_memory import EVALUATION, SAMPLING, advice, said
from .prompts import stop_ids
from .run_folder import check_out, check_reuse
from .run_inputs import RunInputs
from .sampler import SamplerSettings
from .show import progress
from .stage_steps import ROLLOUTS, StageSteps
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
        self.inputs = RunInputs(config, stages, self.schema)  # problems, traces, prompts
        self.steps = StageSteps(config, stages, self.inputs, self.log, self.console)  # a training stage's steps
        self.heldout = HeldOut(config, stages, self.inputs, self.log, self.console)  # each stage's model evaluated

    # --- the loop -------------------------------------------------------------------------------
    def train(self, stage: Stage) -> None:
        """An SFT or GRPO stage: resume or start, step, log, checkpoint, finish with `final/`."""
        config, folder = self.config, self.folder(stage)
        checkpoint = latest_checkpoint(folder)
        model, tokenizer, policy = load_with_policy(config, str(checkpoint) if checkpoint else self.input_model(stage),
                                                    stage.mode, self.schema)
        model.train()
        # The tag rows' own rate serves the stages that teach the tags (SFT); GRPO moves them at its rate:
        # AdamW moves every entry by ~lr a step whatever the signal, and on SmolLM2 a GRPO stage with the
        # rows at 10x undid much of the cold start's format (docs/real-checkpoint.md)
        optimizer, scheduler = make_optimizer(model, stage.lr, config.weight_decay, config.warmup_steps,
                                              config.sft_schedule if stage.kind == "sft" else "constant", stage.steps,
                                              config.tag_lr_scale if stage.kind == "sft" else 1.0)
        scaler = loss_scaler(model)  # float16 only (a T4, V100): None in float32 and bfloat16
        step = load_trainer_state(checkpoint, optimizer, scheduler, scaler) if checkpoint else 0
        self.log.drop_after(stage.name, step)  # lines written after the checkpoint (or by a start killed before one)
        MetricsLog(folder / ROLLOUTS).drop_after(stage.name, step)  # likewise the saved rollouts (--save-rollouts)
        if checkpoint:
            self.console.print(f"{stage.name}: resumed from {checkpoint.name}")
        if stage.kind == "sft":
            one_step = self.steps.sft(stage, model, tokenizer, policy, optimizer, scheduler, scaler)
        else:  # its pool and KL reference come from the stage's starting model, also when it resumes
            one_step = self.steps.grpo(stage, model, tokenizer, policy, optimizer, scheduler, scaler,
                                       start=lambda: self.input_model(stage), resumed=checkpoint is not None)

        def save(name: str) -> None:  # under torchrun rank 0 writes: every process holds the same state
            if distributed.is_main():
                save_checkpoint(folder / name, model, tokenizer, optimizer, scheduler, step,
                                vars(config) | {"stage": stage.name, "mode": stage.mode,  # the mode and prompt
                                                "instructions": stage.instructions}, scaler)  # it was trained with

        with progress(self.console) as bar:
            title = f"{stage.name} ({stage.instructions} prompt, {stage.mode})"
            task = bar.add_task(title, total=stage.steps, completed=step)
            try:
                while step < stage.steps:
                    communicated = distributed.seconds_communicating()
                    metrics = one_step(step)
                    step += 1
                    if distributed.active():  # time inside collectives this step (transfer + waiting)
                        metrics["communication_seconds"] = distributed.seconds_communicating() - communicated
                    self.log.write({"stage": stage.name, "step": step, **metrics})
                    if metrics.get("skipped_step"):  # counted in metrics.jsonl too (skipped_step: true)
                        self.console.print(f"{stage.name} step {step}: gradient norm {metrics['grad_norm']}, "
                                           "not finite: the step was skipped" + (
                                               " (the loss scaler lowers its factor)" if scaler else ""))
                    bar.update(task, advance=1, description=f"{title} " + _brief(metrics))
                    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < stage.steps:
                        save(f"checkpoint-{step}")
                        prune_checkpoints(folder, config.keep_checkpoints)
            except torch.OutOfMemoryError as error:  # the step's state is half-made: the last checkpoint resumes
                last = latest_checkpoint(folder)
                raise NanoparError(advice(error, f"{stage.name}, step {step + 1}", config,
                                          str(last) if last else f"the start of {stage.name}")) from None
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
                forget_evaluation(self.folder(stage))  # a new model: its old evaluation is stale
            started = time.perf_counter()
            if stage.kind == "distill":
                try:
                    self.distill(stage)
                except KeyboardInterrupt:  # traces.jsonl is written only when the stage ends: nothing half-made
                    raise SystemExit(f"interrupted: {stage.name} kept nothing yet; the same command starts it "
                                     "again") from None
                except torch.OutOfMemoryError as error:
                    raise NanoparError(said(error, f"in {stage.name}", SAMPLING, "it kept nothing yet; fewer problems "
                                            "a sampler call (--prompts-per-step) or --max-new-tokens fit it")) from None
            elif stage.shipped:
                self.copy_shipped(stage)
            else:
                self.train(stage)
            self.log.write({"stage": stage.name, "event": "done", "seconds": time.perf_counter() - started})
        if stage.kind != "distill":
            self.evaluate(stage)

    def evaluate(self, stage: Stage) -> None:
        """The held-out evaluation of a stage's model (or of the configured model, `0-model`), an
        out-of-memory error or Ctrl-C said in one line: the model is saved, the same command redoes it."""
        try:
            self.heldout.evaluate(stage)
        except torch.OutOfMemoryError as error:
            raise NanoparError(advice(error, stage.name, self.config, default=EVALUATION)) from None
        except KeyboardInterrupt:  # the stage's model is saved; its evaluation is redone on the next run
            final = self.folder(stage) / "final"
            saved = f"its model is saved in {final}; " if final.exists() else ""
            raise SystemExit(f"interrupted during the evaluation of {stage.name}: {saved}the same command "
                             "evaluates it again") from None

    def copy_shipped(self, stage: Stage) -> None:
        """A stage whose result ships with nanopar (the toy's pretrained bases): its folder becomes
        the stage's final/, whole or not at all (`checkpoint.copy_model_folder`). An eval.json
        shipped beside the model (its held-out evaluation at the defaults) becomes the stage's:
        `HeldOut.evaluate` reuses it only where its key matches the run's settings."""
        evaluation = Path(stage.shipped) / "eval.json"
        if distributed.is_main():  # under torchrun rank 0 copies, the others wait for it
            copy_model_folder(stage.shipped, self.folder(stage) / "final", leave_out="eval.json")
            forget_evaluation(self.folder(stage))  # another model's, if any: the shipped one's comes next
            if evaluation.exists():
                shutil.copyfile(evaluation, self.folder(stage) / "eval.json")
        distributed.barrier("waiting for rank 0 to copy the shipped base")
        self.log.write({"stage": stage.name, "event": "shipped", "from": stage.shipped})
        with_evaluation = ", with its held-out evaluation at the default settings" if evaluation.exists() else ""
        self.console.print(f"{stage.name}: copied the pretrained base {stage.shipped}, not trained here "
                           f"(--pretrained-base '' pretrains it){with_evaluation}", highlight=False)

    def distill(self, stage: Stage) -> None:
        """Sample `tries` responses per problem from the stage's teacher (Parallel-R1: --teacher, a
        strong model) or its input model (NPR's rejection: self-distillation); keep one correct trace
        per problem that passes the stage's filter (`stage.keep`: Parallel-R1's a valid parallel
        trace; NPR's its format, a round of one plan too)."""
        config = self.config
        model, tokenizer, policy = load_with_policy(config, stage.teacher or self.input_model(stage), stage.mode,
                                                    self.schema)
        problems = self.inputs.problems(stage.data)[: config.distill_problems or None]
        prompts = [self.inputs.prompt(problem, tokenizer, stage) for problem in problems]
        with progress(self.console) as bar:
            task = bar.add_task(stage.name, total=len(problems))
            distilled = keep_traces(model, tokenizer, policy, problems, prompts, SamplerSettings.from_flags(config),
                                    stop_ids(model, tokenizer), stage.tries, max(1, config.prompts_per_step),
                                    stage.keep, done=lambda seen, n: bar.update(task, completed=seen,
                                                                                description=f"{stage.name} kept {n}"))
        kept, fraction = distilled.records, len(distilled.records) / len(problems)
        self.log.write({"stage": stage.name, "event": "distill", "problems": len(problems), "kept": len(kept),
                        "kept_fraction": fraction, "dropped_cut": distilled.dropped, "cuts": distilled.cuts})
        cuts = ", ".join(f"{BUDGET_CUTS[name]}: {n}" for name, n in distilled.cuts.items() if n)
        self.console.print(f"{stage.name}: kept {len(kept)} of {len(problems)} problems ({fraction:.1%}); dropped "
                           f"{distilled.dropped} tries the filter kept that the sampler's budgets cut"
                           + (f" ({cuts})" if cuts else ""))
        if not kept:
            raise NanoparError(nothing_kept(stage, len(problems), config.recipe))
        if distributed.is_main():  # every process holds them all (keep_traces gathers)
            write_jsonl(self.folder(stage) / "traces.jsonl", kept)
        distributed.barrier("waiting for rank 0 to write the traces")

    # --- where things are -------------------------------------------------------------------
    def folder(self, stage: Stage) -> Path:
        return stage_folder(self.out, self.stages, stage)

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

    def write_config(self, resolved: dict | None = None) -> None:
        """<out>/config.json: every flag as resolved, what `defaults.resolve` changed, and the
        stages of the recipe this run holds. Rank 0 writes it under torchrun."""
        if not distributed.is_main():
            return
        save_config(self.config, self.out, extra={"resolved_by_defaults": resolved or {},
                                                  "resolved_stages": [dataclasses.asdict(s) for s in self.stages]})


def open_run(config: TrainConfig, console: Console | None = None) -> tuple[Runner, list[Stage]]:
    """The run a resolved `config` describes, checked and ready: its Runner (over the whole
    recipe) and the stages --stages chooses. Every input is checked before any model loads
    (`RunInputs.check`)."""
    stages = recipe(config)
    chosen = select(stages, config.stages)
    if config.filter_groups and distributed.active():
        raise NanoparError("--filter-groups runs in one process only: under torchrun each process would draw "
                           "its own extra prompts and hold a different number of groups; leave it out there")
    runner = Runner(config, stages, console)
    for note in runner.inputs.check(chosen):  # how many traces are parallel where they should be
        runner.console.print(note, markup=False, highlight=False, soft_wrap=True)
    check_out(config)  # never into the folder of the run that made the input model
    restarted = check_reuse(config, stages, runner.log)  # a folder trained otherwise: refused
    if restarted:
        runner.console.print(f"--restart: deleted {', '.join(restarted)} of {config.out}; they train again")
    return runner, chosen


def _brief(metrics: dict) -> str:
    """A few numbers for the progress line.

    >>> _brief({"reward": -0.5, "accuracy": 0.25, "draws": 2, "groups_trained": 8, "groups_sampled": 16})
    'reward=-0.50 accuracy=0.25 groups=8/16'
    """
    keys = ("reward", "accuracy", "parallel_ratio", "loss")
    brief = " ".join(f"{k.split('_')[0]}={metrics[k]:.2f}" for k in keys if isinstance(metrics.get(k), float))
    if "draws" in metrics:  # --filter-groups: groups trained of those sampled
        brief += f" groups={metrics['groups_trained']}/{metrics['groups_sampled']}"
    return brief
