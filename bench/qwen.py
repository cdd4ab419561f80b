"""A real Qwen on this CPU: nanopar against this machine's floor, the sampler vs `generate`, forking, steps.

Speed and memory of nanopar on real weights: each phase of its work against the floor of the same
rows on this machine, the sampler against `model.generate`, forking against sequential decoding,
and one training step of each kind under the old settings and the new ones.

    python bench/qwen.py                              # every part on Qwen2.5-Coder-0.5B: 1-2 hours on 2 cores, ~18 GB peak
    python bench/qwen.py --only floor                 # one part (floor, sampler, fork or steps)
    python bench/qwen.py --quick                      # tiny sizes, one round: ~6 minutes, part 3 still > 4 GB
    python bench/qwen.py --quick --model tiny:qwen2   # the same code on a random tiny model: seconds

--model (pypi:qwen2.5-coder-0.5b) loads with LoRA r16 and the tag rows, as train.py loads it;
--dtype auto is what `defaults.cpu_dtype` picks on a CPU (bfloat16 where it has bfloat16
instructions, else float32). The prompts are GSM8K questions with Qwen's one-line answer request
(`instructions_named("answer")`, the qwen preset's), in the chat template (part 0: random ids).
 0. floor: (a) one matrix product repeated on one weight that stays in cache, per dtype, at the
    model's MLP and head shapes: this machine's best case, in TFLOPS; (b) nanopar's prefill
    (--prefill-prompts x --prefill-tokens, the sampler's, `logits_to_keep` the last position),
    a decode step at each of --decode-lanes lanes (structured policy with the tags, blocks
    banned so every step has its lanes' rows: (a call of 1 + --decode-steps tokens - a call of 1)
    / steps, the draw and the log-probs included) and a training micro-batch (--train-rows x
    --train-tokens, `trace_logprobs` forward + backward, one parallel block a row), each against
    its floor: the model's own dense layers over the same rows and nothing else
    (bench/floor.py: the decoder's linears and the head; for the prefill the head over one row a
    prompt; for training forward and the input's gradient), its ratio, the floor's TFLOPS and
    weight bytes a second; then a profile table per phase (torch.profiler, shapes recorded, the
    top --top operations by self time). On a GPU the same code waits for the device and profiles
    its kernels.
 1. sampler: nanopar's sampler against `model.generate` at --lanes lanes (the first GSM8K test
    questions), T = 1, no tags, exactly --new-tokens tokens a lane (the sampler gets no stop ids,
    generate min_new_tokens = max_new_tokens). Both read the tag rows row by row (tag_rows.py), so
    the race is the decode loop. tokens/s, ratio, ms a decode step (wall / tokens a lane, the
    prefill included).
 2. fork: eval.py's speedup (`eval_report.speedup`, its --speedup-batches 1): the same prompts
    decoded forking (structured, --paths paths) against the tags read as text, at --fork-lanes
    lanes of distinct questions whose prompts have one length. The real Qwen writes no block, so
    a hook on the model forces <Parallel> --lead tokens into every response (one rotary
    position), bans the other tags and EOS; max_path_tokens (--path-tokens) closes each path.
    Token-level acceleration = response tokens / critical-path tokens of the forked warm-up call
    (the timed calls' first, same seed); wall-clock speed-up = forked / sequential tokens/s.
 3. steps: one cold-start step (`sft_step`, Parallel-GSM8K's first 4 traces) and one GRPO step
    (`grpo_step`, --prompts x --group-size GSM8K train questions, --grpo-tokens tokens, the
    preset's T, K and path budget) under "before" (float32, micro-batches of 4 rows) and "after"
    (train.py's --preset qwen: dtype auto, rows packed under 1,024 tokens): seconds (GRPO split
    into sampling and update) and peak resident-memory rise (`common.PeakRSS`), each step with
    a fresh optimiser. The reward numbers the responses (`bench_order`): every group has a
    signal, so the update always runs. The two settings load one after the other.
Parts 0-2: best of --rounds rounds after a short warm-up, contestants taking turns. Part 3:
one step each after a small warm-up step (a full GRPO step takes 10-20 minutes here). Every row
shows the 1-minute load average before and after it. --quick: --lanes 1 4, --new-tokens 16,
--fork-lanes 1 4, --fork-tokens 40, --path-tokens 12, --prompts 2, --group-size 2, --grpo-tokens
16, traces cut to their first 128 tokens, part 0 at 2 x 16 prefill tokens, lanes 1 4, 4 steps,
a 2 x 32 training batch, one round (it overrides those flags).
Not here: 4-bit weights, accuracy (eval.py), more than one step. On a GPU part 0 runs unchanged
(bench/gpu_check.py runs it on its random real-size models).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning threads crawl on a shared CPU

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from common import MB, bench_args, bench_order, hand_back_free_memory, load_average, peak_rise, write_report
from floor import FloorSizes, floor_part

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: train.py's presets
from nanopar.data import load_problems, load_traces  # noqa: E402
from nanopar.defaults import REAL_SAMPLING, cpu_dtype, on_cpu  # noqa: E402
from nanopar.eval_report import speedup  # noqa: E402
from nanopar.grpo import GRPOSettings, grpo_step  # noqa: E402
from nanopar.model import ModelSettings, cpu_bf16_instructions, load_model  # noqa: E402
from nanopar.optim import make_optimizer  # noqa: E402
from nanopar.policy import Policy  # noqa: E402
from nanopar.prompts import build_prompt, instructions_named, stop_ids  # noqa: E402
from nanopar.sampler import SamplerSettings, sample  # noqa: E402
from nanopar.sft import sft_step  # noqa: E402
from nanopar.tags import PARALLEL_R1  # noqa: E402
from nanopar.rewards import register  # noqa: E402
from train import PRESETS  # noqa: E402

QWEN = PRESETS["qwen"]  # the "after" settings of part 3, and the prompts' instructions
PARTS = ("floor", "sampler", "fork", "steps")
register("bench_order", replace=True)(bench_order)  # part 3's reward




def load(name: str, dtype: str):
    """(model, tokenizer) with LoRA (B = 0: the weights as shipped) and the tag rows, as train.py loads them."""
    torch.manual_seed(0)
    return load_model(ModelSettings(name, dtype=dtype, lora=True))


def timed(fn):
    """(wall seconds of fn(), its result)"""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def race(fns, rounds: int):
    """Best wall time of each function over `rounds` rounds, taking turns (who goes first alternates).
    -> ([seconds], [each one's last result], load average before -> after)"""
    before, best, results = os.getloadavg()[0], [float("inf")] * len(fns), [None] * len(fns)
    for round_ in range(rounds):
        for i in range(len(fns)) if round_ % 2 == 0 else reversed(range(len(fns))):
            seconds, results[i] = timed(fns[i])
            best[i] = min(best[i], seconds)
    return best, results, load_average(before)


def generate(model, prompts: list[list[int]], pad: int, tokens: int, eos: list[int]) -> torch.Tensor:
    """`model.generate` at T = 1, no top-k / top-p, exactly `tokens` new tokens a row. -> ids [N, tokens]"""
    T = max(map(len, prompts))
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts], device=model.device)  # [N, T], left-padded
    starts = torch.tensor([[T - len(p)] for p in prompts], device=model.device)  # [N, 1]
    mask = (torch.arange(T, device=model.device) >= starts).long()  # [N, T]: 0 on the padding
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                         top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=eos,
                         pad_token_id=pad)
    return out[:, T:]  # [N, tokens]


