"""One road for defaults: `resolve(config, argv)` turns a parsed config into the one a script runs.

The dataclass defaults are the toy world's (a laptop runs the whole curriculum in minutes).
`resolve` then applies, once and in this order, leaving every flag given in `argv` alone:

    1. the preset (train.py's --preset: its fields)
    2. a real model's defaults, when --model is not built from code (a hub id, a folder, a
       `.gguf` file, a checkpoint of one): REAL_SAMPLING for every script, REAL_TRAINING for
       train.py (no pretraining, GSM8K then DAPO, the parallel prompt, LoRA, a GPU's budgets);
       then --dtype auto made concrete for every model (`auto_dtype`)
    3. the placeholders: "auto" run folder (`run_folder.default_out`), pretraining traces, shipped base, cold-start traces and evaluation sets,
       "" schema, 0 distil tries;
       eval.py and sample.py take a checkpoint's schema, attention mode, path stride and prompt
    4. the schema's: NPR's plan cap (--paths) is its engine's, 5, not Parallel-R1's K
    5. NPR's data, where not given: its PAPO stage reads easy and hard problems mixed, and on the
       toy its rejection samples NPR_TOY_REJECTION problems

and returns what it changed, which the scripts print and save. Not here: the flags themselves
(config.py), which stages run (curriculum.py).
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from . import NanoparError
from .checkpoint import trained_with
from .config import flags_given
from .curriculum import recipe, select
from .data import MIX, heldout_set_of, load_problems, mix_parts, source_for
from .model import cpu_bf16_instructions, gpu_dtype, is_built
from .run_folder import default_out

REAL_SAMPLING = {"paths": 2, "max_new_tokens": 1024, "max_path_tokens": 512}  # Parallel-R1's K = 2, budgets for real answers

REAL_TRAINING = {  # train.py's fields for a real model on one GPU; --preset qwen scales them to a CPU (docs/qwen.md)
    "pretrain_data": "",  # already trained: no pretraining stage
    "easy_data": "gsm8k_train",  # Parallel-R1's cold start and stage 1: GSM8K
    "hard_data": "dapo",  # stage 2: DAPO-Math-17k (the shipped copy)
    "sft_data": "auto",  # the recipe's cold start (COLD_START): Parallel-R1's shipped traces, or --teacher's
    "instructions": "parallel",  # the recipe's parallel prompt at every stage (baselines: plain)
    "lora": True,  # LoRA adapters (+ tag rows): what fits one GPU
    # the cold start: ~3 passes over Parallel-GSM8K's 300 training traces (the toy's 250 x 32 would be 27)
    "sft_steps": 60,  # x 16 traces
    "sft_batch": 16,
    "sft_lr": 2e-4,  # LoRA SFT (on the Qwen 0.5B: 2e-3 without warm-up broke it in one step)
    "tag_lr_scale": 10.0,  # the new tags' rows learn 10x faster in SFT stages (GRPO: 1x, docs/real-checkpoint.md)
    "warmup_steps": 4,  # linear warm-up of every stage: AdamW's first steps move every weight by ~lr
    # GRPO: Parallel-R1's and NPR's 8 responses a prompt
    "rl_easy_steps": 100,
    "rl_hard_steps": 100,
    "prompts_per_step": 8,
    "group_size": 8,
    "lr": 1e-5,  # LoRA RL
    "micro_batch": 4,  # rows per forward/backward at 1,024-token responses
    "eval_samples": 1,  # one response per held-out problem
    "eval_problems": 150,  # 150 of GSM8K test and DAPO's last 150 (kept out of training)
    "eval_model": True,  # the model before any stage: what the cold start changes
}

RECIPE_SCHEMAS = {"parallel-r1": "parallel-r1", "npr": "npr"}  # the tags each recipe writes unless --schema says otherwise
DISTILL_TRIES = {"parallel-r1": 1, "npr": 8}  # samples per problem of a distill stage: a teacher's one, NPR's rejection 8
# --sft-data auto without --teacher: Parallel-R1's own cold-start traces (shipped); NPR reads none, it
# rejection-samples its own (curriculum.py). With --teacher: "", the teacher distils them (cold-start-data)
COLD_START = {"parallel-r1": "parallel-gsm8k", "npr": ""}
NPR_PLANS = 5  # the most plans (branches) NPR's engine forks a guideline into
# NPR rejection-samples its whole training set; the toy's default 512 problems leave its SFT data-starved:
# 2,048 (1,791 kept traces) end the parallel SFT 10.0 +- 1.8 points higher on easy than 512 (448 kept), at
# ~4x the stage's time (docs/results.md). Only where the model is built from code: a real model keeps 512
NPR_TOY_REJECTION = 2048


def real_defaults(training: bool = False) -> dict:
    """The fields a real model changes (for --help: "real model: ...")."""
    return REAL_SAMPLING | (REAL_TRAINING if training else {})


def resolve(config, argv: list[str], presets: dict | None = None) -> dict:
    """Apply the preset, the model's defaults and the placeholders to `config` (in place), in that
    order, leaving the fields given in `argv` alone. -> {field: new value} of what it changed."""
    given, changed = flags_given(argv), {}

    def put(field: str, value) -> None:
        if getattr(config, field) != value:
            setattr(config, field, value)
            changed[field] = value

    training = hasattr(config, "recipe")
    preset = getattr(config, "preset", "")
    if preset and preset not in (presets or {}):
        raise NanoparError(f"unknown preset {preset!r}: use one of {', '.join(presets or {})}")
    preset_fields = presets[preset] if preset else {}
    for field, value in preset_fields.items():
        if field not in given:
            put(field, value)
    chosen = given | set(preset_fields)  # a preset for a real model outranks its defaults
    if training and config.start_from:  # before the model's defaults: they are the started-from model's
        _start_from(config, given, put)
    if config.model and not built_from_code(config.model):
        for field, value in real_defaults(training).items():
            if hasattr(config, field) and field not in chosen:
                put(field, value)
    if config.dtype == "auto":  # concrete in the saved config and every evaluation key, never "auto"
        put("dtype", auto_dtype(config, training))
    if training:
        _resolve_training_placeholders(config, put)
        if config.recipe == "npr":
            _resolve_npr_data(config, put, chosen)
        if config.start_from:
            _skip_before_start(config, put)
    else:  # a checkpoint evaluated or sampled as it was trained: its tags, attention and positions
        trained = trained_with(config.model)
        for field in ("mode", "path_stride", "instructions"):
            if field in trained and field not in given:
                put(field, trained[field])
        put("schema", config.schema or trained.get("schema") or "parallel-r1")
    if config.schema == "npr" and "paths" not in given:
        put("paths", NPR_PLANS)  # the model chooses its branch count: up to NPR's engine's, not K = 2 or 3
    return changed


def _start_from(config, given: set, put) -> None:
    """--start-from X: X is the model (`_skip_before_start` then leaves out the recipe's stages
    before the first of --stages, so that stage starts from the configured model)."""
    if "model" in given:
        raise NanoparError("--start-from is the model the run starts from: give it or --model, not both")
    if config.stages == "all":
        raise NanoparError("--start-from needs --stages: the stages to run from it (e.g. --stages rl-easy)")
    put("model", config.start_from)
    if "eval_model" not in given:  # the started-from model's evaluation: the table's "vs its start"
        put("eval_model", True)


def _skip_before_start(config, put) -> None:
    """--start-from: leave out the recipe's stages before the first of --stages."""
    stages = recipe(config)
    first = stages.index(select(stages, config.stages)[0])
    if first:
        put("skip", ",".join(filter(None, [config.skip, *(s.name for s in stages[:first])])))


