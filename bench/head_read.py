"""Benchmark the two training reads of the LM head across vocabulary sizes: where the chunked one pays.

    python bench/head_read.py                        # vocabularies 128 .. 151,936, 8 rows x 152 tokens
    python bench/head_read.py --vocabs 128 32768 --repeats 1

`forward.trace_logprobs` reads the policy's log-probs either "plain" (the model's full [B, T, V]
logits, their float32 log_softmax, gather) or "chunked" (head.py: the head applied to the
positions read, CHUNK_BYTES of float32 logits at a time, recomputed in backward). For each
vocabulary size a tiny Qwen3 of the same body (hidden 128, 4 layers) reads one micro-batch of
GRPO rollouts (8 rows x 152 tokens, the 128 response tokens of each weighted), with the entropy,
forward + backward, under each read: the best time of `repeats` rounds after a warm-up, and the
peak resident-memory rise (bench/common.py) of the warm-up. `CHUNKED_HEAD_FROM_VOCAB` in
forward.py, the size from which "auto" takes the chunked read, is read off this table: the size
from which the chunked read's saving is the logits' (a quarter of the read's memory and more),
not a constant few MB.
Not here: sampling, the optimiser (bench/train_step.py), GPU memory (bench/memory_plan.py).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from common import MB, PAD, PeakRSS
from nanopar.config import parse_config
from nanopar.forward import CHUNKED_HEAD_FROM_VOCAB, head_read_for, make_batch, trace_logprobs
from nanopar.policy import Policy
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model


@dataclass
class HeadReadConfig:
    vocabs: tuple[int, ...] = (128, 2048, 8192, 32768, 65536, 151936)  # vocabulary sizes (embedding rows) to read with
    rows: int = 8  # rows of the micro-batch (GRPOSettings.micro_batch's default)
    prompt_tokens: int = 24  # prompt tokens of each row (read, not weighted)
    response_tokens: int = 128  # response tokens of each row (weighted: the loss reads them)
    repeats: int = 3  # timed rounds per read (the best counts), after a warm-up round


def micro_batch(vocab: int, config: HeadReadConfig):
    """One micro-batch of random ids below the tags, every response token weighted. -> (batch, tags)"""
    g = torch.Generator().manual_seed(0)
    tags = TagIds(*range(vocab - 6, vocab))
    word = lambda n: torch.randint(1, vocab - 6, (n,), generator=g).tolist()  # noqa: E731
    prompts = [word(config.prompt_tokens) for _ in range(config.rows)]
    responses = [word(config.response_tokens) for _ in range(config.rows)]
    return make_batch(prompts, responses, [[1.0] * len(r) for r in responses], PAD), tags


def read_once(model, batch, policy, head_read: str) -> None:
    """The read with its entropy, forward + backward, as grpo_update does it."""
    model.zero_grad(set_to_none=True)
    logprobs, entropy = trace_logprobs(model, batch, policy, with_entropy=True, head_read=head_read)  # [B, T-1]
    (logprobs * batch.target_mask).sum().backward()


def measure(vocab: int, config: HeadReadConfig) -> dict[str, tuple[float, float]]:
    """{read: (best seconds, peak MB of the warm-up)} for one vocabulary size."""
    torch.manual_seed(0)
    model = tiny_qwen_model(vocab_size=vocab, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2).train()
    batch, tags = micro_batch(vocab, config)
    policy = Policy(tags, "structured", 1.0, vocab)
    out = {}
    for read in ("plain", "chunked"):
        with PeakRSS() as watch:
            read_once(model, batch, policy, read)
        best = math.inf
        for _ in range(config.repeats):
            start = time.perf_counter()
            read_once(model, batch, policy, read)
            best = min(best, time.perf_counter() - start)
        out[read] = (best, watch.rise / MB)
    return out


def main(argv: list[str] | None = None):
    config = parse_config(HeadReadConfig, argv, description=__doc__.splitlines()[0])
    console = Console(width=200)
    console.print(f"CPU, {torch.get_num_threads()} threads; load average before: {os.getloadavg()[0]:.2f}")
    tokens = config.rows * (config.prompt_tokens + config.response_tokens)
    table = Table(title=f"the training read alone, forward + backward with the entropy: {config.rows} rows x "
                        f"{config.prompt_tokens + config.response_tokens} tokens ({tokens:,}), tiny Qwen3 body")
    for column in ("vocabulary", "plain: s", "chunked: s", "chunked / plain time", "plain: MB", "chunked: MB",
                   "chunked / plain memory", "auto reads"):
        table.add_column(column, justify="right")
    for vocab in config.vocabs:
        got = measure(vocab, config)
        (t0, m0), (t1, m1) = got["plain"], got["chunked"]
        table.add_row(f"{vocab:,}", f"{t0:.3f}", f"{t1:.3f}", f"{t1 / t0:.2f}", f"{m0:,.0f}", f"{m1:,.0f}",
                      f"{m1 / m0:.2f}" if m0 > 0 else "", head_read_for("auto", vocab))
    table.caption = (f"best of {config.repeats} after a warm-up; MB = peak resident-set rise of the warm-up; "
                     f"auto = chunked from CHUNKED_HEAD_FROM_VOCAB = {CHUNKED_HEAD_FROM_VOCAB:,} rows")
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
