"""The sampler's KV cache: a step's column written in place (`LazyLaneCache`) against a concatenation (`LaneCache`).

    python bench/kv_append.py                               # Qwen2.5-Coder-0.5B + LoRA, 8 x 8 x 384 tokens: ~7 min
    python bench/kv_append.py --quick --model tiny:qwen2    # the same code on a random tiny model: seconds

A decode step adds one column of keys and values to every lane in every layer. The plain
`LaneCache` adds it as transformers' `DynamicCache` does, by concatenation: a new tensor of the
whole cache per layer and step, so a step copies every lane's keys and values once (and, on a
CPU, touches fresh pages for them). The sampler's default `LazyLaneCache` keeps each layer's
cache in a buffer with spare columns and writes the column into them (kvcache.py). The copy
grows with lanes x tokens, so the figure that matters is a GRPO step's sampling: --prompts GSM8K
train questions x --samples responses, exactly --max-new-tokens tokens each (T = 1, no stop ids,
no tags: no rebuild but the first duplication, so the two differ by the append alone), the model
as train.py loads it (LoRA r16 on the seven projections and the tag rows). Both sample the same
tokens (asserted). Seconds per sampler call, taking turns (plain, lazy, lazy, plain, ...), best of
--rounds each; the load average beside them.
Not here: forks and merges (bench/sampler.py's cache rebuild), evaluation batches.
"""

from __future__ import annotations

import os
import time

import torch
from rich.console import Console
from rich.table import Table

from common import bench_args, bench_parser, gsm8k_prompts, load_bench_model, write_report
from nanopar.kvcache import LaneCache, LazyLaneCache
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample

CACHES = {"concatenation (LaneCache)": LaneCache, "in place (LazyLaneCache)": LazyLaneCache}


def main(argv: list[str] | None = None) -> dict:
    parser = bench_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=8, help="GSM8K train questions")
    parser.add_argument("--samples", type=int, default=8, help="responses a question (lanes = prompts x samples)")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="tokens a response, exactly (no stop)")
    args = bench_args(parser, argv, (2, "timed calls of each cache"),
                      dict(prompts=2, samples=2, max_new_tokens=16, rounds=1), "2 x 2 x 16 tokens, one round")
    console = Console(width=150)
    started = time.perf_counter()
    model, tokenizer, dtype = load_bench_model(args, console)
    model.eval()
    prompts = gsm8k_prompts(tokenizer, args.prompts)
    policy = Policy(None, temperature=1.0, vocab_size=len(tokenizer))  # no tags: nothing forks
    settings = SamplerSettings(max_new_tokens=args.max_new_tokens, seed=0)
    seconds = {name: [] for name in CACHES}
    tokens, load_before = {}, os.getloadavg()[0]
    order = list(CACHES)
    for round_ in range(args.rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            begun = time.perf_counter()
            rollouts = sample(model, prompts, policy, settings, [], args.samples, lane_cache=CACHES[name])
            seconds[name].append(time.perf_counter() - begun)
            tokens.setdefault(name, [r.ids for r in rollouts])
    first, second = (tokens[name] for name in CACHES)
    assert first == second, "the two caches sampled different tokens"
    lanes = args.prompts * args.samples
    load = f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    best = {name: min(times) for name, times in seconds.items()}
    plain, lazy = (best[name] for name in CACHES)
    table = Table(title=f"one sampler call, {args.prompts} prompts x {args.samples} x {args.max_new_tokens} tokens "
                        f"({lanes} lanes), {dtype}, best of {args.rounds}")
    for column in ("cache", "seconds", "tokens/s", "concatenation / in place", "load (1 min)"):
        table.add_column(column, justify="right")
    for name in CACHES:
        table.add_row(name, f"{best[name]:.2f}", f"{lanes * args.max_new_tokens / best[name]:.1f}",
                      f"{plain / best[name]:.2f}", load)
    console.print(table)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(), "seconds_each": seconds,
              "best": best, "ratio": plain / lazy, "load": load, "seconds": time.perf_counter() - started}
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