def on_cpu(device: str) -> bool:
    """Whether --device runs on the CPU ("auto": when torch sees no CUDA GPU)."""
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def auto_dtype(config, training: bool) -> str:
    """What --dtype auto is for this script's model and device:
      - float32 for a model built from code and for every weight trained (train.py without --lora),
        on every device: AdamW on bfloat16 weights, with no float32 master copy, rounds away each
        update below bfloat16's resolution (~0.4% of a weight): the toy's rl-easy stage gained
        three quarters less in bfloat16 (docs/gpu.md, "Which dtype");
      - a LoRA or a model read without training, on a GPU: `gpu_dtype()` (bfloat16 where the card
        computes it, float16 with a loss scaler on a T4 or V100); its trained parameters, the
        adapter and the tag rows, stay float32 master weights either way (peft, model.py);
      - on a CPU, real weights: `cpu_dtype`."""
    if built_from_code(config.model) or (training and not config.lora):
        return "float32"
    return cpu_dtype(config.load_in_4bit) if on_cpu(config.device) else gpu_dtype()


def cpu_dtype(load_in_4bit: bool) -> str:
    """What --dtype auto is for real weights on a CPU: bfloat16 where the CPU has bfloat16
    instructions (faster there), else float32; float32 for 4-bit (the CPU's only verified 4-bit
    path). The model library's own "auto" stays float32 on a CPU (model.resolve_device_and_dtype),
    as does a model built from code: the toy's tables do not depend on which CPU ran them."""
    return "float32" if load_in_4bit or cpu_bf16_instructions() == "none" else "bfloat16"


