"""LoRA's adapter casts in a sampler call: kept for the call (`lora_dtype.casts_kept`) against made at every call.

    python bench/lora_casts.py                               # Qwen2.5-Coder-0.5B + LoRA: ~4 min
    python bench/lora_casts.py --quick --model tiny:qwen2    # the same code on a random tiny model: seconds

A bfloat16 model's LoRA layers compute in bfloat16 from float32 parameters (lora_dtype.py): each
call casts A and the scaled B down. A decode step calls every adapted projection once (168 on
Qwen2.5-0.5B with the seven projections adapted), so the sampler keeps the casts for its call,
where the adapter cannot change. Here the same sampler call with the casts kept (the library)
and made at every call (`casts_kept` swapped for a scope that keeps nothing): --prompts GSM8K
train questions x --samples responses, exactly --max-new-tokens tokens each (T = 1, no stop ids,
no tags), at each lane count of --lanes (prompts x samples), the model as train.py loads it (LoRA
r16 on the seven projections and the tag rows). Both sample the same tokens (asserted). Seconds
per call, taking turns, best of --rounds; the load average beside them.
Not here: training (its casts are made at every call: the gradient goes through them), float32
models (no casts: peft's own forward).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
from rich.console import Console
from rich.table import Table

from common import bench_args, bench_parser, gsm8k_prompts, load_bench_model, write_report
from nanopar import lora_dtype
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample


@contextlib.contextmanager
def casts_made_at_every_call(model):
    """The scope that keeps nothing: every LoRA call casts its adapter anew."""
    yield


def timed_call(model, prompts, policy, settings, samples: int, keep: bool) -> tuple[float, list]:
    """(seconds, the sampled ids) of one sampler call, the casts kept or not."""
    scope = lora_dtype.casts_kept  # what `sample` enters for its call
    lora_dtype.casts_kept = scope if keep else casts_made_at_every_call
    try:
        begun = time.perf_counter()
        rollouts = sample(model, prompts, policy, settings, [], samples)
        return time.perf_counter() - begun, [r.ids for r in rollouts]
    finally:
        lora_dtype.casts_kept = scope


def main(argv: list[str] | None = None) -> dict:
    parser = bench_parser(__doc__)
    parser.add_argument("--lanes", default="2x8,8x8", help="comma list of prompts x samples")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens a response, exactly (no stop)")
    args = bench_args(parser, argv, (3, "timed calls of each side"),
                      dict(lanes="1x2", max_new_tokens=8, rounds=1), "1 x 2 x 8 tokens, one round")
    console = Console(width=150)
    started = time.perf_counter()
    model, tokenizer, dtype = load_bench_model(args, console)
    policy = Policy(None, temperature=1.0, vocab_size=len(tokenizer))  # no tags: nothing forks
    settings = SamplerSettings(max_new_tokens=args.max_new_tokens, seed=0)
    table = Table(title=f"one sampler call, exactly {args.max_new_tokens} tokens a lane, {dtype}, best of {args.rounds}")
    for column in ("lanes", "casts kept s", "made at every call s", "kept / every call", "load (1 min)"):
        table.add_column(column, justify="right")
    rows = []
    for spec in args.lanes.split(","):
        count, samples = (int(n) for n in spec.split("x"))
        prompts = gsm8k_prompts(tokenizer, count)
        timed_call(model, prompts, policy, settings, samples, keep=True)  # warm-up
        before, times, ids = os.getloadavg()[0], {True: [], False: []}, {}
        for round_ in range(args.rounds):
            for keep in (True, False) if round_ % 2 == 0 else (False, True):
                seconds, ids[keep] = timed_call(model, prompts, policy, settings, samples, keep)
                times[keep].append(seconds)
        assert ids[True] == ids[False], "kept casts sampled other tokens"
        row = {"lanes": count * samples, "kept": min(times[True]), "every_call": min(times[False]),
               "load": f"{before:.1f} -> {os.getloadavg()[0]:.1f}"}
        row["ratio"] = row["kept"] / row["every_call"]
        rows.append(row)
        table.add_row(f"{count} x {samples}", f"{row['kept']:.2f}", f"{row['every_call']:.2f}", f"{row['ratio']:.2f}",
                      row["load"])
    console.print(table)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(), "rows": rows,
              "seconds": time.perf_counter() - started}
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
