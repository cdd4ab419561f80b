"""Running one stage of a curriculum: its input model, resume, the step loop, checkpoints.

    run/
      config.json            the resolved TrainConfig
      metrics.jsonl          one line per step of every stage
      1-cold-start-data/     traces.jsonl (a distill stage writes traces, not a model)
      2-sft/                 checkpoint-<step>/ while it runs, final/ when done
      3-rl-easy/ ...

A stage whose `final/` (or `traces.jsonl`) exists is done and skipped; a stage with checkpoints
resumes from the latest: model, optimiser, scheduler and RNG states, and the step. Everything a
step draws is seeded from (seed, stage, step) — the problems it takes, the sampler's seed — so a
resumed run repeats exactly what the interrupted one would have done. Ctrl-C saves a checkpoint
first. Not here: the stage lists (curriculum.py), the flags (train.py).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console

from . import NanoparError
from .checkpoint import latest_checkpoint, load_trainer_state, prune_checkpoints, save_checkpoint
from .curriculum import Stage
from .data import Problem, load_problems, read_jsonl, write_jsonl
from .evaluation import evaluate, summarize
from .grpo import GRPOSettings, Reference, group_advantages, grpo_update
from .metrics import MetricsLog, rollout_metrics
from .model import ModelSettings, load_model
from .optim import make_optimizer
from .prompts import build_prompt, instructions_named, stop_ids
from .rewards import response_text, schedule_from_string, score
from .sampler import SamplerSettings, sample
from .sft import sft_step
from .show import progress, trace_tree
from .tags import TagIds

transformers.logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint


class Runner:
    def __init__(self, config, stages: list[Stage], console: Console | None = None):
        self.c = config
        self.stages = stages  # the whole recipe (inputs are found by position in it)
        self.out = Path(config.out)
        self.log = MetricsLog(self.out / "metrics.jsonl")
        self.console = console or Console()
        self.instructions = instructions_named(config.instructions)
        self._problems: dict[str, list[Problem]] = {}  # loaded data sets, by spec

    # --- where things are -------------------------------------------------------------------
    def folder(self, stage: Stage) -> Path:
        return self.out / f"{self.stages.index(stage) + 1}-{stage.name}"

    def done(self, stage: Stage) -> bool:
        return (self.folder(stage) / ("traces.jsonl" if stage.kind == "distill" else "final")).exists()

    def input_model(self, stage: Stage) -> str:
        """The `final/` of the stage `stage.start` names (by default the last training stage before
        it), or the configured model."""
        if stage.start is None:
            before = [s for s in self.stages[: self.stages.index(stage)] if s.kind != "distill"]
            source = before[-1] if before else None
        else:
            source = next((s for s in self.stages if s.name == stage.start), None) if stage.start else None
        if source is None:
            return self.c.model
        final = self.folder(source) / "final"
        if not final.exists():
            raise NanoparError(f"stage {stage.name} starts from stage {source.name}, which is not done "
                               f"({final} is missing): run it first")
        return str(final)

    def load(self, name: str):
        c = self.c
        torch.manual_seed(c.seed)  # LoRA's initial A matrices
        model, tokenizer = load_model(ModelSettings(
            name, dtype=c.dtype, device=c.device, load_in_4bit=c.load_in_4bit, lora=c.lora,
            lora_rank=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout))
        return model, tokenizer, TagIds.from_tokenizer(tokenizer)

    def problems(self, spec: str) -> list[Problem]:
        if spec not in self._problems:
            self._problems[spec] = load_problems(spec, self.c.question_field or None, self.c.answer_field or None,
                                                 self.c.limit or None)
            if not self._problems[spec]:
                raise NanoparError(f"no problems in {spec}")
        return self._problems[spec]

    def validate(self, stages: list[Stage]) -> None:
        """Fail on a bad reward, data set or traces file before any stage runs (not an hour in)."""
        for stage in stages:
            if stage.kind == "grpo":
                schedule_from_string(stage.reward)
            if stage.kind in ("grpo", "distill"):
                self.problems(stage.data)
            if stage.kind == "sft" and stage.traces not in {s.name for s in self.stages}:
                self.traces(stage)
        for spec in self.eval_sets() if self.c.eval_problems else []:
            self.eval_problems(spec)

    def prompt(self, problem: Problem, tokenizer) -> list[int]:
        return build_prompt(problem, tokenizer, self.instructions, chat=self.c.chat)

    def take(self, items: list, step: int, count: int, stage: Stage) -> list:
        """The `count` items of a step: a seeded shuffle per epoch, so any step can be recomputed."""
        picked = []
        for position in range(step * count, (step + 1) * count):
            epoch, index = divmod(position, len(items))
            order = list(range(len(items)))
            random.Random(f"{self.c.seed}/{stage.name}/{epoch}").shuffle(order)
            picked.append(items[order[index]])
        return picked

    # --- running ------------------------------------------------------------------------------
    def run(self, stage: Stage) -> None:
        if self.done(stage):
            self.console.print(f"[dim]{stage.name}: done already ({self.folder(stage)}), skipped[/]")
        else:
            self.folder(stage).mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            {"distill": self.distill, "sft": self.train, "grpo": self.train}[stage.kind](stage)
            self.log.write({"stage": stage.name, "event": "done", "seconds": time.perf_counter() - started})
        if stage.kind != "distill":
            self.evaluate(stage.name, self.folder(stage) / "final", self.folder(stage) / "eval.json")

    def evaluate(self, name: str, model_name: str | Path, out: Path) -> dict | None:
        """Held-out evaluation of a stage's model on each --eval-data set, kept in `out` and done
        again only when the evaluation flags change. -> {data spec: evaluation.summarize(...)},
        or None when --eval-problems is 0."""
        c = self.c
        if not c.eval_problems or not c.eval_data:
            return None
        how = {"data": self.eval_sets(), "problems": c.eval_problems, "samples": c.eval_samples,
               "temperature": c.temperature, "seed": c.seed, "paths": c.paths, "max_new_tokens": c.max_new_tokens}
        saved = json.loads(out.read_text()) if out.exists() else {}
        if saved.get("how") == how:
            return saved["results"]
        model, tokenizer, tags = self.load(str(model_name))
        settings = self.sampler_settings(seed=c.seed)
        per_call = max(1, c.prompts_per_step * c.group_size // c.eval_samples)  # a GRPO step's responses
        results, started = {}, time.perf_counter()
        with self.progress() as bar:
            for spec in self.eval_sets():
                problems = self.eval_problems(spec)
                task = bar.add_task(f"evaluate {name} on {spec}", total=len(problems))
                records = evaluate(model, tokenizer, problems, settings, c.eval_samples, self.instructions, c.chat,
                                   per_call, progress=lambda done, task=task: bar.update(task, completed=done))
                results[spec] = summarize(records)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"how": how, "results": results}, indent=1) + "\n")
        self.log.write({"stage": name, "event": "eval", "seconds": time.perf_counter() - started, "results": results})
        return results

    def eval_sets(self) -> list[str]:
        return [spec.strip() for spec in self.c.eval_data.split(",") if spec.strip()]

    def eval_problems(self, spec: str) -> list[Problem]:
        """The first --eval-problems problems of an evaluation set (a fixed list: every stage sees the same)."""
        return load_problems(spec, self.c.question_field or None, self.c.answer_field or None, self.c.eval_problems)

    def sampler_settings(self, seed: int, temperature: float | None = None) -> SamplerSettings:
        c = self.c
        return SamplerSettings(mode=c.mode, paths=c.paths, max_new_tokens=c.max_new_tokens, max_blocks=c.max_blocks,
                               max_path_tokens=c.max_path_tokens, top_p=c.top_p, seed=seed,
                               temperature=c.temperature if temperature is None else temperature)

    def distill(self, stage: Stage) -> None:
        """Sample `tries` responses per problem with the parallel prompt; keep one correct, valid one."""
        model, tokenizer, tags = self.load(self.input_model(stage))
        problems = self.problems(stage.data)
        eos, kept = stop_ids(model, tokenizer), []
        chunk = max(1, self.c.prompts_per_step)
        with self.progress() as bar:
            task = bar.add_task(stage.name, total=len(problems))
            for start in range(0, len(problems), chunk):
                batch = problems[start : start + chunk]
                prompts = [self.prompt(p, tokenizer) for p in batch]
                rollouts = sample(model, prompts, self.sampler_settings(self.c.seed + start), tags, eos,
                                  len(tokenizer), stage.tries)
                for k, problem in enumerate(batch):
                    for rollout in rollouts[k * stage.tries : (k + 1) * stage.tries]:
                        text = response_text(rollout, tokenizer, eos)
                        # `parallel` is +1 only for a correct answer with a valid block in a text
                        # that passes Algorithm 1: exactly the traces worth keeping
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
            raise NanoparError(f"{stage.name}: no correct, valid parallel trace in {len(problems)} problems; "
                               "the model cannot write them yet: give ready traces with --sft-data")
        write_jsonl(self.folder(stage) / "traces.jsonl", kept)

    def train(self, stage: Stage) -> None:
        """An SFT or GRPO stage: resume or start, step, checkpoint, finish with `final/`."""
        folder, c = self.folder(stage), self.c
        checkpoint = latest_checkpoint(folder)
        model, tokenizer, tags = self.load(str(checkpoint) if checkpoint else self.input_model(stage))
        model.train()
        optimizer, scheduler = make_optimizer(model, stage.lr, c.weight_decay, c.warmup_steps,
                                              c.sft_schedule if stage.kind == "sft" else "constant", stage.steps)
        step = load_trainer_state(checkpoint, optimizer, scheduler) if checkpoint else 0
        if checkpoint:
            self.log.drop_after(stage.name, step)
            self.console.print(f"{stage.name}: resumed from {checkpoint.name}")
        step_fn = self.sft_step if stage.kind == "sft" else self.grpo_step
        state = self.prepare(stage, model, tokenizer, resumed=checkpoint is not None)
        save = lambda name, at: save_checkpoint(folder / name, model, tokenizer, optimizer, scheduler, at,
                                                vars(c) | {"stage": stage.name})
        with self.progress() as bar:
            task = bar.add_task(stage.name, total=stage.steps, completed=step)
            try:
                while step < stage.steps:
                    metrics = step_fn(stage, step, model, tokenizer, tags, optimizer, scheduler, state)
                    step += 1
                    self.log.write({"stage": stage.name, "step": step, **metrics})
                    bar.update(task, advance=1, description=f"{stage.name} " + _brief(metrics))
                    if c.checkpoint_every and step % c.checkpoint_every == 0 and step < stage.steps:
                        save(f"checkpoint-{step}", step)
                        prune_checkpoints(folder, c.keep_checkpoints)
            except KeyboardInterrupt:
                save(f"checkpoint-{step}", step)
                raise SystemExit(f"interrupted: saved {folder / f'checkpoint-{step}'}; the same command resumes")
        save("final", step)

    def prepare(self, stage: Stage, model, tokenizer, resumed: bool) -> dict:
        """What a stage's steps share: its examples or problems, schedule, reference."""
        if stage.kind == "sft":
            records = self.traces(stage)
            eos = tokenizer.eos_token_id
            return {"examples": [(self.prompt(Problem(str(r.get("id", "")), r["question"], r.get("answer", "")),
                                              tokenizer), tokenizer.encode(r["response"], add_special_tokens=False)
                                  + [eos]) for r in records]}
        reference = None
        if self.c.kl_beta > 0:  # the policy at the start of the stage, also when resuming
            values = None
            if resumed:
                start = self.load(self.input_model(stage))[0]
                values = [p.detach().clone() for p in start.parameters() if p.requires_grad]
                del start
            reference = Reference(model, values)
        return {"problems": self.problems(stage.data), "schedule": schedule_from_string(stage.reward),
                "reference": reference}

    def traces(self, stage: Stage) -> list[dict]:
        """The SFT traces: a distill stage's output, or a .jsonl of question/answer/response records."""
        if stage.traces.startswith("toy:"):  # the toy world's programmatic teacher
            from .toy import teacher_traces

            return teacher_traces(stage.traces)
        by_name = {s.name: s for s in self.stages}
        path = self.folder(by_name[stage.traces]) / "traces.jsonl" if stage.traces in by_name else Path(stage.traces)
        if not path.is_file():
            raise NanoparError(f"{stage.name}: traces not found: {path}")
        records = read_jsonl(path)
        for number, record in enumerate(records, 1):
            if not isinstance(record.get("question"), str) or not isinstance(record.get("response"), str):
                raise NanoparError(f"{path}:{number}: a trace needs string fields question and response")
        return records

    def sft_step(self, stage, step, model, tokenizer, tags, optimizer, scheduler, state) -> dict:
        batch = self.take(state["examples"], step, self.c.sft_batch, stage)
        started = time.perf_counter()
        metrics = sft_step(model, optimizer, [p for p, _ in batch], [r for _, r in batch], tags, self.c.mode,
                           tokenizer.pad_token_id or 0, len(tokenizer), self.c.micro_batch, self.c.max_grad_norm,
                           scheduler)
        return metrics | {"train_seconds": time.perf_counter() - started}

    def grpo_step(self, stage, step, model, tokenizer, tags, optimizer, scheduler, state) -> dict:
        c = self.c
        problems = self.take(state["problems"], step, c.prompts_per_step, stage)
        prompts = [self.prompt(p, tokenizer) for p in problems]
        eos = stop_ids(model, tokenizer)
        seed = random.Random(f"{c.seed}/{stage.name}/sample/{step}").randrange(2**31)
        started = time.perf_counter()
        rollouts = sample(model, prompts, self.sampler_settings(seed), tags, eos, len(tokenizer), c.group_size)
        sampled = time.perf_counter()
        spec = state["schedule"].spec(step)
        owners = [p for p in problems for _ in range(c.group_size)]
        results = [score(spec, response_text(r, tokenizer, eos), r.trace, p) for r, p in zip(rollouts, owners)]
        advantages = group_advantages(torch.tensor([r.total for r in results]), c.group_size, c.advantage)
        keep = [i for i, res in enumerate(results) if res.format_ok or not stage.drop_invalid]
        update = grpo_update(
            model, optimizer, [rollouts[i] for i in keep], advantages[keep], self.grpo_settings(), tags, c.mode,
            c.temperature, len(tokenizer), tokenizer.pad_token_id or 0, state["reference"], scheduler,
        ) if keep else {}
        trained = time.perf_counter()
        if c.sample_every and (step + 1) % c.sample_every == 0:
            self.console.print(trace_tree(rollouts[0], tokenizer, title=f"{stage.name} step {step + 1}"))
        tokens = sum(r.stats.new_tokens for r in rollouts)
        return rollout_metrics(rollouts, results, c.group_size) | update | {
            "reward_spec": spec, "dropped_invalid": len(rollouts) - len(keep),
            "sample_seconds": sampled - started, "train_seconds": trained - sampled,
            "tokens_per_second": tokens / max(sampled - started, 1e-9),
        }

    def grpo_settings(self) -> GRPOSettings:
        c = self.c
        return GRPOSettings(advantage=c.advantage, updates=c.updates, clip=c.clip, kl_beta=c.kl_beta,
                            micro_batch=c.micro_batch, max_grad_norm=c.max_grad_norm)

    def progress(self):
        return progress(self.console)


def _brief(metrics: dict) -> str:
    """A few numbers for the progress line."""
    keys = ("reward", "accuracy", "parallel_ratio", "loss")
    return " ".join(f"{k.split('_')[0]}={metrics[k]:.2f}" for k in keys if isinstance(metrics.get(k), float))
