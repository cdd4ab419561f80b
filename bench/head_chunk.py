"""Benchmark the chunked LM-head read's chunk size at Qwen's head: how many positions per chunk.

    python bench/head_chunk.py                         # 1,024 positions, chunks 110 .. 1,024, bfloat16
    python bench/head_chunk.py --chunks 220 880 --repeats 1

`head.head_logprobs` applies the head to `chunk` positions at a time. This head (frozen, linear)
takes the slopes road: per chunk the logits' product and, in the forward, (onehot - softmax) by
the weight, two products of [chunk, d] by [d, V]; the recompute road (any other head) pays a third,
the logits again in backward. Both make float32 passes over each [chunk, V] block of logits,
written into buffers made once per call. A second table races those buffers against a fresh
float32 tensor per chunk (the read before them), alternating, the same log-probs and gradient
asserted; a third races the two roads, the same log-probs asserted and the gradients' largest
difference printed. Its default chunk holds CHUNK_BYTES of float32
logits (220 positions on this head). Here one micro-batch of hidden states ([positions, d],
random, the policy's real vocabulary) is read with the entropy, forward + backward, as the GRPO
update reads it, through a bfloat16 head of Qwen2.5-0.5B's shape (896 -> 151,936), at each chunk
size: best of `repeats` after a warm-up, the head's products' rate (2 per chunk), and the peak
resident-memory rise of the warm-up, each against the first chunk size of the list in the same
process. Not here: the decoder (bench/train_step.py), the read's other callers.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from common import MB, PeakRSS
from nanopar.config import parse_config
from nanopar import head as head_module
from nanopar.head import CHUNK_BYTES, head_logprobs


@dataclass
class HeadChunkConfig:
    chunks: tuple[int, ...] = (220, 110, 440, 660, 880, 1024)  # positions per chunk; the first is the baseline (the default on this head)
    positions: int = 1024  # positions read (one micro-batch of --micro-batch-tokens 1024)
    hidden: int = 896  # the head's input width (Qwen2.5-0.5B)
    vocab: int = 151_936  # the head's rows (Qwen2.5's embedding)
    real_vocab: int = 151_665  # the policy's vocabulary (the tokenizer's, below the padded rows)
    temperature: float = 0.7  # the policy's T (a division per chunk, as the GRPO read does)
    repeats: int = 3  # timed rounds per chunk size (the best counts), after a warm-up round
    buffers: bool = True  # also race the reused float32 buffers against a fresh tensor per chunk, at the first chunk size
    roads: bool = True  # also race the slopes taken in the forward against the recompute, at the first chunk size


def read_once(head, hidden, targets, config: HeadChunkConfig, chunk: int) -> torch.Tensor:
    """The read with its entropy, forward + backward. -> the chosen log-probs [n] (hidden.grad holds their
    sum's gradient)"""
    hidden.grad = None
    chosen, _ = head_logprobs(hidden, targets, head, config.temperature, config.real_vocab, with_entropy=True,
                              chunk=chunk)  # [n]
    chosen.sum().backward()
    return chosen.detach()


def main(argv: list[str] | None = None) -> list[dict]:
    config = parse_config(HeadChunkConfig, argv, description=__doc__.splitlines()[0])
    console = Console(width=200)
    console.print(f"CPU, {torch.get_num_threads()} threads; load average before: {os.getloadavg()[0]:.2f}; "
                  f"default chunk: {max(1, CHUNK_BYTES // (4 * config.real_vocab))} positions")
    torch.manual_seed(0)
    head = torch.nn.Linear(config.hidden, config.vocab, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(config.positions, config.hidden, dtype=torch.bfloat16, requires_grad=True)  # [n, d]
    targets = torch.randint(0, config.real_vocab, (config.positions,))  # [n]
    flops = 2 * 2 * config.positions * config.hidden * config.vocab  # the logits, the slopes' product
    table = Table(title=f"the chunked head read, forward + backward with the entropy: {config.positions:,} positions, "
                        f"bfloat16 head {config.hidden} -> {config.vocab:,}")
    for column in ("chunk", "s", "x baseline time", "head products TFLOPS", "MB", "x baseline memory"):
        table.add_column(column, justify="right")
    base, rows = None, []
    for chunk in config.chunks:
        with PeakRSS() as watch:
            read_once(head, hidden, targets, config, chunk)
        best = math.inf
        for _ in range(config.repeats):
            start = time.perf_counter()
            read_once(head, hidden, targets, config, chunk)
            best = min(best, time.perf_counter() - start)
        rise = watch.rise / MB
        base = base or (best, rise)
        rows.append({"chunk": chunk, "seconds": best, "mb": rise})
        table.add_row(f"{chunk:,}", f"{best:.3f}", f"{best / base[0]:.2f}", f"{flops / best / 1e12:.2f}",
                      f"{rise:,.0f}", f"{rise / base[1]:.2f}" if base[1] > 0 else "")
    table.caption = (f"best of {config.repeats} after a warm-up; MB = peak resident-set rise of the warm-up; "
                     f"TFLOPS counts the head's two products per chunk, not the float32 passes")
    console.print(table)
    if config.buffers:
        rows.append(race_buffers(head, hidden, targets, config, console))
    if config.roads:
        rows.append(race_roads(head, hidden, targets, config, console))
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


class FreshBuffers(head_module._ChunkBuffers):
    """The read before its buffers: a new float32 [c, V'] tensor every time one is asked for."""

    def get(self, which: int, like: torch.Tensor) -> torch.Tensor:
        width = min(self.vocab_size or like.shape[-1], like.shape[-1])
        return like.new_empty(like.shape[0], width, dtype=torch.float32)


def alternate(head, hidden, targets, config: HeadChunkConfig, patches: dict) -> tuple[dict, dict]:
    """The read at the first chunk size under each of `patches` ({name: (attribute of nanopar.head,
    the value it takes)}) in turn, `repeats` rounds after a warm-up round, the attribute restored
    after each. -> ({name: best seconds}, {name: (log-probs, input gradient)} of its last read)"""
    best, outputs = {name: math.inf for name in patches}, {}
    for round in range(config.repeats + 1):  # round 0 warms up
        for name, (attribute, value) in patches.items():
            kept = getattr(head_module, attribute)
            setattr(head_module, attribute, value)
            try:
                start = time.perf_counter()
                chosen = read_once(head, hidden, targets, config, config.chunks[0])
                took = time.perf_counter() - start
            finally:
                setattr(head_module, attribute, kept)
            outputs[name] = (chosen, hidden.grad.clone())
            best[name] = min(best[name], took) if round else best[name]
    return best, outputs


def race_table(title: str, column: str, best: dict, caption: str, console: Console) -> None:
    """Each contender's best time and its ratio to the first."""
    first = next(iter(best.values()))
    table = Table(title=title)
    for name in (column, "s", f"x {next(iter(best))}"):
        table.add_column(name, justify="right")
    for name, seconds in best.items():
        table.add_row(name, f"{seconds:.3f}", f"{seconds / first:.2f}")
    table.caption = f"best of {caption}"
    console.print(table)


def race_buffers(head, hidden, targets, config: HeadChunkConfig, console: Console) -> dict:
    """Reused buffers against fresh tensors at the first chunk size, alternating: best of `repeats` each."""
    best, outputs = alternate(head, hidden, targets, config, {"fresh": ("_ChunkBuffers", FreshBuffers),
                                                               "reused": ("_ChunkBuffers", head_module._ChunkBuffers)})
    if not all(torch.equal(a, b) for a, b in zip(outputs["fresh"], outputs["reused"])):
        raise AssertionError("reused buffers read other numbers than fresh tensors")
    race_table(f"float32 buffers, chunk {config.chunks[0]:,}", "buffers", best,
               f"{config.repeats} alternating rounds after a warm-up round; reused within a call against a fresh "
               f"tensor per chunk, the same log-probs and gradient (checked)", console)
    return {"chunk": config.chunks[0], **best}


def race_roads(head, hidden, targets, config: HeadChunkConfig, console: Console) -> dict:
    """The slopes taken in the forward against the recompute at the first chunk size, alternating:
    best of `repeats` each; the log-probs equal, the input gradients' largest difference reported."""
    best, outputs = alternate(head, hidden, targets, config, {"recompute": ("_linear_head", lambda *args: None),
                                                               "slopes": ("_linear_head", head_module._linear_head)})
    if not torch.equal(outputs["slopes"][0], outputs["recompute"][0]):
        raise AssertionError("the two roads read other log-probs")
    want = outputs["recompute"][1].float()
    difference = ((outputs["slopes"][1].float() - want).abs().max() / want.abs().max()).item()
    race_table(f"the gradient's road, chunk {config.chunks[0]:,}", "road", best,
               f"{config.repeats} alternating rounds after a warm-up round; the same log-probs (checked); input "
               f"gradients differ by at most {difference:.1e} of their largest value ({hidden.dtype})", console)
    return {"chunk": config.chunks[0], **best, "difference": difference}


if __name__ == "__main__":
    main()
