"""Train a model to think in parallel: the Parallel-R1 or NPR curriculum, stage by stage.

    python train.py                                    # the toy world on a CPU, ~8 minutes (see TrainConfig)
    python train.py --baseline                         # + accuracy-only GRPO from the same base
    python train.py --preset long                      # the longer toy run (PRESETS)
    python train.py --model Qwen/Qwen2.5-1.5B-Instruct --load-in-4bit --lora --lr 1e-5 \\
        --pretrain-data "" --easy-data gsm8k_train --hard-data path/to/dapo.jsonl \\
        --sft-data parallel_gsm8k.jsonl --instructions parallel --paths 2 --max-new-tokens 1024
    python train.py --stages rl-hard --hard-reward two-phase:200   # one stage of a run
    python train.py --plot runs/default                # draw metrics.jsonl as metrics.png

Every stage runs through the same code: the parallel-branch sampler, rewards.py, GRPO or SFT
with the shared layout, checkpoints every --checkpoint-every steps and on Ctrl-C; running the
same command again resumes. Metrics go to <out>/metrics.jsonl, one line per step. After each
training stage its model is evaluated on --eval-data (<stage>/eval.json), and the run ends with
a table of every stage side by side. What it leaves out: multi-GPU, vLLM, the full benchmark
report with pass@k and speedup (eval.py).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nanopar import NanoparError
from nanopar.config import parse_config, save_config
from nanopar.curriculum import recipe, select
from nanopar.metrics import plot_metrics
from nanopar.rewards import load_reward_file
from nanopar.runner import Runner
from nanopar.show import metric_cell


@dataclass
class TrainConfig:
    # the run
    out: str = "runs/default"  # run folder: config, metrics.jsonl, one folder per stage
    recipe: str = "parallel-r1"  # "parallel-r1" or "npr" (see nanopar/curriculum.py)
    stages: str = "all"  # comma list of stage names to run, or "all"
    seed: int = 0  # seeds LoRA init, problem order and every sampling step
    plot: str = ""  # a run folder: draw its metrics.jsonl as metrics.png and exit
    preset: str = ""  # "long": the ~25-minute toy run (see PRESETS); flags given explicitly still win
    # the model
    model: str = "toy:model"  # hub id, local folder, nanopar checkpoint, or toy:model / tiny:qwen2 / tiny:qwen3
    load_in_4bit: bool = False  # NF4 base weights (bitsandbytes)
    lora: bool = False  # train LoRA adapters (+ the tag rows) instead of every weight
    lora_rank: int = 16  # LoRA r
    lora_alpha: int = 32  # LoRA alpha (scale alpha / r)
    lora_dropout: float = 0.0  # keep 0 for RL: dropout breaks the on-policy ratio of 1
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto
    device: str = "auto"  # cpu / cuda / auto
    mode: str = "structured"  # "structured" (Unseen: paths isolated) or "causal" (Seen)
    # the data
    pretrain_data: str = "toy:sequential"  # sequential traces to pretrain on first ("" = no pretraining)
    easy_data: str = "toy:easy"  # easy problems (cold start, stage 1 RL): name, .jsonl, hub id, toy:easy
    hard_data: str = "toy:hard"  # hard problems (stage 2 RL)
    sft_data: str = "toy:parallel"  # ready cold-start traces (.jsonl: question, answer, response); "" = distill
    question_field: str = ""  # field of the question in .jsonl / hub records ("" = question/problem/prompt)
    answer_field: str = ""  # field of the gold answer ("" = answer)
    limit: int = 0  # use only the first N problems of each data set (0 = all)
    instructions: str = "none"  # before the question: "parallel" (tag instructions), "plain" or "none"
    chat: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    # stage lengths, learning rates and rewards
    pretrain_steps: int = 600  # pretraining SFT steps (only with --pretrain-data)
    pretrain_lr: float = 2e-3  # pretraining learning rate (from scratch)
    sft_steps: int = 150  # cold-start SFT steps
    sft_lr: float = 1e-3  # cold-start SFT learning rate
    sft_batch: int = 32  # traces per SFT step (pretraining too)
    sft_schedule: str = "cosine"  # learning rate of SFT stages after warm-up: "cosine" (to 10%) or "constant"
    rl_easy_steps: int = 20  # GRPO steps on easy problems
    rl_hard_steps: int = 15  # GRPO steps on hard problems
    reward_file: str = ""  # a Python file of your own @register rewards, imported before the run
    easy_reward: str = "parallel"  # reward or schedule of rl-easy
    hard_reward: str = "accuracy"  # reward or schedule of rl-hard ("alternating:10:2", "two-phase:200")
    baseline: bool = False  # also run accuracy-only GRPO from the same base, same RL budget (no cold start)
    distill_tries: int = 0  # distill: samples per problem (0 = the recipe's: Parallel-R1 1, NPR 8)
    # held-out evaluation after every training stage (the final table)
    eval_data: str = "toy:easy:heldout,toy:hard:heldout"  # comma list of data sets (benchmark, .jsonl, toy:...)
    eval_problems: int = 100  # first N problems of each (0 = no evaluation)
    eval_samples: int = 2  # responses per problem, at --temperature
    # sampling
    prompts_per_step: int = 8  # B: problems per GRPO step
    group_size: int = 16  # G: responses per problem (more: fewer all-equal groups)
    paths: int = 3  # K: paths per parallel block (the toy teacher writes 3; Parallel-R1 uses 2)
    max_new_tokens: int = 160  # sampled tokens per response, over all branches
    max_path_tokens: int = 48  # sampled tokens per path
    max_blocks: int = 4  # parallel blocks per response
    temperature: float = 1.0  # sampling temperature (the policy GRPO trains)
    top_p: float = 1.0  # nucleus sampling (1.0 = off)
    # optimisation
    lr: float = 3e-5  # RL learning rate (AdamW); toy: 1e-4 moves a sequence 2-3 nats per step and degrades it
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warm-up steps per stage
    advantage: str = "zscore"  # "zscore" or "mean"
    updates: int = 1  # optimiser steps per rollout batch (1 = on-policy)
    clip: float = 0.2  # PPO clip range (updates > 1 only)
    kl_beta: float = 0.0  # KL weight to the stage's starting policy
    micro_batch: int = 16  # rows per forward/backward
    max_grad_norm: float = 1.0  # gradient clipping
    # bookkeeping
    checkpoint_every: int = 10  # steps between checkpoints (0 = only final and Ctrl-C)
    keep_checkpoints: int = 2  # most recent checkpoints kept per stage (0 = all)
    sample_every: int = 0  # print a sample trace every N RL steps (0 = never)


def summary(runner: Runner, stages) -> Table:
    """Stages as columns: their training numbers, then the held-out results of each stage's model."""
    records = [json.loads(line) for line in (runner.out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    c = runner.c
    sets = runner.eval_sets() if c.eval_problems else []
    table = Table(title=f"{runner.out}: held-out results after each stage "
                        f"(first {c.eval_problems} problems of each set, {c.eval_samples} samples at T = {c.temperature:g})")
    table.add_column("", no_wrap=True)
    for stage in stages:
        table.add_column(stage.name, justify="right", overflow="fold")
    columns = []
    for stage in stages:
        rows = [r for r in records if r.get("stage") == stage.name]
        steps = [r for r in rows if "step" in r]
        results = runner.evaluate(stage.name, runner.folder(stage) / "final", runner.folder(stage) / "eval.json") \
            if stage.kind != "distill" else None
        column = {"steps": str(steps[-1]["step"]) if steps else "-",
                  "reward (last 5 steps)": metric_cell(_mean([r["reward"] for r in steps[-5:] if "reward" in r]),
                                                       "number"),
                  "seconds": f"{sum(r['seconds'] for r in rows if r.get('event') == 'done'):.0f}"}
        for spec in sets:
            result = (results or {}).get(spec, {})
            for key, name, kind in EVAL_ROWS:
                column[f"{_label(spec)}: {name}"] = metric_cell(result.get(key), kind)
        columns.append(column)
    for name in columns[0] if columns else []:
        table.add_row(name, *[column[name] for column in columns], end_section=name == "seconds")
    return table


EVAL_ROWS = [  # (evaluation.summarize key, row name, show.metric_cell kind)
    ("accuracy", "accuracy", "rate"), ("parallel_ratio", "parallel ratio", "rate"),
    ("relative_position", "<Parallel> position", "number"), ("paths_per_block", "paths/block", "number"),
    ("acceleration", "acceleration", "number"), ("truncation_rate", "truncated", "rate"),
]


def _label(spec: str) -> str:
    """A short column name for an evaluation set: "toy:easy:heldout" -> "easy"."""
    return spec.split(":")[1] if spec.startswith("toy:") else Path(spec).stem


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


PRESETS = {  # name -> the TrainConfig fields it changes
    "long": {"out": "runs/long", "pretrain_steps": 2000, "sft_steps": 400, "rl_easy_steps": 60, "rl_hard_steps": 60},
}


def apply_preset(config: TrainConfig, argv: list[str]) -> TrainConfig:
    """Set the preset's fields, except those given as flags in `argv`."""
    if not config.preset:
        return config
    if config.preset not in PRESETS:
        raise NanoparError(f"unknown preset {config.preset!r}: use one of {', '.join(PRESETS)}")
    given = {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    for field, value in PRESETS[config.preset].items():
        if field not in given:
            setattr(config, field, value)
    return config


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    config = apply_preset(parse_config(TrainConfig, argv, description=__doc__.split("\n")[0]), argv)
    console = Console()
    if config.plot:
        png = plot_metrics(Path(config.plot) / "metrics.jsonl", Path(config.plot) / "metrics.png")
        console.print(f"wrote {png}")
        return png
    if config.reward_file:
        console.print(f"rewards from {config.reward_file}: {', '.join(load_reward_file(config.reward_file))}")
    stages = recipe(config)
    chosen = select(stages, config.stages)
    runner = Runner(config, stages, console)
    runner.validate(chosen)
    save_config(config, runner.out)
    started = time.perf_counter()
    for stage in chosen:
        runner.run(stage)
    console.print(summary(runner, chosen))
    png = plot_metrics(runner.out / "metrics.jsonl", runner.out / "metrics.png")
    console.print(f"{time.perf_counter() - started:.0f} s; metrics in {runner.out / 'metrics.jsonl'}, plot {png}")
    return runner.out


if __name__ == "__main__":
    try:
        main()
    except NanoparError as error:
        sys.exit(f"error: {error}")
