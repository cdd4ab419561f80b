"""This machine's floor for a model's work, measured at the model's own shapes, and a profile table.

The floor of a forward over M rows is the time of the model's own dense layers (every linear the
model holds, each called as the module it is: bfloat16, float32, 4-bit) over M rows of input,
one after another, with nothing else: no attention, no norms, no LoRA, no sampling, no Python
loop around them. Those products are work no implementation of the same model can skip, at this
machine's speed for exactly these shapes (its GEMM kernels, its memory bandwidth for weights that
do not fit in cache). A training micro-batch's floor is the same layers forward and backward (the
input's gradient: the weights are frozen). `linear_floor` measures it; `probe_gemm` measures one
matrix product repeated on one weight (a weight that stays in cache: this CPU's best case), the
figure the floor is compared with.

    floor = linear_floor(model, rows=32)            # one decode step of 32 lanes: seconds, FLOPs, bytes read
    top = profile_top(work, device, k=8)            # the k operations with the most self time, shapes recorded
    report = floor_part(model, tokenizer, FloorSizes(), console)   # nanopar's phases against their floors

`floor_part` is bench/qwen.py's part 0 and bench/gpu_check.py's "floor" group (`from floor import
...`: a script's folder is on sys.path): nanopar's prefill, an evaluation batch's prefill, decode
steps and a training micro-batch, each timed, against its floor, with its peak memory and a
profile table. Not here: attention's floor (its cost grows with the context; it is in the
phases' time, not the floor), the optimiser, gradient checkpointing's recomputed forward (in a
phase's time where a model has it on, never in the floor).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from rich.table import Table

from common import MB, load_average, peak_rise
from nanopar.forward import make_batch, trace_logprobs
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample

PROBE_DTYPES = (torch.bfloat16, torch.float32)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn, device: torch.device, repeats: int = 3) -> float:
    """Best wall time of `repeats` calls of fn() after one warm-up call (GPU work waited for)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best


def peak_added(fn, device: torch.device) -> int:
    """Bytes a call of fn() adds at its peak over what was held before it: GPU memory allocated on
    a GPU, the resident set on a CPU (`common.peak_rise`)."""
    if device.type != "cuda":
        return peak_rise(fn)[0]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - held


def dense_layers(model) -> tuple[list[torch.nn.Module], torch.nn.Module]:
    """(the decoder's linear layers, the LM head): every `nn.Linear` of the model (bitsandbytes'
    4-bit ones are too) other than LoRA's own A and B, the head being the output embedding's
    (inside peft's tag-row wrapper: the linear it wraps)."""
    wrapped = model.get_output_embeddings()
    head = next(m for m in wrapped.modules() if isinstance(m, torch.nn.Linear))  # peft's tag-row wrapper: its linear
    layers = [m for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and "lora_" not in name and m is not head]
    return layers, head


@dataclass
class Floor:
    seconds: float  # the dense layers' time over the rows, forward (and backward where asked)
    flops: float  # 2 x their multiply-adds (twice that with the backward: the input's gradient is one more product)
    weight_bytes: int  # the weights read: once a forward, twice with the backward


def linear_floor(model, rows: int, head_rows: int | None = None, backward: bool = False, repeats: int = 3) -> Floor:
    """The floor of a forward over `rows` rows (the head over `head_rows`, default the same), each
    dense layer called on [rows, in] random input in the model's compute dtype; `backward`: also
    the input's gradient, as a training read needs (the frozen weights get none)."""
    layers, head = dense_layers(model)
    device = head.weight.device
    dtype = head.weight.dtype  # the compute dtype (4-bit layers compute in it too; the head is never 4-bit)
    head_rows = rows if head_rows is None else head_rows
    work = [(layer, rows) for layer in layers] + [(head, head_rows)]
    inputs = {(layer.in_features, n): torch.randn(n, layer.in_features, device=device, dtype=dtype)
              for layer, n in work}  # [n, in] each

    def run():
        for layer, n in work:
            x = inputs[(layer.in_features, n)]
            if backward:
                x = x.detach().requires_grad_()
                y = layer(x)  # [n, out]
                y.backward(torch.ones_like(y))
            else:
                with torch.no_grad():
                    layer(x)

    flops = sum(2 * n * layer.in_features * layer.out_features for layer, n in work) * (2 if backward else 1)
    weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer, _ in work) * (2 if backward else 1)
    return Floor(best_seconds(run, device, repeats), flops, weight_bytes)


