"""Defaults that follow the model: what a flag left unset means for a toy model or a real one.

The scripts' dataclass defaults are the toy world's (a laptop runs the whole curriculum in
minutes). A model that is not built from code (a hub id, a local folder, a `.gguf` file, a
checkpoint of one) gets a real model's instead, unless the flag is given:

    training   no pretraining stage, GSM8K (train) for the cold start and stage 1, DAPO-Math-17k
               for stage 2 (both shipped), the cold-start traces distilled (by --teacher or the
               model itself), the recipe's parallel instructions at every stage (baselines: plain),
               LoRA, lower learning rates, held-out evaluation on GSM8K (test) and DAPO's tail
    sampling   Parallel-R1's K = 2 paths, budgets for real answers (1,024 tokens, 512 per path)

`apply_model_defaults(config, argv)` sets them on a parsed config (train.py, eval.py and sample.py
call it, so the three share their sampling defaults); the resolved config is what each script
saves. Not here: presets (train.py's `--preset long`), which are toy-only.
"""

from __future__ import annotations

import json
import os

from .config import flags_given
from .model import is_built

TOY_SAMPLING = {"paths": 3, "max_new_tokens": 224, "max_path_tokens": 48}  # the defaults of the three scripts
# (their dataclasses read them here): the toy teacher writes 3 paths of <= 48 tokens and traces of
# <= 159 tokens (NPR rounds <= 188); 224 leaves a cold-started model room to finish what it starts
REAL_SAMPLING = {"paths": 2, "max_new_tokens": 1024, "max_path_tokens": 512}  # Parallel-R1: K = 2

REAL_TRAINING = {  # TrainConfig fields of a real model's run
    "pretrain_data": "",  # already trained: no pretraining stage
    "easy_data": "gsm8k_train",  # Parallel-R1's cold start and stage 1: GSM8K
    "hard_data": "dapo",  # stage 2: DAPO-Math-17k (the shipped copy)
    "sft_data": "",  # cold-start traces distilled by --teacher (or the model itself), format-filtered
    "instructions": "parallel",  # the recipe's parallel prompt at every stage (baselines: plain)
    "lora": True,  # LoRA adapters (+ tag rows): what fits one GPU
    "sft_lr": 1e-4,  # LoRA SFT
    "lr": 1e-5,  # LoRA RL
    "micro_batch": 4,  # rows per forward/backward at 1,024-token responses
    "eval_samples": 1,  # one response per held-out problem
    "eval_problems": 150,  # 150 of GSM8K test, DAPO's last 150 (kept out of training): 300 real responses a stage
}


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


def apply_model_defaults(config, argv: list[str], training: bool = False) -> list[str]:
    """Set a real model's defaults on the fields of `config` not given in `argv` when config.model
    is real: the sampling ones, and with `training` (train.py) the run's. -> the fields it changed."""
    model = config.model
    if not model or built_from_code(model):
        return []
    given = flags_given(argv)
    changed = []
    for field, value in (REAL_SAMPLING | (REAL_TRAINING if training else {})).items():
        if hasattr(config, field) and field not in given and getattr(config, field) != value:
            setattr(config, field, value)
            changed.append(field)
    return changed
