"""GRPO's row skip: `grpo_update` leaving rows of advantage 0 unread, against the same update reading every row.

    python bench/row_skip.py                               # Qwen2.5-Coder-0.5B + LoRA, 4 x 8 x 128 tokens: ~8 min
    python bench/row_skip.py --quick --model tiny:qwen2    # the same code on a random tiny model: seconds

Without a KL term a row whose advantage is 0 adds exactly 0 to GRPO's gradient, so `grpo_update`
does not read it (grpo.py). What that saves depends on how many groups have a signal (a group of
one reward has none), so the script times the update at several shares of such groups, on one
rollout batch sampled once: --prompts x --group-size responses of exactly --max-new-tokens tokens
(T = 1, no stop ids, no tags: nothing forks), the model as train.py loads it (LoRA r16 on the
seven projections and the tag rows), micro-batches packed under --micro-batch-tokens (the
qwen-rl preset's 2,048), token-mean loss, AdamW at lr 0 (it does all its work, the weights stay
put, so every call times the same work).

Rewards: in a group with a signal, 1 and 0 in turn (every advantage +-1); in the others, all 0
(every advantage exactly 0). The two sides of a row, taking turns, best of --rounds:
  skip       `grpo_update` as the library runs it: the rows of advantage 0 are not read
  read all   the same call with those advantages set to 1e-6 instead, so every row is read (their
             products stay well inside float32's normal range, where 1e-30's would not)
Both take the same step up to the 1e-6 rows' share and the rounding of other micro-batches (rows
packed otherwise, padded otherwise: in bfloat16 that moves the gradient by a fraction of a
percent): the table's last column is the ratio of their gradient norms. Not here: sampling (the
same for both), a KL term (it reads every row).
"""

from __future__ import annotations

import os
import time

import torch
from rich.console import Console
from rich.table import Table

from common import bench_args, bench_parser, gsm8k_prompts, load_bench_model, write_report
from nanopar.grpo import GRPOSettings, group_advantages, grpo_update
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample

UNREAD = 1e-6  # the "read all" side's advantage for a row of no signal: read, adding ~1e-6 of the gradient


def advantages_with_signal(groups: int, group_size: int, with_signal: int) -> torch.Tensor:
    """[groups x G] advantages: the first `with_signal` groups hold 1 and 0 in turn, the rest all 0."""
    rewards = torch.zeros(groups, group_size)  # [P, G]
    rewards[:with_signal, ::2] = 1.0
    return group_advantages(rewards.flatten(), group_size)


def timed_update(model, optimizer, rollouts, advantages, policy, settings, pad_id) -> tuple[float, dict, float]:
    """(seconds, grpo_update's metrics, the gradient norm before clipping) of one update."""
    started = time.perf_counter()
    metrics = grpo_update(model, optimizer, rollouts, advantages, policy, settings, pad_id)
    return time.perf_counter() - started, metrics, metrics["grad_norm"]


def main(argv: list[str] | None = None) -> dict:
    parser = bench_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=4, help="GSM8K train questions (groups)")
    parser.add_argument("--group-size", type=int, default=8, help="responses a question (G)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens a response, exactly (no stop)")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048, help="GRPOSettings.micro_batch_tokens")
    args = bench_args(parser, argv, (2, "timed rounds after the warm-up"),
                      dict(prompts=2, group_size=4, max_new_tokens=16, rounds=1), "2 x 4 x 16 tokens, one round")
    console = Console(width=150)
    started = time.perf_counter()
    model, tokenizer, dtype = load_bench_model(args, console)
    prompts = gsm8k_prompts(tokenizer, args.prompts)
    policy = Policy(None, temperature=1.0, vocab_size=len(tokenizer))  # no tags: nothing forks
    rollouts = sample(model, prompts, policy, SamplerSettings(max_new_tokens=args.max_new_tokens, seed=0), [],
                      args.group_size)  # [P * G], the same batch for every call
    settings = GRPOSettings(group_size=args.group_size, micro_batch_tokens=args.micro_batch_tokens)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0, weight_decay=0.0)
    pad = tokenizer.pad_token_id or 0
    shares = sorted({args.prompts, max(1, args.prompts // 2), max(1, args.prompts // 4)}, reverse=True)
    cases = []
    for with_signal in shares:
        skip = advantages_with_signal(args.prompts, args.group_size, with_signal)
        cases.append((with_signal, skip, torch.where(skip == 0, UNREAD, skip)))
    results = {case[0]: {"skip": [], "read all": []} for case in cases}
    for round_ in range(args.rounds + 1):  # round 0: the warm-up, not counted
        for with_signal, skip, read_all in cases:
            for side, advantages in (("skip", skip), ("read all", read_all)):
                run = timed_update(model, optimizer, rollouts, advantages, policy, settings, pad)
                if round_:
                    results[with_signal][side].append(run)
    load = f"{os.getloadavg()[0]:.1f}"
    table = Table(title=f"grpo_update with and without reading the rows of advantage 0: {args.prompts} prompts x "
                        f"{args.group_size} x {args.max_new_tokens} tokens, {dtype}, micro-batches <= "
                        f"{args.micro_batch_tokens} tokens, best of {args.rounds}")
    for column in ("groups with a signal", "rows read (skip)", "skip s", "read all s", "skip / read all",
                   "grad norm skip / read all"):
        table.add_column(column, justify="right")
    rows = []
    for with_signal, _, _ in cases:
        skip_runs, all_runs = results[with_signal]["skip"], results[with_signal]["read all"]
        best_skip, best_all = min(r[0] for r in skip_runs), min(r[0] for r in all_runs)
        row = {"with_signal": with_signal, "groups": args.prompts, "read_rows": skip_runs[0][1]["read_rows"],
               "read_rows_all": all_runs[0][1]["read_rows"], "skip_seconds": best_skip, "read_all_seconds": best_all,
               "ratio": best_skip / best_all, "grad_norm_ratio": skip_runs[0][2] / all_runs[0][2]}
        rows.append(row)
        table.add_row(f"{with_signal} of {args.prompts}", f"{row['read_rows']:.0%}", f"{best_skip:.2f}", f"{best_all:.2f}",
                      f"{row['ratio']:.2f}", f"{row['grad_norm_ratio']:.6f}")
    table.caption = f"load average {load}; read all: the rows of no signal at advantage {UNREAD:g} (the docstring)"
    console.print(table)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(),
              "rows": rows, "seconds": time.perf_counter() - started}
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