def sampler_part(model, tokenizer, args, console) -> list[dict]:
    plain = Policy(None, temperature=1.0, vocab_size=len(tokenizer))  # no tags: sequential decoding
    eos, pad, N = stop_ids(model, tokenizer), tokenizer.pad_token_id or 0, args.new_tokens
    instructions = instructions_named(QWEN["instructions"])
    problems = load_problems("gsm8k", limit=max(args.lanes))
    table = Table(title=f"1. nanopar's sampler vs model.generate: T = 1, no tags, {N} tokens a lane, best of {args.rounds}")
    for column in ("lanes", "nanopar tok/s", "generate tok/s", "nanopar / generate", "ms / step (nanopar, generate)", "load"):
        table.add_column(column, justify="right")
    rows = []
    for lanes in args.lanes:
        prompts = [build_prompt(p, tokenizer, instructions) for p in problems[:lanes]]
        ours = lambda n: sample(model, prompts, plain, SamplerSettings(max_new_tokens=n, seed=0), eos_ids=[])
        theirs = lambda n: generate(model, prompts, pad, n, eos)
        ours(4), theirs(4)  # warm-up: a short call of each
        (t_ours, t_theirs), (rollouts, ids), load = race([lambda: ours(N), lambda: theirs(N)], args.rounds)
        assert [r.stats.new_tokens for r in rollouts] == [N] * lanes and tuple(ids.shape) == (lanes, N)
        tokens = lanes * N
        row = {"lanes": lanes, "new_tokens": N, "nanopar_tokens": sum(r.stats.new_tokens for r in rollouts),
               "generate_tokens": ids.numel(), "nanopar_seconds": t_ours, "generate_seconds": t_theirs,
               "nanopar_tokens_per_second": tokens / t_ours, "generate_tokens_per_second": tokens / t_theirs,
               "ratio": t_theirs / t_ours, "nanopar_ms_per_step": 1000 * t_ours / N,
               "generate_ms_per_step": 1000 * t_theirs / N, "load": load}
        rows.append(row)
        table.add_row(str(lanes), f"{row['nanopar_tokens_per_second']:.1f}", f"{row['generate_tokens_per_second']:.1f}",
                      f"{row['ratio']:.2f}", f"{row['nanopar_ms_per_step']:.0f}, {row['generate_ms_per_step']:.0f}", load)
    table.caption = ("nanopar / generate near 1: the sampler decodes at generate's speed, the rate is this CPU's "
                     "forward of the model; well below 1: the sampler's own cost")
    console.print(table)
    return rows