def _resolve_training_placeholders(config, put) -> None:
    """train.py's "auto" / "" / 0 fields, from the recipe and the data."""
    if config.recipe not in RECIPE_SCHEMAS:
        raise NanoparError(f"unknown recipe {config.recipe!r}: use one of {', '.join(RECIPE_SCHEMAS)}")
    put("schema", config.schema or RECIPE_SCHEMAS[config.recipe])
    put("distill_tries", config.distill_tries or DISTILL_TRIES[config.recipe])
    if config.out == "auto":
        put("out", default_out(config, built_from_code(config.model)))
    if config.sft_data == "auto":
        put("sft_data", "" if config.teacher else COLD_START[config.recipe])
    source = source_for(config.easy_data)
    source_base = (source.bases or {}).get(config.recipe, "") if source is not None else ""
    if config.pretrain_data == "auto":  # a world that builds its own base model says on which traces, per recipe
        put("pretrain_data", source_base)
    if config.pretrained_base == "auto":
        put("pretrained_base", shipped_base(config, source, source_base))
    if config.eval_data == "auto":
        put("eval_data", ",".join(auto_eval_sets(config)))


def _resolve_npr_data(config, put, chosen: set) -> None:
    """NPR's data where the flags leave it (step 5 of `resolve`): rejection and PAPO on the mix of --easy-data and
    --hard-data, and on a model built from code (the toy) NPR_TOY_REJECTION rejection problems.

    NPR trains every stage on one mixed-difficulty set (ORZ-57k); nanopar's easy and hard sets are
    two, so NPR's PAPO stage, which reads --hard-data, gets both mixed ("toy:easy+toy:hard"), unless
    --hard-data is given. On hard problems alone the toy's SFT model is at 0% and every group pays
    -1: PAPO never had a step to learn from (docs/results.md, "NPR's recipe on the toy")."""
    if "hard_data" not in chosen and config.easy_data != config.hard_data:
        parts = mix_parts(config.hard_data)
        put("hard_data", MIX.join(dict.fromkeys(mix_parts(config.easy_data) + parts)))
    if "distill_problems" not in chosen and built_from_code(config.model):
        put("distill_problems", NPR_TOY_REJECTION)


PRETRAINING = ("pretrain_steps", "pretrain_lr")  # the fields besides its traces that change the base a pretrain stage makes


def shipped_base(config, source, source_base: str) -> str:
    """What --pretrained-base auto stands for: the folder of the base the data source ships for the
    recipe, made by the same pretrain stage at train.py's defaults, when this run would pretrain
    exactly that (the source's traces, in the recipe's own tags, the default --pretrain-steps and
    --pretrain-lr); else "" (pretrain here). The run's seed is not part of it: like a real
    model's, the base is given."""
    folder = (source.shipped_bases or {}).get(config.recipe, "") if source is not None else ""
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.name in PRETRAINING}
    same_pretraining = (config.pretrain_data == source_base and config.schema == RECIPE_SCHEMAS[config.recipe]
                        and all(getattr(config, name) == value for name, value in defaults.items()))
    return folder if folder and same_pretraining else ""


def auto_eval_sets(config) -> list[str]:
    """What --eval-data auto stands for: the held-out set that goes with the run's easy and hard
    data (`data.heldout_set_of`: "toy:easy" -> "toy:easy:heldout", gsm8k_train -> gsm8k), else the
    set's last --eval-problems problems (at most half of it: "x.jsonl[-100:]"), which the run
    leaves out of training (`run_inputs.RunInputs.problems`); a mix's ("toy:easy+toy:hard"), each of
    its parts' (a set named twice is evaluated once). Never a problem the run trains on."""
    sets = []
    named = [part for s in (config.easy_data, config.hard_data) if s and config.eval_problems for part in mix_parts(s)]
    for spec in dict.fromkeys(named):
        heldout_set = heldout_set_of(spec)
        if heldout_set is not None:
            sets.append(heldout_set)
        else:
            whole = load_problems(spec, config.question_field or None, config.answer_field or None)
            if len(whole) >= 2:
                sets.append(f"{spec}[-{min(config.eval_problems, len(whole) // 2)}:]")
    return sets


def built_from_code(model: str) -> bool:
    """Whether `model` is built from code ("toy:model", "tiny:qwen3") or a checkpoint trained from
    one (its adapter_config.json names such a base), rather than real pretrained weights."""
    if is_built(model):
        return True
    adapter = os.path.join(model, "adapter_config.json")
    if os.path.isfile(adapter):
        with open(adapter) as f:
            return built_from_code(json.load(f).get("base_model_name_or_path", ""))
    config = os.path.join(model, "run_config.json")  # a full (non-LoRA) nanopar checkpoint of a built model
    if os.path.isfile(config):
        with open(config) as f:
            return built_from_code(json.load(f).get("model", ""))
    return False
