"""How fast nanopar runs against this machine's floor: prefill, decode, forking, the training read, whole steps.

    python bench/speed.py                              # every part on Qwen2.5-Coder-0.5B: 1-2 hours on 2 cores
    python bench/speed.py --only floor                 # some parts, a comma list: floor, sampler, fork, rebuild, steps
    python bench/speed.py --quick                      # tiny sizes, one round (the real model's steps still need > 4 GB)
    python bench/speed.py --quick --model tiny:qwen2   # the same code on a random tiny model: seconds (the tests run it)

Each part races nanopar against a baseline in this process, taking turns, best of --rounds after a warm-up call of
each; each row prints the load average. floor: a phase (the sampler's prefill, an evaluation batch's, a decode step
at each of --decode-lanes, a training micro-batch) against the model's own dense layers over its rows, nothing else;
sampler: the sampler against `model.generate`; fork: forked against sequential decoding (eval.py's speedup), a
block forced by a hook; rebuild: the plain `LaneCache` against `LazyLaneCache`; steps: a cold-start step and the
library's `grpo_step` at --preset qwen. What each measures, and the figures: bench/README.md. On a GPU the same code
profiles the kernels (bench/gpu_check.py runs the floor part). Not here: 4-bit weights, accuracy (eval.py), memory
(bench/memory.py), single optimisations (bench/races.py), attention's floor (it grows with the context).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning threads crawl on a shared CPU

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from common import MB, bench_order, block_batch, gsm8k_prompts, load_average, load_bench_model, peak_rise, race, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: nanopar, train.py's presets
from nanopar.config import parse_config  # noqa: E402
from nanopar.data import load_problems, load_traces  # noqa: E402
from nanopar.defaults import REAL_SAMPLING  # noqa: E402
from nanopar.eval_report import speedup  # noqa: E402
from nanopar.forward import trace_logprobs  # noqa: E402
from nanopar.grpo import GRPOSettings, grpo_step  # noqa: E402
from nanopar.kvcache import LaneCache, LazyLaneCache  # noqa: E402
from nanopar.optim import make_optimizer  # noqa: E402
from nanopar.policy import Policy  # noqa: E402
from nanopar.prompts import build_prompt, instructions_named, stop_ids  # noqa: E402
from nanopar.rewards import register  # noqa: E402
from nanopar.sampler import SamplerSettings, sample  # noqa: E402
from nanopar.sft import sft_step  # noqa: E402
from nanopar.tags import PARALLEL_R1  # noqa: E402
from nanopar.tiny import bias_logits  # noqa: E402
from nanopar.trace import acceleration  # noqa: E402
from train import PRESETS  # noqa: E402

QWEN = PRESETS["qwen"]  # the steps' "after" settings, and the prompts' instructions
PARTS = ("floor", "sampler", "fork", "rebuild", "steps")


@dataclass
class SpeedConfig:
    model: str = "pypi:qwen2.5-coder-0.5b"  # loaded as train.py loads it (tiny:qwen2: a random tiny one)
    dtype: str = "auto"  # float32, bfloat16 or auto (defaults.cpu_dtype)
    only: str = ",".join(PARTS)  # the parts to run, a comma list: floor, sampler, fork, rebuild, steps
    quick: bool = False  # tiny sizes and one round, over the size flags: a smoke run
    rounds: int = 2  # timed rounds of each race after a warm-up call of each side; the best counts
    out: str = ""  # write every figure to this JSON file ("" = don't)
    prefill_prompts: int = 16  # floor: prompts of the prefill
    prefill_tokens: int = 200  # floor: random tokens a prefill prompt
    eval_prompts: int = 64  # floor: prompts of an evaluation batch's prefill (eval.py's --batch), one round
    eval_prompt_tokens: int = 320  # floor: tokens an evaluation prompt (GSM8K with the parallel instructions: ~320)
    decode_lanes: tuple[int, ...] = (1, 8, 32, 64)  # floor: lanes of a decode step
    decode_steps: int = 16  # floor: decode steps S of a timed call
    decode_prompt_tokens: int = 64  # floor: tokens of each decode lane's prompt
    train_rows: int = 8  # floor: rows of the training micro-batch
    train_tokens: int = 256  # floor: tokens a training row
    probes: int = 4  # floor: matrix products probed (the MLP's at 32, 256, 1,024 rows; the head's at 32)
    top: int = 8  # floor: operations in each profile table
    lanes: tuple[int, ...] = (1, 8, 32)  # sampler: lanes (GSM8K test questions) a call; rebuild: the most of them
    new_tokens: int = 128  # sampler and rebuild: tokens a response
    fork_lanes: tuple[int, ...] = (1, 8)  # fork: lanes a call
    fork_tokens: int = 256  # fork: sampled tokens a response (max_new_tokens)
    path_tokens: int = 112  # fork: sampled tokens a path (max_path_tokens)
    paths: int = REAL_SAMPLING["paths"]  # fork, rebuild and steps: paths a block
    lead: int = 8  # fork: response tokens before the forced <Parallel>
    rebuild_samples: int = 8  # rebuild: responses to each prompt
    tag_bias: float = 12.0  # rebuild: logit bias on <Parallel> and </Path>, so that lanes fork and merge
    prompts: int = 4  # steps: GRPO prompts
    group_size: int = 8  # steps: GRPO responses a prompt
    grpo_tokens: int = 512  # steps: GRPO max_new_tokens (the qwen preset's)
    trace_tokens: int = 0  # steps: cold-start responses cut to this many tokens (0: whole)


QUICK = dict(prefill_prompts=2, prefill_tokens=16, eval_prompts=4, eval_prompt_tokens=24, decode_lanes=(1, 4),
             decode_steps=4, decode_prompt_tokens=8, train_rows=2, train_tokens=32, probes=1, top=5, lanes=(1, 4),
             new_tokens=16, fork_lanes=(1, 4), fork_tokens=40, path_tokens=12, lead=4, rebuild_samples=2, prompts=2,
             group_size=2, grpo_tokens=16, trace_tokens=128, rounds=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def show(console, title: str, columns, rows, caption: str = "") -> None:
    """A table: the first column left-aligned, the others right-aligned."""
    table = Table(title=title, caption=caption or None)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*map(str, row))
    console.print(table)


# --- the floor --------------------------------------------------------------------------------------
def dense_layers(model) -> tuple[list[torch.nn.Module], torch.nn.Module]:
    """(the decoder's linear layers, the LM head): every `nn.Linear` (bitsandbytes' 4-bit ones too) but
    LoRA's A and B; the head is the output embedding's (inside peft's tag-row wrapper: its linear)."""
    head = next(m for m in model.get_output_embeddings().modules() if isinstance(m, torch.nn.Linear))
    return [m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "lora_" not in name and m is not head], head


def floor_work(model, rows: int, head_rows: int, backward: bool):
    """The floor of `rows` rows (the head over `head_rows`): each dense layer called on [rows, in] random
    input in the compute dtype; `backward`: also the input's gradient. -> (its call, FLOPs, weight bytes)"""
    layers, head = dense_layers(model)
    dtype = head.weight.dtype  # the compute dtype (4-bit layers compute in it too; the head is never 4-bit)
    work = [(layer, rows) for layer in layers] + [(head, head_rows)]
    inputs = {(layer.in_features, n): torch.randn(n, layer.in_features, device=head.weight.device, dtype=dtype)
              for layer, n in work}  # [n, in] each

    def run():
        for layer, n in work:
            x = inputs[(layer.in_features, n)]
            if backward:
                y = layer(x.detach().requires_grad_())  # [n, out]
                y.backward(torch.ones_like(y))
            else:
                with torch.no_grad():
                    layer(x)

    times = 2 if backward else 1  # the input's gradient is one more product of each weight
    flops = sum(2 * n * layer.in_features * layer.out_features for layer, n in work) * times
    return run, flops, sum(layer.weight.numel() * layer.weight.element_size() for layer, _ in work) * times


def probes(model, count: int, console) -> list[dict]:
    """TFLOPS of [rows, inner] x [inner, out] repeated 8 times on one weight, per dtype, at the MLP's
    shape (it stays in cache: this machine's best case) and at the head's (too big for a cache)."""
    device, (_, head), found = model.device, dense_layers(model), []
    sync = lambda: synchronize(device)  # noqa: E731
    shapes = [(rows, model.config.hidden_size, model.config.intermediate_size) for rows in (32, 256, 1024)]
    for rows, inner, out in (shapes + [(32, head.in_features, head.out_features)])[:count]:
        tflops = []
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, inner, device=device, dtype=dtype)  # [rows, inner]
            w = torch.randn(out, inner, device=device, dtype=dtype)  # [out, inner]
            (seconds,), _, _, _ = race([lambda: [torch.nn.functional.linear(x, w) for _ in range(8)]], 5, sync)
            tflops.append(2 * rows * inner * out * 8 / seconds / 1e12)
        found.append({"rows": rows, "inner": inner, "out": out, "tflops": tflops})
    show(console, "floor: one weight's matrix product repeated (the MLP's stays in cache), TFLOPS",
         ("product", "bfloat16", "float32"),
         [(f"[{p['rows']} x {p['inner']}] . [{p['inner']} x {p['out']}]", *(f"{t:.2f}" for t in p["tflops"])) for p in found])
    return found