def same_length(problems, tokenizer, instructions: str, lanes: int):
    """The first `lanes` problems whose prompts share one token length, so that one rotary position
    lies --lead tokens into every response. -> (problems, prompt ids)"""
    by_length: dict[int, list] = {}
    for problem in problems:
        prompt = build_prompt(problem, tokenizer, instructions)
        group = by_length.setdefault(len(prompt), [])
        group.append((problem, prompt))
        if len(group) == lanes:
            return [p for p, _ in group], [q for _, q in group]
    raise SystemExit(f"bench/qwen.py: no {lanes} GSM8K test questions whose prompts have one length")


def force_block(model, banned: list[int], block_open: int, position: int):
    """A hook on the model's forward: the token after the input at rotary `position` - 1 is
    <Parallel>; `banned` ids (the other tags, EOS) are never drawn. -> the hook's handle"""
    banned = torch.tensor(banned, device=model.device)

    def steer(module, args, kwargs, out):
        logits = out.logits  # [N, t, V] (no grad: written in place)
        logits[..., banned] = -1e4
        at = kwargs["position_ids"][:, -1] == position - 1  # [N]: rows whose next token is <Parallel>
        logits[at, -1, block_open] = 1e4
        return out

    return model.register_forward_hook(steer, with_kwargs=True)


def fork_part(model, tokenizer, args, console) -> list[dict]:
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=1.0)
    tags, eos = policy.tag_ids, stop_ids(model, tokenizer)
    settings = SamplerSettings(paths=args.paths, max_new_tokens=args.fork_tokens, max_path_tokens=args.path_tokens,
                               max_blocks=1, seed=0)
    instructions = instructions_named(QWEN["instructions"])
    problems = load_problems("gsm8k")
    table = Table(title=f"2. forked vs sequential decoding (eval.py's speedup): one block of {args.paths} paths of "
                        f"{args.path_tokens} tokens, {args.fork_tokens} sampled tokens a response, best of {args.rounds}")
    for column in ("lanes", "forked tok/s", "sequential tok/s", "wall-clock speed-up", "tokens / critical path",
                   "tokens (forked, sequential)", "load"):
        table.add_column(column, justify="right")
    rows = []
    for lanes in args.fork_lanes:
        chosen, prompts = same_length(problems, tokenizer, instructions, lanes)
        hook = force_block(model, [t for t in tags.all() if t != tags.block_open] + eos, tags.block_open,
                           len(prompts[0]) + args.lead)
        try:
            # warm-up of each: the forked call is the timed rounds' (batch 0: seed + 0), its rollouts give the stats
            forked = sample(model, prompts, policy, settings, eos)
            sample(model, prompts, dataclasses.replace(policy, tag_ids=None), settings, eos)
            before = os.getloadavg()[0]
            pair = speedup(model, tokenizer, chosen, policy, settings, 1, instructions, True, lanes, args.rounds)
        finally:
            hook.remove()
        assert all(r.stats.forks == 1 and r.stats.path_lengths == [[args.path_tokens + 2] * args.paths]
                   for r in forked), [r.stats for r in forked]
        tokens, critical = sum(r.stats.new_tokens for r in forked), sum(r.stats.critical_path for r in forked)
        row = {"lanes": lanes, "forked_tokens": pair["parallel"]["tokens"], "sequential_tokens": pair["sequential"]["tokens"],
               "forked_tokens_per_second": pair["parallel"]["tokens_per_second"],
               "sequential_tokens_per_second": pair["sequential"]["tokens_per_second"], "speedup": pair["speedup"],
               "rollout_tokens": tokens, "critical_path_tokens": critical, "token_acceleration": tokens / critical,
               "forks": sum(r.stats.forks for r in forked), "load": load_average(before)}
        rows.append(row)
        table.add_row(str(lanes), f"{row['forked_tokens_per_second']:.1f}", f"{row['sequential_tokens_per_second']:.1f}",
                      f"{row['speedup']:.2f}", f"{row['token_acceleration']:.2f}",
                      f"{row['forked_tokens']:,}, {row['sequential_tokens']:,}", row["load"])
    console.print(table)
    return rows