def probe_gemm(rows: int, inner: int, out: int, dtype: torch.dtype, device: torch.device, repeats: int = 5) -> float:
    """TFLOPS of [rows, inner] x [inner, out] repeated on one weight (the MLP's stays in cache: a best
    case; the head's 272 MB does not)."""
    x = torch.randn(rows, inner, device=device, dtype=dtype)
    w = torch.randn(out, inner, device=device, dtype=dtype)
    calls = 8
    seconds = best_seconds(lambda: [torch.nn.functional.linear(x, w) for _ in range(calls)], device, repeats)
    return 2 * rows * inner * out * calls / seconds / 1e12


def profile_top(fn, device: torch.device, k: int = 8, baseline=None) -> list[dict]:
    """The k operations of one fn() call with the most self time (shapes recorded), less those of
    one baseline() call where given (a decode step's: a call of 1 + S tokens less a call of 1):
    [{"op", "shapes", "calls", "ms", "share"}], share of the whole self time (less the baseline's)."""
    ops = _profile(fn, device)
    if baseline is not None:
        for key, (calls, ms) in _profile(baseline, device).items():
            ops[key] = (ops.get(key, (0, 0.0))[0] - calls, ops.get(key, (0, 0.0))[1] - ms)
        # an operation the baseline called as often (the prefill's) is left with timing noise only
        ops = {key: value for key, value in ops.items() if value[0] > 0}
    total = sum(ms for _, ms in ops.values()) or 1.0
    ranked = sorted(ops.items(), key=lambda item: item[1][1], reverse=True)[:k]
    return [{"op": op, "shapes": shapes[:70], "calls": calls, "ms": ms, "share": ms / total}
            for (op, shapes), (calls, ms) in ranked]


def _profile(fn, device: torch.device) -> dict:
    """{(operation, input shapes): (calls, self ms)} of one fn() call (GPU: the kernels' device time)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        fn()
        synchronize(device)
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {(e.key, str(e.input_shapes)): (e.count, getattr(e, attribute) / 1e3)
            for e in prof.key_averages(group_by_input_shape=True)}


@dataclass
class FloorSizes:
    """The sizes of `floor_part`'s phases."""

    prefill_prompts: int = 16
    prefill_tokens: int = 200
    eval_prompts: int = 64
    eval_prompt_tokens: int = 320
    decode_lanes: list[int] = field(default_factory=lambda: [1, 8, 32, 64])
    decode_steps: int = 16
    decode_prompt_tokens: int = 64
    train_rows: int = 8
    train_tokens: int = 256
    probes: int = 4
    top: int = 8
    rounds: int = 2

    HELP = {"prefill_prompts": "prompts of the prefill", "prefill_tokens": "tokens a prefill prompt",
            "eval_prompts": "prompts of an evaluation batch's prefill (eval.py's --batch)",
            "eval_prompt_tokens": "tokens an evaluation prompt (GSM8K with the parallel instructions: up to ~320)",
            "decode_lanes": "lanes of a decode step", "decode_steps": "decode steps timed a call",
            "decode_prompt_tokens": "tokens of each decode lane's prompt", "train_rows": "rows of the training micro-batch",
            "train_tokens": "tokens a training row", "probes": "matrix products probed (MLP at 32, 256, 1,024 rows; the head)",
            "top": "operations in each profile table", "rounds": "timed calls after a warm-up; the best counts"}

    @classmethod
    def quick(cls) -> "FloorSizes":
        """A smoke run's sizes: seconds on a tiny model."""
        return cls(prefill_prompts=2, prefill_tokens=16, eval_prompts=4, eval_prompt_tokens=24, decode_lanes=[1, 4],
                   decode_steps=4, decode_prompt_tokens=8, train_rows=2, train_tokens=32, probes=1, top=5, rounds=2)


