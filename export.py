"""Export a checkpoint to where users run models: a merged transformers folder, and a GGUF.

    python export.py --checkpoint runs/default/4-rl-hard/final --out exported      # a model folder
    python export.py --checkpoint runs/qwen/1-sft/final --out qwen-sft --gguf q8_0 --check

The folder (nanopar/merge.py: the LoRA adapter merged, the tag rows written in, the tags as added
special tokens, the chat template kept) loads with `AutoModelForCausalLM.from_pretrained`, no
nanopar needed: an ordinary model folder, as vLLM serves them. `--gguf KIND` also writes `model.KIND.gguf` in it for llama.cpp and
Ollama (nanopar/gguf_writer.py: Qwen2 and Qwen3). `--check` then runs each against nanopar's
sampler on the checkpoint (nanopar/export_check.py). What a structured (NPR) model becomes in
an engine that does not fork: docs/export.md.
Not here: uploading to a hub, Ollama's Modelfile, k-quants (llama.cpp's `llama-quantize`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nanopar import NanoparError, distributed
from nanopar.checkpoint import RUN_CONFIG, move_into_place, run_config, trained_schema
from nanopar.config import parse_config
from nanopar.data import load_problems, write_json
from nanopar.gguf_writer import KINDS, gguf_bytes, write_gguf
from nanopar.merge import base_of, check_checkpoint, merged_model
from nanopar.model import DTYPES

@dataclass
class ExportConfig:
    """export.py's flags."""

    # what to export
    checkpoint: str = ""  # [basic] a stage's final/ or checkpoint-N/ (required): LoRA or full, 4-bit or not
    out: str = ""  # [basic] the folder to write (required); refused if it exists, unless --replace
    dtype: str = "auto"  # [basic] auto (as the base came) / float32 / bfloat16 / float16: the folder's weights
    gguf: str = ""  # [basic] f32 / f16 / bf16 / q8_0: also write <out>/model.<kind>.gguf ("" = none)
    replace: bool = False  # [basic] replace an existing --out folder
    # checking it
    check: bool = False  # [basic] compare greedy tokens: the folder (and the GGUF) against nanopar's sampler on the checkpoint
    check_problems: str = ""  # problems --check prompts with ("" = the run's own RL data, its --easy-data)
    check_count: int = 2  # how many of them
    check_tokens: int = 64  # greedy tokens per problem


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    config = parse_config(ExportConfig, argv, description=__doc__.split("\n")[0])
    out = _check_flags(config)
    console, start = Console(), time.perf_counter()
    temporary = out.with_name(f".{out.name}.incomplete-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        dtype, parameters = _write_folder(config, temporary)  # the merged model is freed on its return
        if config.gguf:  # read back from the folder's files, beside no model in memory
            write_gguf(temporary, temporary / f"model.{config.gguf}.gguf", config.gguf,
                       trained_schema(config.checkpoint).all())
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)  # nothing half-written is left that looks done
        raise
    move_into_place(temporary, out)  # --replace: the old folder stays whole until the new one is
    seconds = time.perf_counter() - start
    sizes = ", ".join(f"{f.name} {f.stat().st_size / 2**20:,.0f} MiB" for f in sorted(out.iterdir()) if f.stat().st_size > 2**20)
    console.print(f"exported {config.checkpoint} -> {out} ({dtype}, {parameters:,} weights) in {seconds:.1f} s: {sizes}")
    if config.check:
        console.print(_check_table(config, out))
    return out


def _write_folder(config: ExportConfig, folder: Path) -> tuple[str, int]:
    """Merge the checkpoint and save it with its tokenizer and the run's config to `folder`, once
    the disk has room for it and the GGUF asked for. -> (its dtype, its number of weights)"""
    model, tokenizer = merged_model(config.checkpoint, None if config.dtype == "auto" else DTYPES[config.dtype])
    parameters = sum(p.numel() for p in model.parameters())
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    need += gguf_bytes(parameters, config.gguf) if config.gguf else 0
    free = shutil.disk_usage(folder.parent).free
    if need * 1.05 > free:  # checked before anything is written; 5% for the tokenizer and headers
        raise NanoparError(f"not enough disk for the export: about {need / 2**30:.1f} GiB needed in {folder.parent}, "
                           f"{free / 2**30:.1f} GiB free")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if (Path(config.checkpoint) / RUN_CONFIG).is_file():  # the run's tags, mode and prompt: nanopar's
        shutil.copy(Path(config.checkpoint) / RUN_CONFIG, folder)  # sample.py / eval.py run it as trained
    dtype = str(model.dtype).removeprefix("torch.")
    write_json(folder / "nanopar_export.json", asdict(config) | {"base": base_of(Path(config.checkpoint)),
                                                                  "dtype_written": dtype}, indent=2)
    return dtype, parameters


def _check_flags(config: ExportConfig) -> Path:
    """Every flag's one-line error, before the (slow) model load. -> the output folder"""
    if not config.checkpoint or not config.out:
        raise NanoparError("give --checkpoint (a stage's final/ or checkpoint-N/) and --out (the folder to write)")
    check_checkpoint(config.checkpoint)
    if config.dtype != "auto" and config.dtype not in DTYPES:
        raise NanoparError(f"unknown --dtype {config.dtype!r}: use auto, {', '.join(DTYPES)}")
    if config.gguf and config.gguf not in KINDS:
        raise NanoparError(f"unknown --gguf kind {config.gguf!r}: use one of {', '.join(KINDS)}")
    if min(config.check_count, config.check_tokens) < 1:
        raise NanoparError("--check-count and --check-tokens must be >= 1")
    out = Path(config.out).absolute()
    if out.exists() and not config.replace:
        raise NanoparError(f"{config.out!r} exists: give --replace to write over it, or another --out")
    if out.resolve() == Path(config.checkpoint).resolve():
        raise NanoparError("--out is the checkpoint itself: give another folder")
    if not out.parent.is_dir():
        raise NanoparError(f"cannot write {config.out!r}: the folder {str(out.parent)!r} does not exist")
    return out


def _check_table(config: ExportConfig, out: Path) -> Table:
    """How many greedy tokens each engine shares with nanopar's sampler on the checkpoint, per problem."""
    import importlib.util

    from transformers import AutoTokenizer

    from nanopar.export_check import agreement, check_prompts, llama_cpp_greedy, sampler_greedy, transformers_greedy

    spec = config.check_problems or run_config(Path(config.checkpoint)).get("easy_data", "gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = check_prompts(config.checkpoint, tokenizer, load_problems(spec, limit=config.check_count), spec)
    reference = sampler_greedy(config.checkpoint, prompts, config.check_tokens)
    engines = {"transformers, folder": transformers_greedy(str(out), prompts, config.check_tokens)}
    gguf = f"model.{config.gguf}.gguf"
    if config.gguf:
        engines["transformers, GGUF"] = transformers_greedy(str(out), prompts, config.check_tokens, gguf_file=gguf)
        if importlib.util.find_spec("xllamacpp") is not None:
            engines["llama.cpp, GGUF"] = llama_cpp_greedy(str(out / gguf), prompts, config.check_tokens)
    table = Table(title=f"greedy tokens shared with nanopar's sampler (causal) on {spec}")
    for column in ("problem", "sampler's tokens", *engines):
        table.add_column(column, justify="right")
    for i, tokens in enumerate(reference):
        table.add_row(str(i + 1), str(len(tokens)), *(str(agreement(tokens, got[i])) for got in engines.values()))
    return table


if __name__ == "__main__":
    try:
        main()
    except NanoparError as error:
        raise distributed.error_exit(error) from None
