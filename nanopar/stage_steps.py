"""A training stage's steps: step -> its metrics, for the runner's loop (`Runner.train`).

    steps = StageSteps(config, stages, inputs, log, console)
    one_step = steps.grpo(stage, model, tokenizer, policy, optimizer, scheduler, scaler, start, resumed)
    metrics = one_step(step)

What one step of a stage takes, and what it leaves beside the log: an SFT step (`sft.sft_step`)
on the step's --sft-batch traces; a GRPO step (`grpo.grpo_step`) on the step's --prompts-per-step
problems, rewarded as the stage's schedule says at that step, with --filter-groups' further
draws, --save-rollouts' records and --sample-every's tree. A GRPO stage's problems (with
--pool-samples, those its starting model solves some of the time: pass_rate.py) and its KL
reference (the policy at the stage's start) are set up once, before its first step. Everything a
step draws is seeded from (seed, stage, step), so a resumed run repeats what the interrupted one
would have done; under torchrun each process takes its share of every step (`distributed.share`).
Not here: resume, the loop, the log and checkpoints (runner.py), the steps themselves (sft.py,
grpo.py), which items a step takes (`RunInputs.batch_of_step`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from . import distributed
from .curriculum import Stage, TrainConfig, stage_folder
from .evaluation import sample_record
from .grpo import GRPOSettings, Reference, grpo_step
from .metrics import MetricsLog
from .model import load_with_policy
from .pass_rate import signal_pool
from .prompts import stop_ids
from .rewards import schedule_from_string
from .run_inputs import RunInputs
from .sampler import SamplerSettings
from .sft import sft_step
from .show import trace_tree

ROLLOUTS = "rollouts.jsonl"  # a GRPO stage's saved rollouts (--save-rollouts), beside its final/


class StageSteps:
    """The steps of one run's training stages: its config and recipe, what it reads (`inputs`),
    where it logs and prints."""

    def __init__(self, config: TrainConfig, stages: list[Stage], inputs: RunInputs, log: MetricsLog,
                 console: Console):
        self.config, self.stages, self.inputs, self.log, self.console = config, stages, inputs, log, console

    def sft(self, stage: Stage, model, tokenizer, policy, optimizer, scheduler, scaler) -> Callable[[int], dict]:
        """step -> its metrics: `sft.sft_step` on the step's --sft-batch traces (under torchrun
        this process's share of them)."""
        config, inputs, records = self.config, self.inputs, self.inputs.traces(stage)

        def one_step(step: int) -> dict:
            picked = distributed.share(inputs.batch_of_step(records, config.sft_batch, stage, step))
            batch = [inputs.sft_example(record, stage, tokenizer) for record in picked]  # (prompt ids, response ids)
            started = time.perf_counter()
            metrics = sft_step(model, optimizer, [p for p, _ in batch], [r for _, r in batch], policy,
                               tokenizer.pad_token_id or 0, config.micro_batch, config.max_grad_norm,
                               scheduler, config.micro_batch_tokens, head_read=config.head_read, scaler=scaler)
            return metrics | {"train_seconds": time.perf_counter() - started}
        return one_step

    def grpo(self, stage: Stage, model, tokenizer, policy, optimizer, scheduler, scaler, start: Callable[[], str],
             resumed: bool) -> Callable[[int], dict]:
        """step -> its metrics: `grpo.grpo_step` on the step's --prompts-per-step problems (under
        torchrun this process's whole groups), rewarded as the stage's schedule says at that step.
        `start()`: the stage's starting model, asked only for its pool or its KL reference."""
        config, inputs, reference = self.config, self.inputs, None
        problems, schedule = inputs.problems(stage.data), schedule_from_string(stage.reward)
        if config.pool_samples:  # only the problems its starting model solves some of the time (pass_rate.py)
            path = start()
            problems = signal_pool(config, stage, problems, self.folder(stage), path,
                                   lambda: load_with_policy(config, path, stage.mode, inputs.schema) if resumed
                                   else (model, tokenizer, policy), inputs.instructions(stage), self.log,
                                   self.console)
        if config.kl_beta > 0:  # the KL reference: the policy at the start of the stage, also when resuming
            initial = load_with_policy(config, start(), stage.mode, inputs.schema)[0] if resumed else None
            reference = Reference(model, None if initial is None else
                                  [p.detach().clone() for p in initial.parameters() if p.requires_grad])
            del initial
        settings = GRPOSettings.from_flags(config, stage)

        def one_step(step: int) -> dict:
            drawn = []  # the problems of each draw: the step's own, then --filter-groups' further ones

            def draw(number: int) -> tuple[list, list, SamplerSettings]:
                # draw 0 takes the step's problems; draw d > 0 the next batch of a second shuffle of the
                # pool, (max_draws - 1) batches reserved per step, so a resumed step draws the same ones
                batch = distributed.share(inputs.batch_of_step(problems, config.prompts_per_step, stage, step)
                                          if number == 0 else inputs.batch_of_step(
                                              problems, config.prompts_per_step, stage,
                                              step * (config.max_draws - 1) + number - 1, stream="more"))
                drawn.append(batch)
                return (batch, [inputs.prompt(problem, tokenizer, stage) for problem in batch],
                        SamplerSettings.from_flags(config, seed=sampling_seed(config.seed, stage, step, number)))

            batch, prompts, sampling = draw(0)
            rollouts, metrics = grpo_step(model, tokenizer, optimizer, batch, prompts, policy, sampling, settings,
                                          schedule.spec(step), reference, scheduler, scaler, more=draw)
            paid = metrics.pop("paid")  # [B * G] one number per rollout: saved below, not logged
            if config.save_rollouts:
                self.save_rollouts(stage, step, rollouts, [p for batch in drawn for p in batch], paid,
                                   metrics["reward_spec"], model, tokenizer)
            if config.sample_every and (step + 1) % config.sample_every == 0:
                self.console.print(trace_tree(rollouts[0], tokenizer, title=f"{stage.name} step {step + 1}"))
            return metrics
        return one_step

    def save_rollouts(self, stage: Stage, step: int, rollouts, problems, paid: list[float], spec: dict, model,
                      tokenizer) -> None:
        """Append a GRPO step's rollouts to <stage>/rollouts.jsonl, as evaluation records (what
        eval.py --rescore reads) with the step, the reward spec and the reward each was paid."""
        G, eos = self.config.group_size, stop_ids(model, tokenizer)
        log = MetricsLog(self.folder(stage) / ROLLOUTS)  # MetricsLog: rank 0 appends, flushed line by line
        for i, rollout in enumerate(rollouts):
            log.write(sample_record(rollout, problems[i // G], i % G, tokenizer, eos)
                      | {"stage": stage.name, "step": step + 1, "reward_spec": spec, "paid": paid[i]})

    def folder(self, stage: Stage) -> Path:
        return stage_folder(self.config.out, self.stages, stage)


def sampling_seed(seed: int, stage: Stage, step: int, draw: int = 0) -> int:
    """The seed of a GRPO step's sampling, from (--seed, stage, step, and --filter-groups' draw after
    the first): one stream per process under torchrun (rank r > 0 adds "/rank-r"; rank 0's is the
    single process's), so a run repeats for a given N."""
    rank = distributed.rank()
    return random.Random(f"{seed}/{stage.name}/sample/{step}" + (f"/draw-{draw}" if draw else "")
                         + (f"/rank-{rank}" if rank else "")).randrange(2**31)
