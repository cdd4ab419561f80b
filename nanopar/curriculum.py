"""The stage recipes of both papers as plain lists of stages, and the config that sizes them.

    parallel-r1   [pretrain] -> cold-start-data -> sft -> rl-easy -> rl-hard
    npr           [pretrain] -> format-rl -> rejection -> sft -> parallel-rl
    --baseline    + baseline-rl-easy -> baseline-rl-hard (accuracy-only GRPO from the same base)
    --skip rl-easy  the recipe without a stage (an ablation): rl-hard starts from sft

A `Stage` is data: its kind (distill: write traces; sft; grpo), problems, steps, reward or
schedule, traces, learning rate, and which stage's `final/` it starts from (by default the
previous training stage's). What each stage does and why is the README's "The recipes" table.
`TrainConfig` is every flag of train.py, one commented field each; it extends `SamplerSettings`
so the sampler's knobs are declared once. Not here: how a stage runs (runner.py), one GRPO step
(grpo.py), presets (train.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import NanoparError
from .data import source_for
from .defaults import TOY_SAMPLING
from .sampler import SamplerSettings
from .tags import TagSchema, schema_named

RECIPES = ("parallel-r1", "npr")
RECIPE_SCHEMAS = {"parallel-r1": "parallel-r1", "npr": "npr"}  # the tags each recipe writes unless --schema says otherwise


@dataclass
class Stage:
    name: str  # folder under the run, also what --stages selects
    kind: str  # "distill" (write traces), "sft" or "grpo"
    data: str  # problems: benchmark name, .jsonl path, hub name, or toy:easy / toy:hard
    steps: int = 0  # optimiser steps (sft, grpo)
    reward: str = ""  # grpo: reward spec or schedule ("parallel", "accuracy", "alternating:10:2")
    traces: str = ""  # sft: a traces .jsonl, or the name of the distill stage that wrote it
    tries: int = 1  # distill: samples per problem; one correct, valid trace is kept
    drop_invalid: bool = False  # grpo: drop rollouts that are not valid parallel traces before the advantages (PAPO)
    advantage: str = ""  # grpo: "zscore", "mean" or "batch" (PAPO); "" = the config's --advantage
    instructions: str = ""  # the prompt before each question: "parallel", "plain", "none"; "" = --instructions
    mode: str = ""  # attention when sampling and training: "structured" or "causal"; "" = --mode
    lr: float = 1e-5  # learning rate of this stage
    start: str | None = None  # the stage whose final/ it starts from; None = the previous training stage,
    #                           "" = the configured --model
    teacher: str = ""  # distill: the model that writes the traces; "" = the stage's input model


@dataclass
class TrainConfig(SamplerSettings):
    """Everything `python train.py` can be told: every field is a flag, its comment the --help.

    The defaults are the toy world's; "real model: ..." is what a model not built from code gets
    instead unless the flag is given (`nanopar.defaults`). The sampler's budgets and draw knobs
    come from `SamplerSettings` (declared once); the fields that decide the policy (mode,
    temperature) make the run's `Policy`."""

    # the run
    out: str = "runs/default"  # run folder: config, metrics.jsonl, one folder per stage
    recipe: str = "parallel-r1"  # "parallel-r1" or "npr" (see nanopar/curriculum.py)
    schema: str = ""  # tags: "parallel-r1" (<Parallel> <Path> <Summary>) or "npr" (<guideline> <plan> <step> <takeaway>); "" = the recipe's own
    stages: str = "all"  # comma list of stage names to run, or "all"
    skip: str = ""  # comma list of stages left out of the recipe (ablation: "rl-easy"); the next starts where the skipped one did
    seed: int = 0  # seeds LoRA init, problem order and every sampling step
    plot: str = ""  # a run folder: draw its metrics.jsonl as metrics.png and exit
    preset: str = ""  # "long": the ~35-minute toy run (train.py's PRESETS); flags given explicitly still win
    ablations: bool = False  # run Parallel-R1's ablations instead, 7 runs under <out>/ablations/ from one pretrained base (nanopar/ablations.py): rl-hard reward accuracy / parallel / alternating; with and without rl-easy, Seen and Unseen; shared vs disjoint path positions. toy: ~26 min on 2 cores, default sizes (nothing shortened)
    # the model
    model: str = "toy:model"  # hub id, local folder, .gguf file (converted once), nanopar checkpoint, or toy:model / tiny:qwen2 / tiny:qwen3
    load_in_4bit: bool = False  # NF4 base weights (bitsandbytes)
    lora: bool = False  # train LoRA adapters (+ the tag rows) instead of every weight; real model: True
    lora_rank: int = 16  # LoRA r
    lora_alpha: int = 32  # LoRA alpha (scale alpha / r)
    lora_dropout: float = 0.0  # keep 0 for RL: dropout breaks the on-policy ratio of 1
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto
    device: str = "auto"  # cpu / cuda / auto
    mode: str = "structured"  # "structured" (Unseen: paths isolated) or "causal" (Seen)
    path_stride: int = 0  # structured: path k starts at position start + k * stride (0 = shared; >= max_path_tokens + 2 = disjoint)
    gradient_checkpointing: bool = False  # recompute activations in backward: much less memory on a GPU, ~30% slower
    # the data
    pretrain_data: str = "auto"  # traces to pretrain a base on first: "auto" = the data source's base for the recipe (toy: toy:sequential, NPR toy:instruct; a real model: ""), "" = none
    easy_data: str = "toy:easy"  # easy problems (cold start, stage 1 RL): name, .jsonl, hub id, toy:easy; real model: 'gsm8k_train'
    hard_data: str = "toy:hard"  # hard problems (stage 2 RL); real model: 'dapo'
    sft_data: str = "toy:parallel"  # ready cold-start traces (.jsonl: question, answer, response); "" = distill; real model: "" (distilled by --teacher or the model)
    teacher: str = ""  # strong model writing cold-start-data (hub id, folder, checkpoint, tiny:*; "" = its input); not NPR's rejection: self-distilled
    question_field: str = ""  # field of the question in .jsonl / hub records ("" = question/problem/prompt)
    answer_field: str = ""  # field of the gold answer ("" = answer)
    limit: int = 0  # use only the first N problems of each data set (0 = all)
    instructions: str = "none"  # before the question: "parallel" (tag instructions), "plain" or "none"; real model: 'parallel'
    chat: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    # stage lengths, learning rates and rewards
    pretrain_steps: int = 600  # pretraining SFT steps (only with --pretrain-data)
    pretrain_lr: float = 2e-3  # pretraining learning rate (from scratch)
    sft_steps: int = 150  # cold-start SFT steps
    sft_lr: float = 1e-3  # cold-start SFT learning rate; real model: 1e-4
    sft_batch: int = 32  # traces per SFT step (pretraining too)
    sft_schedule: str = "cosine"  # learning rate of SFT stages after warm-up: "cosine" (to 10%) or "constant"
    rl_easy_steps: int = 20  # GRPO steps on easy problems
    rl_hard_steps: int = 15  # GRPO steps on hard problems
    reward_file: str = ""  # a Python file of your own @register rewards, imported before the run
    easy_reward: str = "parallel"  # reward or schedule of rl-easy
    hard_reward: str = "accuracy"  # reward or schedule of rl-hard ("alternating:10:2", "two-phase:200")
    baseline: bool = False  # also run accuracy-only GRPO from the same base, same RL budget (no cold start)
    distill_tries: int = 0  # distill: samples per problem (0 = the recipe's: Parallel-R1 1, NPR 8)
    distill_problems: int = 512  # distill: the first N problems of its data are sampled (0 = all)
    # held-out evaluation after every training stage (the final table)
    eval_data: str = "auto"  # comma list of data sets (benchmark, .jsonl[-N:], toy:...); "auto": Runner.eval_sets
    eval_problems: int = 300  # first N problems of each (0 = no evaluation); the toy's held-out sets hold 560 (--preset long takes them all)
    eval_samples: int = 8  # responses per problem, at --temperature (toy: 300 x 8 keeps an accuracy's standard error under 1.5 points up to ~35% accuracy; near 50% it takes all 560 problems, as --preset long does); real model: 1
    eval_batch: int = 64  # problems per sampler call of an evaluation (x eval_samples responses decoded together)
    # sampling (also max_blocks, top_p, top_k and their defaults from SamplerSettings)
    prompts_per_step: int = 8  # B: problems per GRPO step
    group_size: int = 16  # G: responses per problem (more: fewer all-equal groups)
    paths: int = TOY_SAMPLING["paths"]  # K: paths per parallel block (the toy teacher writes 3; Parallel-R1 uses 2); real model: 2
    max_new_tokens: int = TOY_SAMPLING["max_new_tokens"]  # sampled tokens per response, over all branches; real model: 1024
    max_path_tokens: int = TOY_SAMPLING["max_path_tokens"]  # sampled tokens per path; real model: 512
    temperature: float = 1.0  # sampling temperature (the policy GRPO trains)
    # optimisation
    lr: float = 3e-5  # RL learning rate (AdamW); toy: 1e-4 moves a sequence 2-3 nats per step and degrades it; real model: 1e-5
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warm-up steps per stage
    advantage: str = "zscore"  # "zscore", "mean" or "batch" (group mean, batch std: PAPO; NPR's last stage uses it)
    updates: int = 1  # optimiser steps per rollout batch (1 = on-policy)
    clip: float = 0.2  # PPO clip range (updates > 1 only)
    kl_beta: float = 0.0  # KL weight to the stage's starting policy
    micro_batch: int = 16  # rows per forward/backward; real model: 4
    micro_batch_tokens: int = 0  # instead of --micro-batch rows: rows sorted by length, packed so that rows x longest row <= this (0 = off); GRPO and SFT
    max_grad_norm: float = 1.0  # gradient clipping
    # bookkeeping
    checkpoint_every: int = 10  # steps between checkpoints (0 = only final and Ctrl-C)
    keep_checkpoints: int = 2  # most recent checkpoints kept per stage (0 = all)
    sample_every: int = 0  # print a sample trace every N RL steps (0 = never)



