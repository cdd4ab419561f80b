"""Benchmark one GRPO step split into its parts; prints one table, the contestants taking turns.

    python bench/train_step.py                      # about 3 minutes on a 2-core CPU
    python bench/train_step.py --quick              # smaller sizes, a smoke run
    python bench/train_step.py --full-size 1.5b     # GPU only: a random Qwen2.5-1.5B, 4-bit + LoRA

One step as `runner.grpo_step` runs it: `sample` B prompts x G responses at temperature 1, random
+-1 rewards -> `group_advantages`, then `grpo_update` *written out here part by part*, the same
calls in the same order, micro-batch by micro-batch, each part timed directly:
  sample              nanopar's sampler; a logit bias on three tag rows (a hook on the output
                      embedding, removed for training) makes <Parallel>, </Path> and </Summary>
                      likely, so forks happen; no EOS: every response spends its token budget
  pi_old read         `rollout_batch` + the no-grad `trace_logprobs` pass grpo_update does first
  KL reference read   the same pass inside `Reference.active()`: added only when kl_beta > 0
  layout              `build_layout` alone (4D mask + positions): a share of each read above/below
  forward+backward+opt  `trace_logprobs` (with entropy) + `policy_loss` + backward per micro-batch,
                      then `apply_gradients` (clip, AdamW step): the rest of grpo_update, kl_beta 0
  grpo_update         the library function itself (kl_beta 0) as a check: ~ pi_old read + train
                      (not for the real vocabulary on CPU: 20 s more per round)
Contestants: a ~1M-parameter tiny Qwen3 (2k vocabulary) in structured and in causal mode (the
mode of the sampler and of the training forward), and a tiny Qwen3 with the real 151,936-token
vocabulary (policy vocabulary 151,675 = Qwen's tokenizer + 6 tags, as in a real run); all float32,
B = 4 prompts x G = 8 responses x 128 sampled tokens, micro-batch 8 (GRPOSettings' default).
--full-size (GPU only): a randomly initialised model of Qwen2.5-0.5B's or 1.5B's shape (no
download), reloaded 4-bit NF4, gradient checkpointing, LoRA r16 + tag rows (nanopar.model.apply_lora),
bf16, B = 4 x G = 8 x 1,024 sampled tokens, micro-batch 2 (the [rows, T, 151,675] float32
log-probs are the largest tensors of the step, 0.63 GB per row at T = 1,040, and there are several).
The learning rate is 0: AdamW does all its work but the weights stay put, so every round samples
the same (seeded) rollouts and times the same work. Each time is the best of 5 rounds (the real
vocabulary: 2, its step takes ~45 s; --quick and --full-size: 1) after a warm-up round; every
round runs one step of every contestant still racing, in turn. The load average is printed
before and after: this is a shared machine, and a busy core slows torch's 2-thread CPU kernels
far more than by half (its worker threads wait on each other).
Tokens/s: sampling = response tokens written (sampled + inserted tags) per second; the reads and
training = tokens the forward reads (prompt + response, padding excluded) per second.
Peak memory per part: on CPU the peak resident set of the process (psutil, sampled every 2 ms by
a thread) minus the one at the start of the part, after freed heap pages are handed back to the
system (glibc `malloc_trim`), measured in the untimed warm-up step; on a GPU
`torch.cuda.max_memory_allocated` during the part: absolute, weights and optimiser state included.
Not here: rewards (random numbers), data loading, logging, checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from rich.console import Console
from rich.table import Table

from nanopar.forward import trace_logprobs
from nanopar.grpo import GRPOSettings, Reference, group_advantages, grpo_update, policy_loss, rollout_batch
from nanopar.layout import build_layout, mask_dtype
from nanopar.optim import apply_gradients, make_optimizer
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import PAD, bias_logits  # noqa: E402  (the tests' logit-bias hook: one home for both)

MB = 2**20
TAG_RATES = {"block_open": 0.03, "path_close": 0.05, "summary_close": 0.05}  # target p(tag) per step
QWEN25 = {  # the shapes of Qwen2.5-0.5B / 1.5B (their config.json), for --full-size
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
}
REAL_VOCAB, REAL_TOKENIZER = 151936, 151669  # Qwen's embedding rows; its tokenizer before the tags


@dataclass
class Contestant:
    name: str  # as the table shows it
    model: torch.nn.Module
    mode: str  # "structured" or "causal": sampler and training forward
    tags: TagIds
    vocab_size: int  # the policy's vocabulary (ids >= it are never drawn)
    prompts: list[list[int]]  # B prompts
    group: int  # G: responses per prompt
    new_tokens: int  # sampled tokens per response
    micro_batch: int  # rows per forward/backward
    rewards: torch.Tensor  # [B * G] fixed +-1 rewards
    repeats: int = 2  # timed rounds (the best counts), after a warm-up round
    check: bool = True  # also time grpo_update itself in the timed rounds

    def __post_init__(self):
        self.optimizer, _ = make_optimizer(self.model, lr=0.0)  # lr 0: same work, weights stay put
        for p in self.optimizer.param_groups[0]["params"]:  # create AdamW's state now, so that
            p.grad = torch.zeros_like(p)  # the first measured step does not allocate it
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.reference = Reference(self.model)
        # added to the tag logits while sampling; uniform-ish random logits: p(tag) ~ rate
        self.tag_bias = {getattr(self.tags, name): math.log(rate * self.vocab_size) for name, rate in TAG_RATES.items()}


def tiny_contestant(name, mode, vocab, tokenizer_vocab, args, device, repeats, check, **shape):
    model = tiny_qwen_model(vocab_size=vocab, **shape).to(device)
    name = f"{name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M), {mode}"
    tags = TagIds(*range(tokenizer_vocab, tokenizer_vocab + 6))  # the tags end the policy vocabulary
    return Contestant(name, model, mode, tags, tokenizer_vocab + 6, make_prompts(args.prompts, tags),
                      args.group, args.new_tokens, args.micro_batch, make_rewards(args.prompts * args.group),
                      1 if args.quick else repeats, check)


def make_prompts(batch, tags: TagIds, length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [length - (i % 4) for i in range(batch)]  # different lengths: padding matters
    return [torch.randint(10, tags.block_open - 10, (n,), generator=g).tolist() for n in lengths]


def make_rewards(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g).float() * 2 - 1  # [n] +-1


# --- measuring -------------------------------------------------------------------------------
def hand_back_free_memory():
    """Return freed heap pages to the system (glibc), so the next part's RSS rise is its own."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class PeakRSS:
    """`with PeakRSS() as p:` ... `p.rise`: peak resident bytes above those at the start."""

    def __enter__(self):
        hand_back_free_memory()
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()
        return self

    def watch(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)
        self.rise = self.peak - self.start


