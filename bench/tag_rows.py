"""Benchmark the trainable tag rows' forward: peft's, which builds a new [V, d] matrix per forward,
against nanopar's row-wise one (nanopar/tag_rows.py), on two real models' shapes.

    python bench/tag_rows.py                 # about 6 minutes on a 2-core CPU
    python bench/tag_rows.py --quick         # 2 layers, one repeat: a smoke run
    python bench/tag_rows.py --help          # every flag (TagRowsConfig)

Contestants: randomly initialised models (no download) of Qwen2.5-0.5B's shape (151,936 x 896,
untied head, as the Coder GGUF ships it) and of Gemma-3 270M's (262,144 x 640, tied, embedding
scaled by sqrt(d)), float32, `--layers` decoder layers each: the tag rows cost the same at any
depth, the rest of the work grows with it. LoRA r16 + the tag rows through `model.apply_lora`.
Parts:
  train step  `forward.trace_logprobs` (the chunked head read, as a real run trains) of B rows x
              T tokens, tags among them, + backward: what every SFT and GRPO micro-batch does
  decode      `sample` of `new_tokens` tokens for B prompts (one forward per token)
Forwards, one model, the class of its tag layers switched between rounds:
  peft        peft's TrainableTokensLayer: index_copy of the rows into a new [V, d] matrix, for
              the embedding and again for the head; a dense [V, d] gradient in backward
  row-wise    RowwiseTagRows, what apply_lora installs
  written     (decode only) peft's layer with the rows merged into the matrices for the call
              (peft's `merge`, then `unmerge`: two [V, d] writes a call, timed with it)
Each time is the best of `--repeats` rounds after a warm-up; the contestants take turns within a
round. Ratios are peft's time over the row-wise one. The load average is printed before and after.
Not here: 4-bit layers (the tag rows are never quantised), GPU timings, the optimiser.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import torch
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from common import PAD
from nanopar.config import parse_config
from nanopar.forward import make_batch, trace_logprobs
from nanopar.model import ModelSettings, apply_lora
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tag_rows import RowwiseTagRows
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model


@dataclass
class TagRowsConfig:
    layers: int = 4  # decoder layers of each model (the real ones: 24 and 18)
    rows: int = 2  # B: rows of the training micro-batch and prompts of the decode
    tokens: int = 256  # T: tokens per training row (16 of prompt)
    new_tokens: int = 32  # tokens sampled per prompt in the decode part
    repeats: int = 3  # timed rounds after the warm-up; the best is kept
    threads: int = 0  # torch threads; 0 = torch's default
    quick: bool = False  # 2 layers, 64-token rows, 8 new tokens, one round: a smoke run


def qwen_shape(layers: int):
    return tiny_qwen_model(arch="qwen2", vocab_size=151_936, hidden_size=896, num_layers=layers, num_heads=14,
                           num_kv_heads=2, intermediate_size=4864, tie_word_embeddings=False)


def gemma_shape(layers: int):
    config = Gemma3TextConfig(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                              tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


SHAPES = {"Qwen2.5-0.5B": qwen_shape, "Gemma-3 270M": gemma_shape}


@contextlib.contextmanager
def forward_named(model, name: str):
    """The model's tag layers run `name`'s forward inside the block (module docstring)."""
    layers = [m for m in model.modules() if isinstance(m, TrainableTokensLayer)]
    for layer in layers:
        layer.__class__ = RowwiseTagRows if name == "row-wise" else TrainableTokensLayer
    try:
        if name == "written":  # inside the timed block: what writing the rows in costs a call
            for layer in layers:
                layer.merge()
        yield
    finally:
        for layer in layers:
            if layer.merged:
                layer.unmerge()
            layer.__class__ = RowwiseTagRows


def contestant(shape: str, config: TagRowsConfig):
    """(model, policy, training batch, decode prompts) of one shape, the tags among the tokens."""
    model = SHAPES[shape](config.layers)
    V = model.config.vocab_size
    tags = TagIds(*range(V - 6, V))
    model = apply_lora(model, ModelSettings(shape, lora=True), tags)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, V - 6, (config.rows, config.tokens), generator=generator)  # [B, T]
    ids[:, 20::16] = torch.tensor(list(tags.all()))[torch.arange(ids[:, 20::16].shape[1]) % 6]  # a tag every 16
    prompts, responses = ids[:, :16].tolist(), ids[:, 16:].tolist()
    batch = make_batch(prompts, responses, [[1.0] * len(r) for r in responses], PAD)
    return model, Policy(tags, "structured", 1.0, V), batch, prompts


def train_step(model, policy, batch) -> None:
    model.train().zero_grad(set_to_none=True)
    logprobs, _ = trace_logprobs(model, batch, policy, head_read="chunked")
    (logprobs * batch.target_mask).sum().backward()


def decode(model, policy, prompts, config: TagRowsConfig) -> None:
    settings = SamplerSettings(max_new_tokens=config.new_tokens, max_path_tokens=8, seed=0)
    sample(model, prompts, policy, settings, eos_ids=[])


def race(config: TagRowsConfig, console: Console) -> list[tuple]:
    rows = []
    for shape in SHAPES:
        model, policy, batch, prompts = contestant(shape, config)
        parts = {"train step": (lambda: train_step(model, policy, batch), ("peft", "row-wise")),
                 "decode": (lambda: decode(model, policy, prompts, config), ("peft", "written", "row-wise"))}
        for part, (work, names) in parts.items():
            load = os.getloadavg()[0]
            best = {name: float("inf") for name in names}
            for round_ in range(config.repeats + 1):
                for name in names:
                    started = time.perf_counter()
                    with forward_named(model, name):
                        work()
                    took = time.perf_counter() - started
                    if round_:  # round 0 warms up
                        best[name] = min(best[name], took)
            rows.append((shape, part, best, load, os.getloadavg()[0]))
            console.log(f"{shape} {part}: " + ", ".join(f"{n} {t:.3f} s" for n, t in best.items()))
        del model
    return rows


def main(argv: list[str] | None = None):
    config = parse_config(TagRowsConfig, argv, description=__doc__.split("\n")[0])
    if config.quick:
        config.layers, config.tokens, config.new_tokens, config.repeats = 2, 64, 8, 1
    if config.threads:
        torch.set_num_threads(config.threads)
    console = Console()
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {config}")
    rows = race(config, console)
    table = Table(title=f"Tag rows: peft's forward vs row-wise ({config.layers} layers, best of {config.repeats})")
    for column in ("shape", "part", "peft s", "written s", "row-wise s", "peft / row-wise", "written / row-wise",
                   "load before/after"):
        table.add_column(column, justify="left" if column in ("shape", "part") else "right")
    for shape, part, best, before, after in rows:
        written = "written" in best
        table.add_row(shape, part, f"{best['peft']:.3f}", f"{best['written']:.3f}" if written else "-",
                      f"{best['row-wise']:.3f}", f"{best['peft'] / best['row-wise']:.2f}x",
                      f"{best['written'] / best['row-wise']:.2f}x" if written else "-", f"{before:.2f} / {after:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