def random_prompts(count: int, length: int, words: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random ids below `words` (no tag, no padding), seeded."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, words, (count, length), generator=generator).tolist()


def floor_part(model, tokenizer, sizes: FloorSizes, console) -> dict:
    """0. nanopar's prefill, decode steps and training micro-batch against this machine's floor for
    the same rows (bench/floor.py), each with a profile table of its top operations."""
    device, words = model.device, min(len(tokenizer), model.get_input_embeddings().weight.shape[0]) - 16
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=1.0)  # the tags as train.py reads them
    settings = lambda n: SamplerSettings(max_new_tokens=n, max_blocks=0, seed=0)  # no fork: a step is N rows
    run = lambda prompts, n: sample(model, prompts, policy, settings(n), eos_ids=[])
    head = dense_layers(model)[1]
    probes = Table(title="0a. this machine's matrix products, one weight repeated (the MLP's stays in cache), TFLOPS")
    for column in ("product", *(str(dtype).removeprefix("torch.") for dtype in PROBE_DTYPES)):
        probes.add_column(column, justify="right")
    mlp = model.config.intermediate_size
    shapes = [(rows, model.config.hidden_size, mlp) for rows in (32, 256, 1024)] + [(32, head.in_features, head.out_features)]
    report = {"probes": []}
    for rows, inner, out in shapes[: sizes.probes]:
        tflops = [probe_gemm(rows, inner, out, dtype, device) for dtype in PROBE_DTYPES]
        report["probes"].append({"rows": rows, "inner": inner, "out": out, "tflops": tflops})
        probes.add_row(f"[{rows} x {inner}] . [{inner} x {out}]", *(f"{t:.2f}" for t in tflops))
    console.print(probes)

    timing_started = os.getloadavg()[0]
    P, T = sizes.prefill_prompts, sizes.prefill_tokens
    prompts = random_prompts(P, T, words, 0)
    S = sizes.decode_steps
    step_time = {}
    for lanes in dict.fromkeys([P] + sizes.decode_lanes):  # a decode step: (one call of 1 + S tokens - one of 1 token) / S
        lane_prompts = prompts if lanes == P else random_prompts(lanes, sizes.decode_prompt_tokens, words, lanes)
        one, more = best_seconds(lambda: run(lane_prompts, 1), device, sizes.rounds), \
            best_seconds(lambda: run(lane_prompts, 1 + S), device, sizes.rounds)
        step_time[lanes] = ((more - one) / S, one, lane_prompts)
    prefill_seconds = step_time[P][1] - step_time[P][0]  # one call of 1 token: the prefill and one step
    rows = [{"phase": f"prefill, {P} prompts x {T} tokens", "seconds": prefill_seconds, "rows": P * T, "head_rows": P,
             "floor": linear_floor(model, P * T, head_rows=P, repeats=sizes.rounds), "tokens": P * T,
             "work": lambda: run(prompts, 1), "baseline": None}]
    E, L = sizes.eval_prompts, sizes.eval_prompt_tokens  # an evaluation batch's prefill: its memory above all
    eval_prompts = random_prompts(E, L, words, 1)
    rows.append({"phase": f"prefill, an evaluation batch, {E} x {L}", "rows": E * L, "head_rows": E, "tokens": E * L,
                 "seconds": best_seconds(lambda: run(eval_prompts, 1), device, 1) - step_time.get(E, (0.0,))[0],
                 "floor": linear_floor(model, E * L, head_rows=E, repeats=1),
                 "work": lambda: run(eval_prompts, 1), "baseline": None})
    for lanes in sizes.decode_lanes:
        seconds, _, lane_prompts = step_time[lanes]
        rows.append({"phase": f"decode step, {lanes} lanes", "seconds": seconds, "rows": lanes, "head_rows": lanes,
                     "floor": linear_floor(model, lanes, repeats=sizes.rounds), "tokens": lanes,
                     "work": (lambda p: lambda: run(p, 1 + S))(lane_prompts),
                     "baseline": (lambda p: lambda: run(p, 1))(lane_prompts)})
    batch, weighted = training_batch(tokenizer, words, sizes.train_rows, sizes.train_tokens, device)
    was_training = model.training
    model.train()

    def train_read():
        model.zero_grad(set_to_none=True)
        logprobs, _ = trace_logprobs(model, batch, policy)
        (logprobs * batch.target_mask).sum().backward()

    rows.append({"phase": f"training micro-batch, {sizes.train_rows} x {sizes.train_tokens} tokens",
                 "rows": sizes.train_rows * sizes.train_tokens, "head_rows": weighted,
                 "seconds": best_seconds(train_read, device, sizes.rounds), "tokens": sizes.train_rows * sizes.train_tokens,
                 "floor": linear_floor(model, sizes.train_rows * sizes.train_tokens, head_rows=weighted, backward=True,
                                       repeats=sizes.rounds), "work": train_read, "baseline": None})
    load = load_average(timing_started)  # over the timing of every phase (the profiles and memory come after)
    table = Table(title="0b. nanopar against the floor: this machine's own dense layers over the same rows (bench/floor.py)")
    for column in ("phase", "nanopar ms", "floor ms", "x the floor", "floor TFLOPS", "floor GB/s (weights)", "tokens/s",
                   "peak MB added", "load"):
        table.add_column(column, justify="right")
    report["phases"] = []
    for row in rows:
        floor, seconds = row["floor"], row["seconds"]
        row["peak_mb"] = peak_added(row["work"], device) / MB  # the whole call (a decode phase's: 1 + S tokens)
        row["top"] = profile_top(row.pop("work"), device, sizes.top, row.pop("baseline"))
        entry = {"phase": row["phase"], "seconds": seconds, "floor_seconds": floor.seconds, "ratio": seconds / floor.seconds,
                 "floor_flops": floor.flops, "floor_weight_bytes": floor.weight_bytes, "rows": row["rows"],
                 "head_rows": row["head_rows"], "peak_mb": row["peak_mb"],
                 "floor_tflops": floor.flops / floor.seconds / 1e12, "floor_gb_per_s": floor.weight_bytes / floor.seconds / 1e9,
                 "tokens_per_second": row["tokens"] / seconds, "top": row["top"], "load": load}
        report["phases"].append(entry)
        table.add_row(entry["phase"], f"{1000 * seconds:,.1f}", f"{1000 * floor.seconds:,.1f}", f"{entry['ratio']:.2f}",
                      f"{entry['floor_tflops']:.2f}", f"{entry['floor_gb_per_s']:.1f}", f"{entry['tokens_per_second']:,.1f}",
                      f"{entry['peak_mb']:,.0f}", entry["load"])
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    table.caption = ("decode step = (a call of 1 + S tokens - a call of 1) / S; prefill = the call of 1 - a step (the "
                     "evaluation batch's: less a decode step of as many lanes, where one was timed); tokens/s: the phase's tokens "
                     "(prompt tokens, lanes, trained tokens) a second; peak MB added: one call (the resident set on a CPU, "
                     "memory allocated on a GPU)")
    console.print(table)
    for entry in report["phases"]:
        per = f", {S} steps" if entry["phase"].startswith("decode") else ""
        top = Table(title=f"profile: {entry['phase']}{per}, top {sizes.top} operations by self time")
        for column in ("operation", "input shapes", "calls", "ms", "share"):
            top.add_column(column, justify="right" if column in ("calls", "ms", "share") else "left")
        for op in entry["top"]:
            top.add_row(op["op"], op["shapes"], str(op["calls"]), f"{op['ms']:,.1f}", f"{op['share']:.0%}")
        console.print(top)
    return report


def training_batch(tokenizer, words: int, rows: int, tokens: int, device):
    """A training read's batch: `rows` rows of `tokens` random ids, the first quarter prompt, the rest
    response with one parallel block of two paths in it (every response token weighted).
    -> (TokenBatch, weighted positions)"""
    tags = Policy.for_tokenizer(tokenizer).tag_ids
    prompt = tokens // 4
    body = random_prompts(rows, tokens - prompt - 8, words, 7)
    responses = []
    for ids in body:
        third = len(ids) // 3
        responses.append(ids[:third] + [tags.block_open, tags.path_open] + ids[third:2 * third] + [tags.path_close, tags.path_open]
                         + ids[2 * third:] + [tags.path_close, tags.block_close, tags.summary_open, tags.summary_close])
    batch = make_batch(random_prompts(rows, prompt, words, 8), responses, [[1.0] * len(r) for r in responses],
                       pad_id=tokenizer.pad_token_id or 0, device=device)
    return batch, int((batch.target_mask > 0).sum())