def recipe(config: TrainConfig) -> list[Stage]:
    """The stages of `config.recipe`, sized by the config."""
    c = config
    for flag, value in (("--lr", c.lr), ("--sft-lr", c.sft_lr), ("--pretrain-lr", c.pretrain_lr)):
        if not value > 0:
            raise NanoparError(f"{flag} must be > 0, not {value:g}")
    pretrain = c.pretrain_data
    if pretrain == "auto":  # a world that builds its own base model says on which traces, per recipe
        source = source_for(c.easy_data)
        pretrain = (source.bases or {}).get(c.recipe, "") if source is not None else ""
    # a base (or instruct) model is an ordinary causal LM: its parallel traces, if any, read causally
    base = [Stage("pretrain", "sft", "", steps=c.pretrain_steps, traces=pretrain, lr=c.pretrain_lr, mode="causal")
            ] if pretrain else []
    if c.recipe == "parallel-r1":
        cold_start = [] if c.sft_data else [Stage("cold-start-data", "distill", c.easy_data, tries=c.distill_tries or 1,
                                                  teacher=c.teacher, instructions="parallel")]  # the elicitation prompt
        stages = base + cold_start + [
            Stage("sft", "sft", c.easy_data, steps=c.sft_steps, traces=c.sft_data or "cold-start-data", lr=c.sft_lr),
            Stage("rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, reward=c.easy_reward, lr=c.lr),
            Stage("rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps, reward=c.hard_reward, lr=c.lr),
        ]
    elif c.recipe == "npr":
        # NPR prompts with its format at every stage; the parallel mask and positions arrive with
        # the parallel SFT (stages 1 and 2 sample and train causally, like the instruct model)
        npr = dict(instructions="parallel")
        stages = base + [
            Stage("format-rl", "grpo", c.easy_data, steps=c.rl_easy_steps, reward="npr_format", lr=c.lr,
                  mode="causal", **npr),
            Stage("rejection", "distill", c.easy_data, tries=c.distill_tries or 8, mode="causal", **npr),
            Stage("sft", "sft", c.easy_data, steps=c.sft_steps, traces="rejection", lr=c.sft_lr, mode="structured",
                  **npr),
            Stage("parallel-rl", "grpo", c.hard_data, steps=c.rl_hard_steps, reward="accuracy", drop_invalid=True,
                  advantage="batch", lr=c.lr, mode="structured", **npr),
        ]
    else:
        raise NanoparError(f"unknown recipe {c.recipe!r}: use one of {', '.join(RECIPES)}")
    if c.baseline:
        start = "pretrain" if base else ""
        stages += [
            Stage("baseline-rl-easy", "grpo", c.easy_data, steps=c.rl_easy_steps, reward="accuracy", lr=c.lr,
                  start=start, instructions="plain"),
            Stage("baseline-rl-hard", "grpo", c.hard_data, steps=c.rl_hard_steps, reward="accuracy", lr=c.lr,
                  instructions="plain"),
        ]
    for stage in stages:  # what the recipe leaves open, the flags decide
        stage.instructions = stage.instructions or c.instructions
        stage.mode = stage.mode or c.mode
    return skip(stages, c.skip)


def run_schema(config: TrainConfig) -> TagSchema:
    """The tag schema of a run: --schema, or the recipe's own (npr -> NPR's, parallel-r1 -> Parallel-R1's)."""
    if config.recipe not in RECIPES:
        raise NanoparError(f"unknown recipe {config.recipe!r}: use one of {', '.join(RECIPES)}")
    return schema_named(config.schema or RECIPE_SCHEMAS[config.recipe])


def starting_stage(stages: list[Stage], stage: Stage) -> Stage | None:
    """The stage whose final/ `stage` starts from (None: the configured --model)."""
    if stage.start is None:
        before = [s for s in stages[: stages.index(stage)] if s.kind != "distill"]
        return before[-1] if before else None
    return next((s for s in stages if s.name == stage.start), None) if stage.start else None


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
