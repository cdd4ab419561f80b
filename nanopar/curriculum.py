"""The stage recipes of both papers, as plain lists of stages that chain through checkpoints.

Either recipe may start with
  pretrain          SFT on sequential traces (--pretrain-data): the toy world trains its base
                    model from scratch this way; a real Qwen is already pretrained (leave it "")
Parallel-R1 (the default):
  cold-start data   prompt the model with the parallel-thinking instructions on easy problems,
                    keep traces that are format-valid, parallel and correct (skipped when
                    --sft-data gives ready traces, e.g. Parallel-GSM8K or the toy teacher's)
  sft               cold-start SFT on those traces (the structured layout in structured mode)
  rl-easy           GRPO on easy problems, reward `parallel` (+1 only if correct AND parallel)
  rl-hard           GRPO on hard problems, reward `accuracy`, or a schedule: alternating
                    ("alternating:10:2": 2 of every 10 steps parallel+accuracy) or two-phase
                    ("two-phase:200": the alternating scaffold, then accuracy only)
NPR (--recipe npr):
  format-rl         GRPO from the instruct model with the parallel prompt, reward `npr_format`
  rejection         self-distillation data: up to --distill-tries samples per problem, keep one
                    correct and valid trace
  sft               parallel SFT on the model's own traces
  parallel-rl       GRPO on hard problems, reward `accuracy`, format-invalid rollouts dropped
                    before the update (PAPO)
The accuracy-only baseline (--baseline), after either recipe:
  baseline-rl-easy  GRPO from the same starting model as the recipe (the pretrained base, or
  baseline-rl-hard  --model), reward `accuracy`, no cold start, the same steps and sampling
                    budget as the recipe's RL stages: does parallel thinking beat plain RL?
Each stage reads the previous training stage's `final/` folder as its model (or the one its
`start` names). Not here: how a stage runs (runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import NanoparError

RECIPES = ("parallel-r1", "npr")


@dataclass
class Stage:
    name: str  # folder under the run, also what --stages selects
    kind: str  # "distill" (write traces), "sft" or "grpo"
    data: str  # problems: benchmark name, .jsonl path, hub name, or toy:easy / toy:hard
    steps: int = 0  # optimiser steps (sft, grpo)
    reward: str = ""  # grpo: reward spec or schedule ("parallel", "accuracy", "alternating:10:2")
    traces: str = ""  # sft: a traces .jsonl, or the name of the distill stage that wrote it
    tries: int = 1  # distill: samples per problem; one correct, valid trace is kept
    drop_invalid: bool = False  # grpo: drop format-invalid rollouts before the update (PAPO)
    lr: float = 1e-5  # learning rate of this stage
    start: str | None = None  # the stage whose final/ it starts from; None = the previous training stage,
    #                           "" = the configured --model


def recipe(config) -> list[Stage]:
    """The stages of `config.recipe`, sized by the config."""
    c = config
    base = [Stage("pretrain", "sft", "", steps=c.pretrain_steps, traces=c.pretrain_data, lr=c.pretrain_lr)
            ] if c.pretrain_data else []
    if c.recipe == "parallel-r1":
        cold_start = [] if c.sft_data else [Stage("cold-start-data", "distill", c.easy_data, tries=c.distill_tries or 1)]
        stages = base + cold_start + [
            Stage("sft", "sft", c.easy_data, steps=c.sft_steps, traces=c.sft_data or "cold-start-data", lr=c.sft_lr),
            Stage("rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, reward=c.easy_reward, lr=c.lr),
            Stage("rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps, reward=c.hard_reward, lr=c.lr),
        ]
    elif c.recipe == "npr":
        stages = base + [
            Stage("format-rl", "grpo", c.easy_data, steps=c.rl_easy_steps, reward="npr_format", lr=c.lr),
            Stage("rejection", "distill", c.easy_data, tries=c.distill_tries or 8),
            Stage("sft", "sft", c.easy_data, steps=c.sft_steps, traces="rejection", lr=c.sft_lr),
            Stage("parallel-rl", "grpo", c.hard_data, steps=c.rl_hard_steps, reward="accuracy", drop_invalid=True,
                  lr=c.lr),
        ]
    else:
        raise NanoparError(f"unknown recipe {c.recipe!r}: use one of {', '.join(RECIPES)}")
    if c.baseline:
        start = "pretrain" if base else ""
        stages += [
            Stage("baseline-rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, reward="accuracy", lr=c.lr,
                  start=start),
            Stage("baseline-rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps, reward="accuracy", lr=c.lr),
        ]
    return stages


def select(stages: list[Stage], names: str) -> list[Stage]:
    """The stages named in a comma list ("all" = every one), in recipe order."""
    if names == "all":
        return stages
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [s.name for s in stages]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise NanoparError(f"unknown stage(s) {', '.join(unknown)}: this recipe has {', '.join(known)}")
    return [s for s in stages if s.name in wanted]