def steps_part(args, dtype: str, console) -> list[dict]:
    traces = load_traces("parallel-gsm8k")[:4]
    problems = load_problems("gsm8k_train", limit=args.prompts)
    instructions = instructions_named(QWEN["instructions"])
    sampling = SamplerSettings(paths=REAL_SAMPLING["paths"], max_new_tokens=args.grpo_tokens,
                               max_path_tokens=QWEN["max_path_tokens"], seed=0)
    settings = {"before": ("float32", {"micro_batch": 4}), "after": (dtype, {"micro_batch_tokens": QWEN["micro_batch_tokens"]})}
    rows = []
    for name in args.settings:
        step_dtype, micro = settings[name]
        model, tokenizer = load(args.model, step_dtype)
        policy = Policy.for_tokenizer(tokenizer, "structured", QWEN["temperature"])
        pad = tokenizer.pad_token_id or 0
        sft_prompts = [build_prompt(t["question"], tokenizer, instructions) for t in traces]
        responses = [(tokenizer.encode(PARALLEL_R1.as_sampled(t["response"]), add_special_tokens=False)
                      + [tokenizer.eos_token_id])[: args.trace_tokens or None] for t in traces]
        grpo_prompts = [build_prompt(p, tokenizer, instructions) for p in problems]

        def sft(prompts, responses):
            optimizer, _ = make_optimizer(model, QWEN["sft_lr"], tag_lr_scale=QWEN["tag_lr_scale"])
            return sft_step(model, optimizer, prompts, responses, policy, pad, **micro)

        def grpo():
            optimizer, _ = make_optimizer(model, QWEN["lr"])
            return grpo_step(model, tokenizer, optimizer, problems, grpo_prompts, policy, sampling,
                             GRPOSettings(group_size=args.group_size, **micro), {"bench_order": 1.0})

        sft(sft_prompts[:1], [responses[0][:16]])  # warm-up: a one-row step of 16 tokens
        before = os.getloadavg()[0]
        sft_rise, (sft_seconds, sft_metrics) = peak_rise(lambda: timed(lambda: sft(sft_prompts, responses)))
        model.zero_grad(set_to_none=True)
        grpo_rise, (rollouts, grpo_metrics) = peak_rise(grpo)
        assert not grpo_metrics["skipped_no_signal"]  # the update ran (bench_order: every group has a signal)
        rows.append({"setting": name, "dtype": step_dtype, **micro, "sft_seconds": sft_seconds,
                     "sft_peak_rise_mb": sft_rise / MB, "sft_tokens": sft_metrics["tokens"],
                     "grpo_sample_seconds": grpo_metrics["sample_seconds"], "grpo_update_seconds": grpo_metrics["train_seconds"],
                     "grpo_peak_rise_mb": grpo_rise / MB, "grpo_rows": args.prompts * args.group_size,
                     "grpo_tokens": sum(r.stats.new_tokens for r in rollouts),
                     "grpo_sampled_tokens": sum(r.stats.sampled_tokens for r in rollouts),
                     "load": load_average(before)})
        del model, tokenizer, policy, rollouts
        gc.collect()
        hand_back_free_memory()  # the next setting's rises start from the memory this one held
    table = Table(title=f"3. one cold-start step ({len(traces)} traces) and one GRPO step ({args.prompts} x "
                        f"{args.group_size} x {args.grpo_tokens} tokens): before vs after (--preset qwen)")
    for column in ("setting", "dtype", "micro-batch", "cold start s", "cold start peak MB", "GRPO s (sampling + update)",
                   "GRPO peak MB", "GRPO tokens", "load"):
        table.add_column(column, justify="right")
    for r in rows:
        micro = f"{r['micro_batch']} rows" if "micro_batch" in r else f"<= {r['micro_batch_tokens']} tokens"
        grpo_s = r["grpo_sample_seconds"] + r["grpo_update_seconds"]
        table.add_row(r["setting"], r["dtype"], micro, f"{r['sft_seconds']:.1f}", f"{r['sft_peak_rise_mb']:,.0f}",
                      f"{grpo_s:.1f} ({r['grpo_sample_seconds']:.1f} + {r['grpo_update_seconds']:.1f})",
                      f"{r['grpo_peak_rise_mb']:,.0f}", f"{r['grpo_tokens']:,}", r["load"])
    console.print(table)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="pypi:qwen2.5-coder-0.5b", help="the model raced (tiny:qwen2: a random tiny one)")
    parser.add_argument("--dtype", default="auto", help="parts 1-2 and part 3's 'after': float32, bfloat16, or auto (defaults.cpu_dtype)")
    parser.add_argument("--only", choices=PARTS, help="run one part")
    for name, field in FloorSizes.__dataclass_fields__.items():  # part 0's sizes (--rounds: below)
        if name == "rounds":
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=int, nargs="+" if name == "decode_lanes" else None,
                            default=field.default_factory() if name == "decode_lanes" else field.default,
                            help="part 0: " + FloorSizes.HELP[name])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 32], help="part 1: lanes (questions) per call")
    parser.add_argument("--new-tokens", type=int, default=128, help="part 1: tokens decoded a lane")
    parser.add_argument("--fork-lanes", type=int, nargs="+", default=[1, 8], help="part 2: lanes per call")
    parser.add_argument("--fork-tokens", type=int, default=256, help="part 2: sampled tokens a response (max_new_tokens)")
    parser.add_argument("--path-tokens", type=int, default=112, help="part 2: sampled tokens a path (max_path_tokens)")
    parser.add_argument("--paths", type=int, default=REAL_SAMPLING["paths"], help="part 2: paths of the forced block")
    parser.add_argument("--lead", type=int, default=8, help="part 2: response tokens before the forced <Parallel>")
    parser.add_argument("--prompts", type=int, default=4, help="part 3: GRPO prompts")
    parser.add_argument("--group-size", type=int, default=8, help="part 3: GRPO responses a prompt")
    parser.add_argument("--grpo-tokens", type=int, default=512, help="part 3: GRPO max_new_tokens (the preset's)")
    parser.add_argument("--settings", nargs="+", choices=("before", "after"), default=["before", "after"],
                        help="part 3: the settings run (one alone where memory is short)")
    parser.add_argument("--trace-tokens", type=int, default=0, help="part 3: cold-start responses cut to this many tokens (0: whole)")
    args = bench_args(parser, argv, (2, "parts 0-2: timed rounds after the warm-up; the best counts"),
                      dict(lanes=[1, 4], new_tokens=16, fork_lanes=[1, 4], fork_tokens=40, path_tokens=12, lead=4,
                           prompts=2, group_size=2, grpo_tokens=16, trace_tokens=128, rounds=1), "tiny sizes, one round")
    dtype = cpu_dtype(False) if args.dtype == "auto" and on_cpu("auto") else args.dtype
    console = Console(width=160)
    console.print(f"{args.model}, dtype {dtype} (bfloat16 instructions: {cpu_bf16_instructions()}), "
                  f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}", highlight=False)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(),
              "bf16_instructions": cpu_bf16_instructions()}
    started = time.perf_counter()
    if args.only in (None, "floor", "sampler", "fork"):
        model, tokenizer = load(args.model, dtype)
        if args.only in (None, "floor"):
            sizes = FloorSizes.quick() if args.quick else FloorSizes(**{f: getattr(args, f) for f in FloorSizes.__dataclass_fields__})
            report["floor"] = floor_part(model, tokenizer, sizes, console)
        if args.only in (None, "sampler"):
            report["sampler"] = sampler_part(model, tokenizer, args, console)
        if args.only in (None, "fork"):
            report["fork"] = fork_part(model, tokenizer, args, console)
        del model, tokenizer
        gc.collect()
    if args.only in (None, "steps"):
        report["steps"] = steps_part(args, dtype, console)
    report["seconds"] = time.perf_counter() - started
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