class Clock:
    """Runs the parts of one step: the seconds of each, and its peak memory (always on a GPU,
    where it is free; on CPU only when `memory`, since the watching thread takes CPU time)."""

    def __init__(self, device: torch.device, memory: bool):
        self.cuda, self.memory = device.type == "cuda", memory or device.type == "cuda"
        self.seconds, self.peak_mb = {}, {}

    def __call__(self, part: str, fn):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        watch = PeakRSS() if self.memory and not self.cuda else contextlib.nullcontext()
        with watch:
            start = time.perf_counter()
            result = fn()
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[part] = time.perf_counter() - start
        if self.cuda:
            self.peak_mb[part] = torch.cuda.max_memory_allocated() / MB
        elif self.memory:
            self.peak_mb[part] = watch.rise / MB
        return result


# --- one step --------------------------------------------------------------------------------
def grpo_step(c: Contestant, clock: Clock, check: bool = True) -> dict:
    """One GRPO step of `c`, part by part through `clock`, then (`check`) grpo_update itself on
    the same rollouts. -> sizes for the table"""
    model = c.model
    policy = Policy(c.tags, c.mode, 1.0, c.vocab_size)
    settings = SamplerSettings(max_new_tokens=c.new_tokens, seed=0)
    hook = bias_logits(model, c.tag_bias)
    try:
        rollouts = clock("sample", lambda: sample(model, c.prompts, policy, settings, eos_ids=[],
                                                  samples_per_prompt=c.group))
    finally:
        hook.remove()
    advantages = group_advantages(c.rewards, c.group)  # [B * G]
    grpo = GRPOSettings(micro_batch=c.micro_batch)  # kl_beta 0, one update: on-policy
    slices = [slice(i, i + grpo.micro_batch) for i in range(0, len(rollouts), grpo.micro_batch)]
    model.train()

    @torch.no_grad()
    def no_grad_read(batch):
        return [trace_logprobs(model, batch.rows(s), policy)[0] for s in slices]  # [b, T-1] each

    def old_read():
        batch = rollout_batch(rollouts, PAD, model.device)
        return batch, no_grad_read(batch)

    batch, old = clock("old", old_read)

    def reference_read():
        with c.reference.active():
            return no_grad_read(batch)

    clock("ref", reference_read)
    dtype = mask_dtype(model)
    clock("layout", lambda: [build_layout(batch.rows(s).input_ids, c.tags, c.mode, batch.rows(s).attention_mask,
                                          batch.rows(s).prompt_lengths, dtype) for s in slices])
    total = batch.target_mask.sum().clamp(min=1)  # sampled tokens in the whole batch
    adv = advantages.to(model.device)

    def train():
        c.optimizer.zero_grad(set_to_none=True)
        for j, s in enumerate(slices):
            micro = batch.rows(s)
            new, entropy = trace_logprobs(model, micro, policy, with_entropy=True)  # [b, T-1] each
            loss = policy_loss(new, old[j], adv[s], micro.target_mask, total, grpo.clip)
            loss.backward()
            loss.item()  # grpo_update logs the loss and the entropy: each a sync
            (entropy * micro.target_mask).sum().item()
        apply_gradients(model, c.optimizer, grpo.max_grad_norm)

    clock("train", train)
    if check:
        clock("grpo_update", lambda: grpo_update(model, c.optimizer, rollouts, advantages, policy, grpo, PAD))
    widths = [batch.rows(s).input_ids.shape[1] for s in slices]
    return dict(
        responses=len(rollouts), new_tokens=sum(r.stats.new_tokens for r in rollouts),
        forks=sum(r.stats.forks for r in rollouts), cache_mb=rollouts[0].stats.peak_cache_bytes / MB,
        read_tokens=int(batch.attention_mask.sum()), trained=int(batch.target_mask.sum()),
        micro=len(slices), T=max(widths), mask_mb=max(len(batch.rows(s)) * w * w for s, w in zip(slices, widths))
        * torch.finfo(dtype).bits / 8 / MB,
    )