def peak_added(fn, device: torch.device) -> int:
    """Bytes one fn() call adds at its peak: GPU memory allocated on a GPU, the resident set on a CPU."""
    if device.type != "cuda":
        return peak_rise(fn)[0]
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - held


def profile(fn, device: torch.device) -> dict:
    """{(operation, input shapes): (calls, self ms)} of one fn() call (a GPU's: the kernels' device time)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    gpu = [ProfilerActivity.CUDA] if device.type == "cuda" else []
    with torch_profile(activities=[ProfilerActivity.CPU, *gpu], record_shapes=True) as prof:
        fn()
        synchronize(device)
    attribute = "self_device_time_total" if gpu else "self_cpu_time_total"
    return {(e.key, str(e.input_shapes)): (e.count, getattr(e, attribute) / 1e3)
            for e in prof.key_averages(group_by_input_shape=True)}


def profile_top(fn, device: torch.device, k: int, baseline=None) -> list[dict]:
    """The k operations of one fn() call with the most self time, less one baseline() call's (a decode
    step's: a call of 1 + S tokens less a call of 1). -> [{"op", "shapes", "calls", "ms", "share"}]"""
    ops = profile(fn, device)
    for key, (calls, ms) in (profile(baseline, device) if baseline else {}).items():
        ops[key] = (ops.get(key, (0, 0.0))[0] - calls, ops.get(key, (0, 0.0))[1] - ms)
    ops = {key: value for key, value in ops.items() if value[0] > 0}  # one the baseline called as often: noise only
    total = sum(ms for _, ms in ops.values()) or 1.0
    ranked = sorted(ops.items(), key=lambda item: item[1][1], reverse=True)[:k]
    return [{"op": op, "shapes": shapes[:70], "calls": calls, "ms": ms, "share": ms / total}
            for (op, shapes), (calls, ms) in ranked]


