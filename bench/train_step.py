"""Benchmark one GRPO step split into its parts, under each training read of the LM head.

    python bench/train_step.py                      # the CPU contestants, both reads
    python bench/train_step.py --quick              # smaller sizes, a smoke run
    python bench/train_step.py --no-long            # without the 8 x 1,024-token memory rows
    python bench/train_step.py --full-size 1.5b     # GPU only: a random Qwen2.5-1.5B, 4-bit + LoRA
    python bench/train_step.py --help               # every flag (BenchConfig)

One step as `grpo.grpo_step` runs it: `sample` B prompts x G responses at temperature 1, random
+-1 rewards -> `group_advantages`, then the update *written out here part by part*, micro-batch
by micro-batch, each part timed directly, on the same rollouts for both training reads of
`forward.trace_logprobs`:
  plain     head_read="plain": the model's [rows, T, V] logits, their float32 log_softmax, gather
  chunked   head_read="chunked": the decoder, then the LM head CHUNK_BYTES of float32 logits at a
            time (220 positions on the real vocabulary), recomputed in backward (head.py)
On-policy pi_old is the training read detached under both, so there is no pi_old read.
The parts:
  sample              nanopar's sampler (shared: both reads train on its rollouts); a logit bias
                      on three tag rows (a hook on the output embedding, removed for training)
                      makes <Parallel>, </Path> and </Summary> likely, so forks happen; no EOS:
                      every response spends its token budget
  no-grad read        the read inside `Reference.active()`: the KL reference read (added to the
                      step only when kl_beta > 0), and pi_old's read when updates > 1
  layout              `build_layout` alone (4D mask + positions): a share of each read
  forward+backward+opt  the read with entropy + `policy_loss` + backward per micro-batch, then
                      `apply_gradients` (clip, AdamW step): the rest of the update, kl_beta 0
  grpo_update         the library function itself (kl_beta 0) as a check, ~ train (not for the
                      real vocabulary on CPU)
Contestants: a ~1M-parameter tiny Qwen3 (2k vocab) in structured and in causal mode, and a
9.8M tiny Qwen3 with the real 151,936-token vocabulary (policy vocabulary 151,675 = Qwen's
tokenizer + 6 tags, as in a real run); all float32, B = 4 prompts x G = 8 responses x 128
sampled tokens, micro-batch 8 (GRPOSettings' default): rows of ~152 tokens. `--long` (on by
default, CPU): the real vocabulary at B = 1 x G = 8 x 1,024 sampled tokens, one micro-batch of
8 x ~1,040 tokens, one round, memory only; its plain read runs only where its memory, estimated
from the 8 x 152 rows (linear in tokens), stays under half of the memory available.
--full-size (GPU only): a randomly initialised model of Qwen2.5-0.5B's or 1.5B's shape (no
download), reloaded 4-bit NF4, gradient checkpointing, LoRA r16 + tag rows (nanopar.model.apply_lora),
bf16, B = 4 x G = 8 x 1,024 sampled tokens, micro-batch 2; bench/memory_plan.py's prediction
printed beside the measured peaks.
The learning rate is 0: AdamW does all its work but the weights stay put, so every round samples
the same (seeded) rollouts and times the same work. Each time is the best of 5 rounds (the real
vocabulary: 2; --quick and --full-size: 1) after a warm-up round; every round runs one step of
every contestant still racing, in turn. The load average is printed before and after: on a
shared machine a busy core slows torch's 2-thread CPU kernels far more than by half.
Peak memory per part: on CPU the peak resident-set rise (bench/common.py), measured in the
untimed warm-up step; on a GPU `torch.cuda.max_memory_allocated` during the part: absolute,
weights and optimiser state included.
Not here: rewards (random numbers), data loading, logging, checkpoints; the read alone across
vocabulary sizes (bench/head_read.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass

import psutil
import torch
from rich.console import Console
from rich.table import Table

from nanopar.config import parse_config
from nanopar.forward import micro_batches, trace_logprobs
from nanopar.grpo import GRPOSettings, Reference, group_advantages, grpo_update, policy_loss, rollout_batch
from nanopar.layout import build_layout, mask_dtype
from nanopar.optim import apply_gradients, make_optimizer
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import TagIds
from nanopar.tiny import bias_logits, tiny_qwen_model

import memory_plan
from common import MB, PAD, PeakRSS

TAG_RATES = {"block_open": 0.03, "path_close": 0.05, "summary_close": 0.05}  # target p(tag) per step
QWEN25 = {  # the shapes of Qwen2.5-0.5B / 1.5B (their config.json), for --full-size
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
}
REAL_VOCAB, REAL_TOKENIZER = 151936, 151669  # Qwen's embedding rows; its tokenizer before the tags
PLAIN, CHUNKED = "plain", "chunked"  # forward.trace_logprobs' head_read


@dataclass
class BenchConfig:
    quick: bool = False  # smaller sizes, one round: a smoke run
    full_size: str = ""  # GPU only: "0.5b" or "1.5b", a random Qwen2.5 of that shape, 4-bit + LoRA ("" = the CPU contestants)
    long: bool = True  # also the real vocabulary at 8 x 1,024 tokens: peak memory, one round (CPU contestants)
    baseline: bool = True  # also the plain read (log_softmax of the full logits) beside the chunked one
    micro_batch: int = 0  # rows per forward/backward (0 = 8; 2 with --full-size)
    micro_batch_tokens: int = 0  # instead: rows sorted by length, packed so that rows x longest row <= this (0 = off)
    chunk: int = 0  # positions per LM-head chunk of the chunked read (0 = head.CHUNK_BYTES: 220 on the real vocabulary)


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
    rewards: torch.Tensor  # [B * G] fixed +-1 rewards
    reads: tuple[str, ...]  # PLAIN and/or CHUNKED
    repeats: int = 2  # timed rounds (the best counts), after a warm-up round; 0 = the warm-up only
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


def tiny_contestant(name, mode, vocab, tokenizer_vocab, reads, repeats, check, prompts, group, new_tokens, device,
                    **shape):
    model = tiny_qwen_model(vocab_size=vocab, **shape).to(device)
    name = f"{name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M), {mode}"
    tags = TagIds(*range(tokenizer_vocab, tokenizer_vocab + 6))  # the tags end the policy vocabulary
    return Contestant(name, model, mode, tags, tokenizer_vocab + 6, make_prompts(prompts, tags), group, new_tokens,
                      make_rewards(prompts * group, group), reads, repeats, check)


def make_prompts(batch, tags: TagIds, length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [length - (i % 4) for i in range(batch)]  # different lengths: padding matters
    return [torch.randint(10, tags.block_open - 10, (n,), generator=g).tolist() for n in lengths]


def make_rewards(n, group, seed=0):
    """[n] random +-1, every group of `group` holding both: grpo_update does not read a group of one
    reward (advantage 0), and the step timed here reads every row."""
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.randint(0, 2, (n,), generator=g).float() * 2 - 1).view(-1, group)  # [B, G]
    one_reward = rewards.eq(rewards[:, :1]).all(-1)  # [B]
    rewards[one_reward, 0] *= -1
    return rewards.flatten()


# --- measuring -------------------------------------------------------------------------------
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
def grpo_step(c: Contestant, config: BenchConfig, clocks: dict[str, Clock], check: bool, skip: set) -> dict:
    """One GRPO step of `c`: sampled once, then the update part by part with each training read
    (`clocks[read]`; the plain read leaves out the parts in `skip`), then (`check`) grpo_update itself on the
    same rollouts. -> sizes for the table"""
    model = c.model
    policy = Policy(c.tags, c.mode, 1.0, c.vocab_size)
    settings = SamplerSettings(max_new_tokens=c.new_tokens, seed=0)
    hook = bias_logits(model, c.tag_bias)
    first = clocks[c.reads[0]]
    try:
        rollouts = first("sample", lambda: sample(model, c.prompts, policy, settings, eos_ids=[],
                                                  samples_per_prompt=c.group))
    finally:
        hook.remove()
    advantages = group_advantages(c.rewards, c.group)  # [B * G]
    grpo = GRPOSettings(micro_batch=config.micro_batch, micro_batch_tokens=config.micro_batch_tokens)  # kl 0, on-policy
    batch = rollout_batch(rollouts, PAD, model.device)
    groups = micro_batches(batch.lengths(), grpo.micro_batch, grpo.micro_batch_tokens)
    micros = [batch.rows(rows) for rows in groups]
    total = batch.target_mask.sum().clamp(min=1)  # sampled tokens in the whole batch
    adv = advantages.to(model.device)
    dtype = mask_dtype(model)
    first("layout", lambda: [build_layout(m.input_ids, c.tags, c.mode, m.attention_mask, m.prompt_lengths, dtype)
                             for m in micros])
    model.train()
    for read in c.reads:
        clock, left_out = clocks[read], skip if read == PLAIN else set()
        if read != c.reads[0]:
            clock.seconds["sample"], clock.seconds["layout"] = first.seconds["sample"], first.seconds["layout"]
        fn = lambda *a, **k: trace_logprobs(*a, chunk=config.chunk or None, head_read=read, **k)  # noqa: E731

        @torch.no_grad()
        def reference_read():
            with c.reference.active():
                return [fn(model, m, policy)[0] for m in micros]  # [b, T-1] each

        if "ref" not in left_out:
            clock("ref", reference_read)

        def train():
            c.optimizer.zero_grad(set_to_none=True)
            for rows, micro in zip(groups, micros):
                new, entropy = fn(model, micro, policy, with_entropy=True)  # [b, T-1] each
                loss = policy_loss(new, new.detach(), adv[rows], micro.target_mask, total, grpo.clip)
                loss.backward()
                loss.item()  # grpo_update logs the loss, the entropy and the gap: each a sync
                (entropy * micro.target_mask).sum().item()
                ((new.detach() - micro.recorded) * micro.target_mask).abs().sum().item()
            apply_gradients(model, c.optimizer, grpo.max_grad_norm)

        if "train" not in left_out:
            clock("train", train)
        if check:
            settings = dataclasses.replace(grpo, head_read=read)
            clock("grpo_update", lambda: grpo_update(model, c.optimizer, rollouts, advantages, policy, settings, PAD))
    widths = [m.input_ids.shape[1] for m in micros]
    return dict(
        responses=len(rollouts), new_tokens=sum(r.stats.new_tokens for r in rollouts),
        forks=sum(r.stats.forks for r in rollouts), cache_mb=rollouts[0].stats.peak_cache_bytes / MB,
        read_tokens=int(batch.attention_mask.sum()), trained=int(batch.target_mask.sum()),
        micro=len(micros), rows=max(len(g) for g in groups), T=max(widths),
        mask_mb=max(len(m) * w * w for m, w in zip(micros, widths)) * torch.finfo(dtype).bits / 8 / MB,
    )


def race(contestants, config: BenchConfig, device, skips: dict[int, set]):
    """Best seconds of every part of every contestant and read over its `repeats` rounds after a
    warm-up round; each round runs one step of every contestant still racing, in turn. Peak
    memory is measured in the warm-up round (its times are thrown away unless `repeats` is 0:
    on CPU the watching thread costs time), and on a GPU in every round."""
    best = [{read: {} for read in c.reads} for c in contestants]
    peaks = [{read: {} for read in c.reads} for c in contestants]
    sizes = [None] * len(contestants)
    for round in range(max(c.repeats for c in contestants) + 1):
        for i, c in enumerate(contestants):
            if round > c.repeats:
                continue
            clocks = {read: Clock(device, memory=round == 0) for read in c.reads}
            sizes[i] = grpo_step(c, config, clocks, c.check and round > 0, skips.get(i, set()))
            for read, clock in clocks.items():
                for part, mb in clock.peak_mb.items():
                    peaks[i][read][part] = max(peaks[i][read].get(part, 0.0), mb)
                for part, seconds in clock.seconds.items():
                    counted = seconds if round or not c.repeats else math.inf
                    best[i][read][part] = min(best[i][read].get(part, math.inf), counted)
    return best, peaks, sizes


# --- the table -------------------------------------------------------------------------------
def add_rows(table, c: Contestant, best, peak, size, config: BenchConfig, note: str = ""):
    """One block of rows: each part under each read, and the ratios plain / chunked."""
    def cell(read, part, what):
        if read not in best or part not in best[read] or best[read][part] == math.inf:
            return "—"
        return f"{best[read][part]:.3f}" if what == "s" else f"{peak[read][part]:,.0f}" if part in peak[read] else "-"

    def ratio(part):  # time plain / chunked, memory chunked / plain
        if PLAIN not in best or CHUNKED not in best or part not in best[CHUNKED] or part not in best[PLAIN]:
            return "", ""
        t0, t1 = best[PLAIN][part], best[CHUNKED][part]
        speed = f"{t0 / t1:.2f}x" if math.isfinite(t0) and math.isfinite(t1) and t1 > 0 else ""
        m0, m1 = peak[PLAIN].get(part), peak[CHUNKED].get(part)
        return speed, (f"{100 * m1 / m0:.0f}%" if m0 and m1 is not None else "")

    micro = (f"micro-batches of {config.micro_batch} rows" if not config.micro_batch_tokens
             else f"micro-batches packed under {config.micro_batch_tokens:,} tokens")
    rows = [  # (label, part, shared by both reads, note)
        ("sample (shared)", "sample", True,
         f"{size['responses']} x {c.new_tokens} sampled = {size['new_tokens']:,} tokens with tags; "
         f"{size['forks']} fork(s); KV {size['cache_mb']:.1f} MB"),
        ("no-grad read (KL ref)", "ref", False,
         f"also π_old's when updates > 1; {size['read_tokens']:,} tokens read, {size['micro']} {micro}, "
         f"longest row {size['T']}"),
        ("  layout (in each read)", "layout", True, f"4D mask: {size['mask_mb']:.2f} MB per micro-batch"),
        ("forward+backward+opt", "train", False, f"{size['trained']:,} sampled tokens in the loss"),
        ("grpo_update (check)", "grpo_update", False, "the library function, kl 0: ~ the train row"),
    ]
    first = c.reads[0]
    for i, (label, part, shared, row_note) in enumerate(rows):
        if not any(part in best[read] and best[read][part] < math.inf for read in c.reads):
            continue
        if shared:
            cells = [cell(first, part, "s"), cell(first, part, "mb"), "same", ""]
        else:
            cells = [cell(PLAIN, part, "s"), cell(PLAIN, part, "mb"), cell(CHUNKED, part, "s"), cell(CHUNKED, part, "mb")]
        speed, memory = ("", "") if shared else ratio(part)
        table.add_row(c.name if i == 0 else "", label, *cells, speed, memory, row_note)
    steps = {}
    for read, parts in best.items():
        if all(p in parts and math.isfinite(parts[p]) for p in ("sample", "train")):
            step = parts["sample"] + parts["train"]
            steps[read] = (step, step + parts["ref"] if "ref" in parts else math.nan)
    cells = {read: f"{s:.3f} ({k:.3f})" for read, (s, k) in steps.items()}
    peak_of = {read: f"{max(peak[read].values()):,.0f}" if peak[read] else "" for read in steps}
    speed = f"{steps[PLAIN][0] / steps[CHUNKED][0]:.2f}x" if len(steps) == 2 else ""
    table.add_row("", "step, kl 0 (kl > 0)", cells.get(PLAIN, ""), peak_of.get(PLAIN, ""), cells.get(CHUNKED, ""),
                  peak_of.get(CHUNKED, ""), speed, "",
                  note or f"sample + train (+ no-grad read); best of {c.repeats} after a warm-up", end_section=True)


def full_size_contestant(size, config: BenchConfig, device):
    """A randomly initialised model of Qwen2.5-`size`'s shape, saved and reloaded 4-bit NF4 as
    `load_model` does it, gradient checkpointing on, LoRA (+ tag rows) through `apply_lora`."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from nanopar.model import ModelSettings, _model_kwargs, apply_lora, disable_bnb_cpu_repack, resolve_device_and_dtype

    hf_config = Qwen2Config(**QWEN25[size], num_key_value_heads=2, vocab_size=REAL_VOCAB, tie_word_embeddings=True,
                            max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
    settings = ModelSettings("random", device=device.type, load_in_4bit=True, lora=True, gradient_checkpointing=True)
    device_name, dtype = resolve_device_and_dtype(settings)
    with tempfile.TemporaryDirectory(prefix="nanopar-bench-") as folder:  # ~1 / 3 GB in bf16
        with torch.device(device):
            AutoModelForCausalLM.from_config(hf_config, dtype=dtype).save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, **_model_kwargs(settings, device_name, dtype))
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the bf16 model that was saved
    disable_bnb_cpu_repack(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    tags = TagIds(*range(REAL_TOKENIZER, REAL_TOKENIZER + 6))  # where Qwen's tokenizer puts them
    model = apply_lora(model, settings, tags)
    name = f"Qwen2.5-{size.upper()} shape, random, 4-bit + LoRA r{settings.lora_rank}, structured"
    reads = (PLAIN, CHUNKED) if config.baseline else (CHUNKED,)
    return Contestant(name, model, "structured", tags, REAL_TOKENIZER + 6, make_prompts(4, tags), 8, 1024,
                      make_rewards(4 * 8, 8), reads, 1)


def full_size_plan(size: str, config: BenchConfig, peaks: dict, console) -> None:
    """bench/memory_plan.py's prediction for the --full-size step beside what was measured here
    (`torch.cuda.max_memory_allocated` per part, absolute): B = 4 x G = 8 x 1,024 new tokens,
    prompts of 16 tokens, K = 2 paths, 4 blocks, checkpointing on. The plan is a bound (every
    response inside a K-path block, every row as wide as the longest) and leaves out the CUDA
    context and the allocator's fragmentation, which max_memory_allocated also leaves out."""
    name = f"qwen2.5-{size}"
    T = memory_plan.sequence_tokens(16, 1024, 2, 4)
    micro = config.micro_batch if not config.micro_batch_tokens else max(1, config.micro_batch_tokens // T)
    shared = dict(prompts=4, samples=8, new_tokens=1024, prompt_tokens=16, paths=2, max_blocks=4,
                  micro_batch=micro, checkpointing=True)
    table = Table(title=f"bench/memory_plan.py's plan for this step ({name}, micro-batch {micro}, rows <= {T} "
                        "tokens) beside the measured peaks, MB")
    for column in ("read", "part", "predicted (plan)", "measured (cuda max allocated)", "measured / predicted"):
        table.add_column(column)
    for read, chunk in ((CHUNKED, config.chunk or memory_plan.DEFAULT_CHUNK), (PLAIN, 0)):
        if read not in peaks:
            continue
        plan = memory_plan.predict(name, chunk_tokens=chunk, **shared)
        for part, key in (("sample", "sampling_peak"), ("train", "training_peak")):
            if part not in peaks[read] or (read == PLAIN and part == "sample"):
                continue
            predicted, measured = plan[key] / MB, peaks[read][part]
            table.add_row(read, part, f"{predicted:,.0f}", f"{measured:,.0f}", f"{measured / predicted:.2f}")
    console.print(table)


def long_plan(short_peaks: dict, short_tokens: int, long_tokens: int) -> tuple[set, str]:
    """Which parts of the plain read the 8 x 1,024 step leaves out: those whose memory,
    scaled linearly in tokens from the 8 x 152 step, exceeds half of the memory available now.
    -> (skipped parts, a note)"""
    available = psutil.virtual_memory().available / MB
    skipped, notes = set(), []
    for part, label in (("ref", "no-grad read"), ("train", "training pass")):
        need = short_peaks.get(part, math.inf) * long_tokens / short_tokens
        if need > available / 2:
            skipped.add(part)
            notes.append(f"{label} needs ~{need / 1024:.1f} GB")
    note = (f"plain read skipped where they would not fit: {', '.join(notes)} (scaled from 8 x 152), "
            f"{available / 1024:.1f} GB available" if skipped else "")
    return skipped, note


def main(argv: list[str] | None = None):
    config = parse_config(BenchConfig, argv, description=__doc__.splitlines()[0])
    if config.full_size and config.full_size not in QWEN25:
        raise SystemExit(f"bench/train_step.py: unknown --full-size {config.full_size!r}: use {' or '.join(QWEN25)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config.full_size and device.type != "cuda":
        raise SystemExit("bench/train_step.py: --full-size needs a CUDA GPU (4-bit bitsandbytes + LoRA at full size); torch sees none")
    config.micro_batch = config.micro_batch or (2 if config.full_size else 8)
    prompts, group = (2, 4) if config.quick else (4, 8)  # B, G
    new_tokens = 32 if config.quick else 128
    reads = (PLAIN, CHUNKED) if config.baseline else (CHUNKED,)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    console = Console(width=240)
    console.print(f"device: {device.type} ({where}); load average before: {os.getloadavg()[0]:.2f}")
    torch.manual_seed(0)
    if config.full_size:
        contestants = [full_size_contestant(config.full_size, config, device)]
    else:
        small = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
        real = dict(hidden_size=64, num_layers=2)
        rounds = lambda n: 1 if config.quick else n
        shared = dict(prompts=prompts, group=group, new_tokens=new_tokens, device=device)
        contestants = [
            tiny_contestant("1M params, 2k vocab", "structured", 2048, 2042, reads, rounds(5), True, **shared, **small),
            tiny_contestant("1M params, 2k vocab", "causal", 2048, 2042, reads, rounds(5), True, **shared, **small),
            # a step takes ~25 s on a 2-core CPU: best of 2, and grpo_update not timed again
            tiny_contestant("real 151,936 vocab", "structured", REAL_VOCAB, REAL_TOKENIZER, reads, rounds(2), False,
                            **shared, **real),
        ]
    best, peaks, sizes = race(contestants, config, device, {})
    memory_label = "peak MB (cuda max allocated)" if device.type == "cuda" else "peak MB (RSS rise)"
    table = Table(title=f"one GRPO step, part by part ({where}, B={prompts} x G={group}, "
                        f"{new_tokens} new tokens{', quick' if config.quick else ''})")
    for column in ("model", "part", "plain: s", "plain: MB", "chunked: s", "chunked: MB", "speed-up",
                   "MB chunked/plain", "note"):
        table.add_column(column, overflow="fold")
    table.caption = (f"plain = log_softmax of the full logits; chunked = head.py; MB = {memory_label}; "
                     "speed-up = plain / chunked seconds")
    for c, b, p, s in zip(contestants, best, peaks, sizes):
        add_rows(table, c, b, p, s, config)
    if config.full_size:
        full_size_plan(config.full_size, config, peaks[0], console)
    if config.long and not config.full_size and device.type == "cpu":
        short_tokens = sizes[-1]["rows"] * sizes[-1]["T"]
        long_tokens = config.micro_batch * (16 + (64 if config.quick else 1024) + 16)  # ~ rows x (prompt + response)
        skipped, note = long_plan(peaks[-1].get(PLAIN, {}), short_tokens, long_tokens) if config.baseline else (set(), "")
        long = tiny_contestant(f"real 151,936 vocab, {64 if config.quick else 1024} new tokens", "structured", REAL_VOCAB, REAL_TOKENIZER, reads, 0,
                               False, 1, config.micro_batch, 64 if config.quick else 1024, device, **real)
        console.print(f"the 8 x 1,024 step; {note or 'every part of both reads fits'}; load average {os.getloadavg()[0]:.2f}")
        long_best, long_peaks, long_sizes = race([long], config, device, {0: {"ref", "train"} & skipped})
        add_rows(table, long, long_best[0], long_peaks[0], long_sizes[0], config,
                 note or "one round: times measured with the memory watcher on")
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