def race(contestants, device):
    """Best seconds of every part of every contestant over its `repeats` rounds after a warm-up
    round; each round runs one step of every contestant still racing, in turn. Peak memory is
    measured in the warm-up round (its times are thrown away: on CPU the watching thread costs
    time), and on a GPU in every round. grpo_update itself runs in the timed rounds only."""
    best = [dict() for _ in contestants]
    peaks = [dict() for _ in contestants]
    sizes = [None] * len(contestants)
    for round in range(max(c.repeats for c in contestants) + 1):
        for i, c in enumerate(contestants):
            if round > c.repeats:
                continue
            clock = Clock(device, memory=round == 0)
            sizes[i] = grpo_step(c, clock, check=c.check and round > 0)
            for part, mb in clock.peak_mb.items():
                peaks[i][part] = max(peaks[i].get(part, 0.0), mb)
            for part, seconds in clock.seconds.items():
                best[i][part] = min(best[i].get(part, math.inf), seconds) if round else math.inf
    return best, peaks, sizes


# --- the table -------------------------------------------------------------------------------
def add_rows(table, c: Contestant, best, peak, size):
    step = best["sample"] + best["old"] + best["train"]  # kl_beta 0
    rate = lambda key, tokens: f"{tokens / best[key]:,.0f}"
    read = size["read_tokens"]
    rows = [  # (part key, label, tokens/s, note)
        ("sample", "sample", rate("sample", size["new_tokens"]),
         f"{size['responses']} x {c.new_tokens} sampled = {size['new_tokens']:,} tokens with tags; "
         f"{size['forks']} fork(s); KV {size['cache_mb']:.1f} MB"),
        ("old", "pi_old read (no grad)", rate("old", read),
         f"{read:,} tokens read, {size['micro']} micro-batch(es), longest row {size['T']}"),
        ("ref", "KL reference read (kl>0)", rate("ref", read), "the same inside Reference.active()"),
        ("layout", "  layout (in each read)", "", f"4D mask: {size['mask_mb']:.2f} MB per micro-batch"),
        ("train", "forward+backward+opt", rate("train", read),
         f"{size['trained']:,} sampled tokens in the loss, micro-batch {c.micro_batch}"),
    ]
    if "grpo_update" in best:
        rows.append(("grpo_update", "grpo_update (kl 0)", rate("grpo_update", read),
                     f"check: pi_old read + train = {best['old'] + best['train']:.3f} s"))
    for i, (key, label, tokens_per_second, note) in enumerate(rows):
        share = f"{100 * best[key] / step:.0f}%" if key in ("sample", "old", "ref", "train") else ""
        table.add_row(c.name if i == 0 else "", label, f"{best[key]:.3f}", share, tokens_per_second,
                      f"{peak[key]:,.0f}" if key in peak else "-", note)
    table.add_row("", "step, kl 0 (kl > 0)", f"{step:.3f} ({step + best['ref']:.3f})", "100%", "",
                  f"{max(peak.values()):,.0f}" if peak else "",
                  f"sample + pi_old + train (+ ref); best of {c.repeats} after a warm-up",
                  end_section=True)