def random_prompts(count: int, length: int, words: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random ids below `words` (no tag), seeded."""
    return torch.randint(0, words, (count, length), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class Phase:
    name: str  # as the table shows it
    rows: int  # rows through the decoder's layers (prompt tokens, lanes or trained tokens)
    head_rows: int  # rows through the head
    one: object  # a call: the sampler's for 1 token, or a training read
    more: object = None  # the sampler's call for 1 + S tokens: (more - one) / S is a step, one less a step the prefill
    step: bool = False  # a decode step (else a prefill, or the call itself)
    backward: bool = False  # a training read: its floor adds the input's gradient
    rounds: int = 0  # 0: --rounds


def floor_part(model, tokenizer, config: SpeedConfig, console) -> dict:
    """nanopar's prefill, decode steps and training micro-batch, each raced against its floor, then a
    profile table each (bench/gpu_check.py's "floor" group calls it too).
    -> {"probes", "phases": [prefill, evaluation prefill, *decode steps, training micro-batch]}"""
    device, words = model.device, min(len(tokenizer), model.get_input_embeddings().weight.shape[0]) - 16
    sync = lambda: synchronize(device)  # noqa: E731
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=1.0)  # the tags as train.py reads them
    run = lambda prompts, n: lambda: sample(model, prompts, policy, SamplerSettings(max_new_tokens=n, max_blocks=0, seed=0), [])
    P, T, E, L, S = (config.prefill_prompts, config.prefill_tokens, config.eval_prompts, config.eval_prompt_tokens,
                     config.decode_steps)
    prefill, evaluation = random_prompts(P, T, words, 0), random_prompts(E, L, words, 1)
    phases = [Phase(f"prefill, {P} prompts x {T} tokens", P * T, P, run(prefill, 1), run(prefill, 1 + S)),
              Phase(f"prefill, an evaluation batch, {E} x {L}", E * L, E, run(evaluation, 1), rounds=1)]
    for lanes in config.decode_lanes:
        prompts = random_prompts(lanes, config.decode_prompt_tokens, words, lanes)
        phases.append(Phase(f"decode step, {lanes} lanes", lanes, lanes, run(prompts, 1), run(prompts, 1 + S), step=True))
    R, W = config.train_rows, config.train_tokens
    batch = block_batch(policy.tag_ids, words, R, W, device)  # one parallel block a row, every response token weighted

    def train_read():
        model.zero_grad(set_to_none=True)
        logprobs, _ = trace_logprobs(model, batch, policy)  # [R, W - 1]
        (logprobs * batch.target_mask).sum().backward()

    weighted = int((batch.target_mask > 0).sum())  # the head's rows
    phases.append(Phase(f"training micro-batch, {R} x {W} tokens", R * W, weighted, train_read, backward=True))
    report, was_training = {"probes": probes(model, config.probes, console), "phases": []}, model.training
    for phase in phases:
        model.train(phase.backward)
        floor, flops, weight_bytes = floor_work(model, phase.rows, phase.head_rows, phase.backward)
        times, _, _, load = race([c for c in (phase.one, phase.more, floor) if c], phase.rounds or config.rounds, sync)
        per_step = (times[1] - times[0]) / S if phase.more else 0.0
        seconds, floor_seconds = per_step if phase.step else times[0] - per_step, times[-1]
        work = phase.more if phase.step else phase.one  # what the memory and the profile read
        report["phases"].append({
            "phase": phase.name, "seconds": seconds, "floor_seconds": floor_seconds, "ratio": seconds / floor_seconds,
            "floor_flops": flops, "floor_weight_bytes": weight_bytes, "rows": phase.rows, "head_rows": phase.head_rows,
            "floor_tflops": flops / floor_seconds / 1e12, "floor_gb_per_s": weight_bytes / floor_seconds / 1e9,
            "tokens_per_second": phase.rows / seconds, "load": load, "peak_mb": peak_added(work, device) / MB,
            "top": profile_top(work, device, config.top, phase.one if phase.step else None)})
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    show(console, "floor: nanopar against this machine's own dense layers over the same rows",
         ("phase", "nanopar ms", "floor ms", "x the floor", "floor TFLOPS", "floor GB/s (weights)", "tokens/s",
          "peak MB added", "load"),
         [(e["phase"], f"{1000 * e['seconds']:,.1f}", f"{1000 * e['floor_seconds']:,.1f}", f"{e['ratio']:.2f}",
           f"{e['floor_tflops']:.2f}", f"{e['floor_gb_per_s']:.1f}", f"{e['tokens_per_second']:,.1f}", f"{e['peak_mb']:,.0f}",
           e["load"]) for e in report["phases"]],
         "decode step = (a call of 1 + S tokens - a call of 1) / S; prefill = the call of 1 - a step (an evaluation "
         "batch's: the call of 1); tokens/s: prompt tokens, lanes or trained tokens a second; peak MB added: one call "
         "(a decode phase's: 1 + S tokens; the resident set on a CPU, memory allocated on a GPU)")
    for e in report["phases"]:
        show(console, f"profile: {e['phase']}{f', {S} steps' if e['phase'].startswith('decode') else ''}, top "
             f"{config.top} operations by self time", ("operation", "input shapes", "calls", "ms", "share"),
             [(op["op"], op["shapes"], op["calls"], f"{op['ms']:,.1f}", f"{op['share']:.0%}") for op in e["top"]])
    return report


# --- the sampler, forking, the cache rebuild ---------------------------------------------------------
def generate(model, prompts: list[list[int]], pad: int, tokens: int, eos: list[int]) -> torch.Tensor:
    """`model.generate` at T = 1, no top-k / top-p, exactly `tokens` new tokens a row. -> ids [N, tokens]"""
    T = max(map(len, prompts))
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts], device=model.device)  # [N, T], left-padded
    starts = torch.tensor([[T - len(p)] for p in prompts], device=model.device)  # [N, 1]
    mask = (torch.arange(T, device=model.device) >= starts).long()  # [N, T]: 0 on the padding
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=eos, pad_token_id=pad)
    return out[:, T:]  # [N, tokens]


def sampler_part(model, tokenizer, config: SpeedConfig, console) -> list[dict]:
    plain = Policy(None, temperature=1.0, vocab_size=len(tokenizer))  # no tags: sequential decoding
    eos, pad, N = stop_ids(model, tokenizer), tokenizer.pad_token_id or 0, config.new_tokens
    questions, rows = gsm8k_prompts(tokenizer, max(config.lanes), "gsm8k"), []
    for lanes in config.lanes:
        prompts = questions[:lanes]
        ours = lambda: sample(model, prompts, plain, SamplerSettings(max_new_tokens=N, seed=0), eos_ids=[])
        theirs = lambda: generate(model, prompts, pad, N, eos)
        (t_ours, t_theirs), (rollouts, ids), _, load = race([ours, theirs], config.rounds, lambda: synchronize(model.device))
        assert [r.stats.new_tokens for r in rollouts] == [N] * lanes and tuple(ids.shape) == (lanes, N)
        rows.append({"lanes": lanes, "nanopar_tokens": sum(r.stats.new_tokens for r in rollouts),
                     "generate_tokens": ids.numel(), "nanopar_seconds": t_ours, "generate_seconds": t_theirs,
                     "ratio": t_theirs / t_ours, "load": load})
    show(console, f"sampler: nanopar against model.generate, T = 1, no tags, {N} tokens a lane",
         ("lanes", "nanopar tok/s", "generate tok/s", "nanopar / generate", "ms a step (nanopar, generate)", "load"),
         [(r["lanes"], f"{r['nanopar_tokens'] / r['nanopar_seconds']:.1f}", f"{r['generate_tokens'] / r['generate_seconds']:.1f}",
           f"{r['ratio']:.2f}", f"{1000 * r['nanopar_seconds'] / N:.0f}, {1000 * r['generate_seconds'] / N:.0f}", r["load"])
          for r in rows], "near 1: the sampler decodes at generate's speed (a step: the call / its tokens a lane)")
    return rows


def same_length(problems, tokenizer, instructions: str, lanes: int):
    """The first `lanes` problems whose prompts share one token length, so that one rotary position lies
    --lead tokens into every response. -> (problems, prompt ids)"""
    by_length: dict[int, list] = {}
    for problem in problems:
        prompt = build_prompt(problem, tokenizer, instructions)
        group = by_length.setdefault(len(prompt), [])
        group.append((problem, prompt))
        if len(group) == lanes:
            return [p for p, _ in group], [q for _, q in group]
    raise SystemExit(f"bench/speed.py: no {lanes} GSM8K test questions whose prompts have one length")


def force_block(model, banned: list[int], block_open: int, position: int):
    """A hook on the model's forward: the token after rotary `position` - 1 is <Parallel>; `banned` ids
    (the other tags, EOS) are never drawn. -> the hook's handle"""
    banned = torch.tensor(banned, device=model.device)

    def steer(module, args, kwargs, out):
        out.logits[..., banned] = -1e4  # [N, t, V] (no grad: written in place)
        out.logits[kwargs["position_ids"][:, -1] == position - 1, -1, block_open] = 1e4
        return out

    return model.register_forward_hook(steer, with_kwargs=True)


def fork_part(model, tokenizer, config: SpeedConfig, console) -> list[dict]:
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=1.0)
    tags, eos, K, L = policy.tag_ids, stop_ids(model, tokenizer), config.paths, config.path_tokens
    settings = SamplerSettings(paths=K, max_new_tokens=config.fork_tokens, max_path_tokens=L, max_blocks=1, seed=0)
    instructions, problems, rows = instructions_named(QWEN["instructions"]), load_problems("gsm8k"), []
    for lanes in config.fork_lanes:
        chosen, prompts = same_length(problems, tokenizer, instructions, lanes)
        others = [t for t in tags.all() if t != tags.block_open] + eos
        hook = force_block(model, others, tags.block_open, len(prompts[0]) + config.lead)
        try:  # a warm-up of each; the forked one is the timed rounds' first call (same seed): its rollouts give the counts
            forked = sample(model, prompts, policy, settings, eos)
            sample(model, prompts, dataclasses.replace(policy, tag_ids=None), settings, eos)
            before = os.getloadavg()[0]
            pair = speedup(model, tokenizer, chosen, policy, settings, 1, instructions, True, lanes, config.rounds)
        finally:
            hook.remove()
        assert all(r.stats.forks == 1 and r.stats.path_lengths == [[L + 2] * K] for r in forked), [r.stats for r in forked]
        tokens, critical = sum(r.stats.new_tokens for r in forked), sum(r.stats.critical_path for r in forked)
        rows.append({"lanes": lanes, "forks": sum(r.stats.forks for r in forked), "forked": pair["parallel"],
                     "sequential": pair["sequential"], "speedup": pair["speedup"], "rollout_tokens": tokens,
                     "critical_path_tokens": critical, "token_acceleration": acceleration(tokens, critical), "load": load_average(before)})
    show(console, f"fork: forked against sequential decoding (eval.py's speedup), one block of {K} paths of {L} tokens, "
         f"{config.fork_tokens} sampled tokens a response", ("lanes", "forked tok/s", "sequential tok/s", "wall-clock speed-up",
                                                            "tokens / critical path", "tokens (forked, sequential)", "load"),
         [(r["lanes"], f"{r['forked']['tokens_per_second']:.1f}", f"{r['sequential']['tokens_per_second']:.1f}",
           f"{r['speedup']:.2f}", f"{r['token_acceleration']:.2f}", f"{r['forked']['tokens']:,}, {r['sequential']['tokens']:,}",
           r["load"]) for r in rows])
    return rows


def rebuild_part(model, tokenizer, config: SpeedConfig, console) -> dict:
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=1.0)
    prompts, tags, eos = gsm8k_prompts(tokenizer, max(config.lanes), "gsm8k"), policy.tag_ids, stop_ids(model, tokenizer)
    settings = SamplerSettings(paths=config.paths, max_new_tokens=config.new_tokens,
                               max_path_tokens=max(4, config.new_tokens // 4), seed=0)
    call = lambda cache: lambda: sample(model, prompts, policy, settings, eos, config.rebuild_samples, lane_cache=cache)
    hook = bias_logits(model, {tags.block_open: config.tag_bias, tags.path_close: config.tag_bias})
    try:
        (lazy_s, plain_s), (lazy, plain), _, load = race([call(LazyLaneCache), call(LaneCache)], config.rounds,
                                                        lambda: synchronize(model.device))
    finally:
        hook.remove()
    assert [(r.ids, r.logprobs) for r in lazy] == [(r.ids, r.logprobs) for r in plain]  # the same samples
    row = {"lanes": len(lazy), "tokens": sum(r.stats.new_tokens for r in lazy), "forks": sum(r.stats.forks for r in lazy),
           "lazy_seconds": lazy_s, "plain_seconds": plain_s, "ratio": plain_s / lazy_s, "load": load}
    show(console, "rebuild: one sampler call with each lane cache, seconds",
         ("lanes", "tokens", "forks", "lazy", "plain", "plain / lazy", "load"),
         [(row["lanes"], f"{row['tokens']:,}", row["forks"], f"{lazy_s:.2f}", f"{plain_s:.2f}", f"{row['ratio']:.2f}", load)],
         "the same tokens and log-probs (asserted)")
    return row


# --- whole steps ---------------------------------------------------------------------------------------
def timed(fn):
    """(wall seconds of fn(), its result)"""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def steps_part(model, tokenizer, config: SpeedConfig, console) -> dict:
    """One cold-start step and one GRPO step (the library's) at train.py's --preset qwen, each with a fresh
    optimiser, after a one-row warm-up step. The last part: the steps train the model."""
    traces, problems = load_traces("parallel-gsm8k")[:4], load_problems("gsm8k_train", limit=config.prompts)
    instructions, pad, micro = instructions_named(QWEN["instructions"]), tokenizer.pad_token_id or 0, QWEN["micro_batch_tokens"]
    policy = Policy.for_tokenizer(tokenizer, "structured", QWEN["temperature"])
    sampling = SamplerSettings(paths=config.paths, max_new_tokens=config.grpo_tokens,
                               max_path_tokens=QWEN["max_path_tokens"], seed=0)
    sft_prompts = [build_prompt(t["question"], tokenizer, instructions) for t in traces]
    responses = [(tokenizer.encode(PARALLEL_R1.as_sampled(t["response"]), add_special_tokens=False)
                  + [tokenizer.eos_token_id])[: config.trace_tokens or None] for t in traces]
    grpo_prompts = [build_prompt(p, tokenizer, instructions) for p in problems]

    def sft(prompts, responses):
        optimizer, _ = make_optimizer(model, QWEN["sft_lr"], tag_lr_scale=QWEN["tag_lr_scale"])
        return sft_step(model, optimizer, prompts, responses, policy, pad, micro_batch_tokens=micro)

    def grpo():
        optimizer, _ = make_optimizer(model, QWEN["lr"])
        return grpo_step(model, tokenizer, optimizer, problems, grpo_prompts, policy, sampling,
                         GRPOSettings(group_size=config.group_size, micro_batch_tokens=micro), {"bench_order": 1.0})

    sft(sft_prompts[:1], [responses[0][:16]])  # warm-up: a one-row step of 16 tokens
    before = os.getloadavg()[0]
    sft_rise, (sft_seconds, sft_metrics) = peak_rise(lambda: timed(lambda: sft(sft_prompts, responses)))
    model.zero_grad(set_to_none=True)
    grpo_rise, (rollouts, grpo_metrics) = peak_rise(grpo)
    assert not grpo_metrics["skipped_no_signal"]  # the update ran (bench_order: every group has a signal)
    sampling_s, update_s = grpo_metrics["sample_seconds"], grpo_metrics["train_seconds"]
    row = {"micro_batch_tokens": micro, "sft_seconds": sft_seconds, "sft_peak_rise_mb": sft_rise / MB,
           "sft_tokens": sft_metrics["tokens"], "grpo_sample_seconds": sampling_s, "grpo_update_seconds": update_s,
           "grpo_peak_rise_mb": grpo_rise / MB,
           "grpo_rows": len(rollouts), "grpo_tokens": sum(r.stats.new_tokens for r in rollouts),
           "grpo_sampled_tokens": sum(r.stats.sampled_tokens for r in rollouts), "load": load_average(before)}
    show(console, f"steps: one cold-start step ({len(traces)} traces) and one GRPO step ({config.prompts} x "
         f"{config.group_size} x {config.grpo_tokens} tokens) at --preset qwen (rows packed under {micro:,} tokens)",
         ("cold start s", "cold start peak MB", "GRPO s (sampling + update)", "GRPO peak MB", "GRPO tokens", "load"),
         [(f"{sft_seconds:.1f}", f"{sft_rise / MB:,.0f}", f"{sampling_s + update_s:.1f} ({sampling_s:.1f} + {update_s:.1f})",
           f"{grpo_rise / MB:,.0f}", f"{row['grpo_tokens']:,}", row["load"])], "peak MB: the resident set's rise")
    return row


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(SpeedConfig, argv, description=__doc__.split("\n")[0])
    config = dataclasses.replace(config, **QUICK) if config.quick else config
    parts = [part.strip() for part in config.only.split(",") if part.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        raise SystemExit(f"bench/speed.py: unknown part {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if config.rounds < 1:
        raise SystemExit(f"bench/speed.py: --rounds must be at least 1, got {config.rounds}")
    register("bench_order", replace=True)(bench_order)  # the steps' reward
    console, started = Console(width=160), time.perf_counter()
    report = {"config": dataclasses.asdict(config), "threads": torch.get_num_threads()}
    model, tokenizer, report["dtype"] = load_bench_model(config, console)
    for part in (part for part in PARTS if part in parts):  # in PARTS' order: the steps, which train the model, last
        run = {"floor": floor_part, "sampler": sampler_part, "fork": fork_part, "rebuild": rebuild_part, "steps": steps_part}
        report[part] = run[part](model, tokenizer, config, console)
    report["seconds"] = time.perf_counter() - started
    return write_report(report, config.out, console)


if __name__ == "__main__":
    main()