def full_size_contestant(size, args, device):
    """A randomly initialised model of Qwen2.5-`size`'s shape, saved and reloaded 4-bit NF4 as
    `load_model` does it, gradient checkpointing on, LoRA (+ tag rows) through `apply_lora`."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from nanopar.model import ModelSettings, _model_kwargs, apply_lora, disable_bnb_cpu_repack, resolve_device_and_dtype

    config = Qwen2Config(**QWEN25[size], num_key_value_heads=2, vocab_size=REAL_VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
    settings = ModelSettings("random", device=device.type, load_in_4bit=True, lora=True, gradient_checkpointing=True)
    device_name, dtype = resolve_device_and_dtype(settings)
    with tempfile.TemporaryDirectory(prefix="nanopar-bench-") as folder:  # ~1 / 3 GB in bf16
        with torch.device(device):
            AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, **_model_kwargs(settings, device_name, dtype))
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the bf16 model that was saved
    disable_bnb_cpu_repack(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    tags = TagIds(*range(REAL_TOKENIZER, REAL_TOKENIZER + 6))  # where Qwen's tokenizer puts them
    model = apply_lora(model, settings, tags)
    name = f"Qwen2.5-{size.upper()} shape, random, 4-bit + LoRA r{settings.lora_rank}, structured"
    return Contestant(name, model, "structured", tags, REAL_TOKENIZER + 6, make_prompts(args.prompts, tags),
                      args.group, args.new_tokens, args.micro_batch, make_rewards(args.prompts * args.group), 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round: a smoke run")
    parser.add_argument("--full-size", choices=sorted(QWEN25), help="GPU only: a random full-size Qwen2.5, 4-bit + LoRA")
    parser.add_argument("--micro-batch", type=int, default=None, help="rows per forward/backward (8; 2 with --full-size)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.full_size and device.type != "cuda":
        raise SystemExit("bench/train_step.py: --full-size needs a CUDA GPU (4-bit bitsandbytes + LoRA at full size); torch sees none")
    args.prompts, args.group = (2, 4) if args.quick else (4, 8)  # B, G
    args.new_tokens = 1024 if args.full_size else 32 if args.quick else 128
    args.micro_batch = args.micro_batch or (2 if args.full_size else 8)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    console = Console(width=200)
    console.print(f"device: {device.type} ({where}); load average before: {os.getloadavg()[0]:.2f}")
    torch.manual_seed(0)
    if args.full_size:
        contestants = [full_size_contestant(args.full_size, args, device)]
    else:
        small = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
        contestants = [
            tiny_contestant("1M params, 2k vocab", "structured", 2048, 2042, args, device, 5, True, **small),
            tiny_contestant("1M params, 2k vocab", "causal", 2048, 2042, args, device, 5, True, **small),
            # a step takes ~45 s on a 2-core CPU: best of 2, and grpo_update not timed again (+20 s)
            tiny_contestant("real 151,936 vocab", "structured", REAL_VOCAB, REAL_TOKENIZER, args, device, 2, False,
                            hidden_size=64, num_layers=2),
        ]
    best, peaks, sizes = race(contestants, device)
    memory_label = "peak MB (cuda max allocated)" if device.type == "cuda" else "peak MB (RSS rise)"
    table = Table(title=f"one GRPO step, part by part ({where}, B={args.prompts} x G={args.group}, "
                        f"{args.new_tokens} new tokens{', quick' if args.quick else ''})")
    for column in ("model", "part", "seconds", "% of step", "tokens/s", memory_label, "note"):
        table.add_column(column)
    for c, b, p, s in zip(contestants, best, peaks, sizes):
        add_rows(table, c, b, p, s)
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
