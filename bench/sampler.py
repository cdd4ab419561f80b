"""Benchmark the parallel-branch sampler; prints one table, every comparison run side by side.

    python bench/sampler.py                          # about 3-4 minutes on a 2-core CPU
    python bench/sampler.py --quick                  # smaller sizes, one repeat: a smoke run
    python bench/sampler.py --only throughput,toy    # some of the benchmarks
    python bench/sampler.py --help                   # every flag

1. throughput: nanopar's sampler vs `model.generate`, greedy, tags disabled, same prompts,
   batch 1 / 8 / 32, on a ~1M-parameter tiny Qwen3 (2k vocab) and on a tiny Qwen3 with the
   real 151,936-token vocabulary. Target: ratio >= 1.0.
2. parallel acceleration: one block of K paths of L tokens vs decoding the same number of
   tokens one after another in one lane (NPR's speedup). Target: >= 0.75 K for K <= 4.
3. NPR acceleration: one guideline of n = 2 / 4 / 8 plans, its n steps of L tokens decoded side
   by side (one branch per plan, forked at </guideline>) vs the same number of tokens one after
   another in one lane. The model is scripted by position: <guideline>(<plan>k</plan>)*n
   </guideline>, then each step <step>k: (forced by the engine) + L tokens + </step> (inserted),
   then <takeaway> (inserted) and a two-token takeaway, </takeaway>, EOS. No target: compare
   with the Parallel-R1 rows of benchmark 2 (same L, K = n).
4. fork cost: duplicating a cache row K times vs re-prefilling the prefix for each branch
   (Parallel-R1's rollout), prefixes of 256 and 1,024 tokens. Target: >= 5x.
5. toy evaluation speedup (when the default run's model exists, `python train.py`): eval.py's
   first sampler call (32 held-out problems x 4 samples, its sampling settings) decoded with
   forking vs without (the tags read as text), easy and hard: eval.py's `speedup`, raced here
   instead of timed once. Target: >= 1.3 easy, >= 1.0 hard.
6. decode step cost: one plain forward of a decode step (no sampler) on the 1.2M model, timed
   over rows x cached columns and fitted as fixed + per row + per cell (row x column): where the
   fixed part is small, forking (fewer steps, the same row-steps) cannot speed decoding up.
7. cache rebuild: the same sampler call with the plain `LaneCache` (a rebuild copies the new rows
   at once) and with the lazy `LazyLaneCache` (the sampler's default: the rebuild rides on the
   next step's append), on the toy model's default sampling (64 held-out prompts x 8 samples,
   structured, paths 3, budgets 224 / 48, the tags biased so that it forks as a trained model
   does) and on a tiny Qwen with the real 151,936-token vocabulary. The same tokens either way
   (asserted). Target: the lazy one stays the default only where it is >= 1.10x faster.
8. traffic (only with `--only traffic`: it loads the real model, a few minutes): the sampler's
   decode steps as they are against the path they replace ("today": two copies to the device per
   step and one per rebuild for the step mask, the bans written after the forward by indexing
   with Python lists, two reads back, a step mask whose rows are not 8-column aligned), on
   Qwen2.5-Coder-0.5B loaded as train.py loads it, --lanes lanes (--lanes / 32 prompts x 32) at a
   --context-token context (GSM8K chat turns one after another), structured, --tag-bias on
   <Parallel> and </Path> so that lanes fork, merge and meet the block ban. The same tokens and
   log-probs (asserted); decode time per step (prefill excluded). A second table gives, per decode
   step, what a GPU pays for, read from the calls' shapes: KV bytes the attention kernel reads,
   KV bytes copied into new buffers (rebuilds, and the lazy cache's full buffers), rebuilds,
   copies to the device and reads back. `--census` runs the new path once, no race (for long
   --traffic-tokens runs: how often rows are rebuilt). Target: no slower than today.
Each time is the best of `--repeats` runs after a warm-up. Cache memory is the peak size of the
keys and values (for `generate`, its final cache). Each row shows the 1-minute load average
before and after its race: on a shared machine compare rows within one run, and prefer
`--clock cpu --threads 1` (process time, which other jobs disturb far less than wall time).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.utils._python_dispatch import TorchDispatchMode

from common import MB, gsm8k_prompts, load_bench_model
from nanopar import kvcache
from nanopar import sampler as sampler_module
from nanopar.config import parse_config
from nanopar.kvcache import LaneCache, LazyLaneCache
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import MAX_PATHS, NPR, TagIds, schema_named
from nanopar.tiny import bias_logits, tiny_qwen_model

BENCHMARKS = ("throughput", "acceleration", "npr", "fork", "toy", "steps", "rebuild", "traffic")


@dataclass
class BenchConfig:
    quick: bool = False  # smaller sizes (32 new tokens, paths of 32) and one repeat: a smoke run
    only: str = ",".join(BENCHMARKS[:-1])  # comma list of the benchmarks to run: throughput, acceleration, npr, fork, toy, steps, rebuild, traffic (the real model: only when named)
    repeats: int = 0  # timed rounds per comparison after the warm-up (0 = 5; 1 with --quick)
    threads: int = 0  # torch threads (0 = torch's default)
    toy_model: str = "runs/default/4-rl-hard/final"  # the toy run's model for benchmark 5 (skipped when missing)
    batches: str = "1,8,32"  # batch sizes of the throughput rows
    clock: str = "wall"  # what a race times: "wall" (perf_counter) or "cpu" (this process's CPU time)
    model: str = "pypi:qwen2.5-coder-0.5b"  # benchmark 8's model, loaded as train.py loads it (tiny:qwen2: a random tiny one)
    dtype: str = "auto"  # benchmark 8's dtype: float32, bfloat16 or auto (defaults.cpu_dtype)
    lanes: int = 64  # benchmark 8: lanes decoded side by side (lanes / 32 prompts x 32 samples: one prefill each)
    context: int = 600  # benchmark 8: tokens of each lane's context at its last step (prompt = context - traffic tokens)
    traffic_tokens: int = 32  # benchmark 8: new tokens per response (about the decode steps of a call)
    tag_bias: float = 12.0  # benchmark 8: logit bias on <Parallel> and </Path> (0: the model's own policy, which writes no tags)
    census: bool = False  # benchmark 8: one call of the new path, no race: how often rows are rebuilt over a long call


PROMPT = 16
REPEATS = 5  # set from the config in main()
NEW_TOKENS = 128
QUICK = False
CLOCK = time.perf_counter  # set from the config in main(): perf_counter or process_time
LOAD = ""  # the 1-minute load average before and after the last race, for its row


def race(*fns):
    """Best time of each function over REPEATS rounds, taking turns (and alternating who goes
    first) so drifts in machine speed hit every contestant alike.
    -> [(seconds, result of the last call)] per function"""
    global LOAD
    before = os.getloadavg()[0]
    results = [fn() for fn in fns]  # warm-up
    best = [float("inf")] * len(fns)
    for round in range(REPEATS):
        order = range(len(fns)) if round % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            start = CLOCK()
            results[i] = fns[i]()
            best[i] = min(best[i], CLOCK() - start)
    LOAD = f"{before:.1f} -> {os.getloadavg()[0]:.1f}"
    return list(zip(best, results))


def add_row(table, *cells):
    """A row of the table, with the load average of the race it reports."""
    table.add_row(*cells, LOAD)


def prompts(batch, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [PROMPT - (i % 4) for i in range(batch)]  # different lengths: padding matters
    return [torch.randint(10, vocab - 10, (n,), generator=g).tolist() for n in lengths]


def generate_baseline(model, batch_prompts):
    T = max(map(len, batch_prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in batch_prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in batch_prompts])
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        do_sample=False, pad_token_id=0, eos_token_id=None, return_dict_in_generate=True,
    )
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def throughput_rows(table, batches=(1, 8, 32)):
    models = {
        "1M params, 2k vocab": tiny_qwen_model(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2),
        "real 151,936 vocab": tiny_qwen_model(vocab_size=151936, hidden_size=64, num_layers=2),
    }
    settings, greedy = SamplerSettings(max_new_tokens=NEW_TOKENS), Policy(None, temperature=0)
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters()) / 1e6
        for batch in batches:
            batch_prompts = prompts(batch, model.config.vocab_size)
            (ours, rollouts), (theirs, their_cache) = race(
                lambda: sample(model, batch_prompts, greedy, settings, eos_ids=[]),
                lambda: generate_baseline(model, batch_prompts),
            )
            tokens = batch * NEW_TOKENS
            assert all(r.stats.new_tokens == NEW_TOKENS for r in rollouts)
            add_row(
                table, "throughput (tok/s)", f"{name} ({params:.1f}M), batch {batch}",
                f"{tokens / ours:,.0f}", f"{tokens / theirs:,.0f} generate", f"{theirs / ours:.2f}", ">= 1.0",
                f"{rollouts[0].stats.peak_cache_bytes / MB:.2f} / {their_cache / MB:.2f}",
            )


def forced_block_model(vocab, tags: TagIds, trigger: int):
    """A tiny model made to open one block right after `trigger` and never close a path itself."""
    model = tiny_qwen_model(vocab_size=vocab, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    banned = torch.zeros(vocab)
    banned[list(tags.all())] = -1e4

    def steer(module, args, kwargs, out):
        bias = banned.expand_as(out.logits).clone()
        bias[..., tags.block_open] += 2e4 * (kwargs["input_ids"][:, -1:] == trigger)  # [N, 1]
        out.logits = out.logits + bias
        return out

    model.register_forward_hook(steer, with_kwargs=True)
    return model


def acceleration_rows(table):
    vocab = 2048
    tags = TagIds(*range(vocab - 6, vocab))
    trigger = 5
    model = forced_block_model(vocab, tags, trigger)
    L = 32 if QUICK else 128
    prompt = prompts(1, vocab - 10)[0] + [trigger]
    for K in (2, 4, 8):
        parallel = SamplerSettings(paths=K, max_path_tokens=L, max_new_tokens=K * L + 4)
        # the sequential run decodes as many tokens as the parallel response holds: K (L + 2) + 6
        sequential = SamplerSettings(max_new_tokens=K * (L + 2) + 6)
        (par_time, (par,)), (seq_time, (seq,)) = race(
            lambda: sample(model, [prompt], Policy(tags, temperature=0), parallel, eos_ids=[]),
            lambda: sample(model, [prompt], Policy(None, temperature=0), sequential, eos_ids=[]),
        )
        assert par.stats.forks == 1 and par.stats.path_lengths == [[L + 2] * K], par.stats
        assert seq.stats.new_tokens == par.stats.new_tokens, (seq.stats, par.stats)
        add_row(
            table, "parallel acceleration", f"1 block, K={K} paths of {L} tokens ({par.stats.new_tokens} tokens)",
            f"{par_time * 1000:.0f} ms", f"{seq_time * 1000:.0f} ms sequential", f"{seq_time / par_time:.2f}",
            f">= {0.75 * K:.1f}" if K <= 4 else "(none)",
            f"{par.stats.peak_cache_bytes / MB:.2f} / {seq.stats.peak_cache_bytes / MB:.2f}",
        )


def forced_guideline_model(vocab, tags: TagIds, eos: int, positions: int = 4096):
    """A tiny model that writes what it is told at given rotary positions: `script[p]` (an id, or
    -1 for none) is the token forced after the input at position p. Tags (and EOS) are banned
    everywhere else, so a step never closes itself: `max_path_tokens` closes it.
    -> (model, script [positions] long): fill the script in place before sampling"""
    model = tiny_qwen_model(vocab_size=vocab, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    banned = torch.zeros(vocab)
    banned[[*tags.all(), eos]] = -1e4
    script = torch.full((positions,), -1)

    def steer(module, args, kwargs, out):
        bias = banned.expand_as(out.logits).clone()  # [N, 1, V]
        forced = script[kwargs["position_ids"][:, -1]]  # [N]
        rows = (forced >= 0).nonzero().squeeze(-1)
        bias[rows, -1, forced[rows]] += 2e4
        out.logits = out.logits + bias
        return out

    model.register_forward_hook(steer, with_kwargs=True)
    return model, script


def npr_rows(table):
    """NPR: a guideline of n plans, then its n steps side by side vs the same tokens in one lane."""
    vocab, eos = 2048, 7
    tags = TagIds(block_open=vocab - 9, block_close=None, path_open=vocab - 8, path_close=vocab - 7,
                  summary_open=vocab - 6, summary_close=vocab - 5, plan_open=vocab - 4, plan_close=vocab - 3,
                  plans_close=vocab - 2, labels=tuple((ord(str(k + 1)), ord(":")) for k in range(MAX_PATHS)),
                  schema=NPR)
    model, script = forced_guideline_model(vocab, tags, eos)
    L = 32 if QUICK else 128
    prompt = prompts(1, vocab - 10)[0]
    P = len(prompt)
    for n in (2, 4, 8):
        # <guideline> (<plan> k </plan>) * n </guideline>: response tokens 0 .. G-1, token i at position P + i
        guideline = [tags.block_open]
        for k in range(n):
            guideline += [tags.plan_open, ord(str(k + 1)), tags.plan_close]
        guideline.append(tags.plans_close)
        G = len(guideline)
        # then each step: <step> k : (forced by the engine) + L sampled + </step> (inserted), all
        # at the same positions (stride 0); the merge feeds <takeaway> at position P + G + L + 4
        takeaway_at = P + G + L + 4
        takeaway = [11, 12, tags.summary_close, eos]
        script.fill_(-1)
        script[P - 1 : P - 1 + G] = torch.tensor(guideline)
        script[takeaway_at : takeaway_at + len(takeaway)] = torch.tensor(takeaway)
        parallel = SamplerSettings(paths=n, max_path_tokens=L, max_new_tokens=G + n * L + 16)
        policy = Policy(tags, temperature=0)
        # the sequential run decodes as many tokens as the parallel response holds
        tokens = G + n * (L + 4) + 1 + len(takeaway)
        sequential = SamplerSettings(max_new_tokens=tokens)
        (par_time, (par,)), (seq_time, (seq,)) = race(
            lambda: sample(model, [prompt], policy, parallel, eos_ids=[eos]),
            lambda: sample(model, [prompt], Policy(None, temperature=0), sequential, eos_ids=[]),
        )
        block = par.trace.blocks
        assert par.finish == "eos" and par.stats.forks == 1, par.stats
        assert par.stats.path_lengths == [[L + 4] * n], par.stats
        assert len(block) == 1 and len(block[0].plans) == n == len(block[0].paths) and block[0].well_formed, block
        assert par.stats.new_tokens == tokens == seq.stats.new_tokens, (par.stats, seq.stats)
        add_row(
            table, "NPR acceleration", f"1 guideline, n={n} plans, steps of {L} tokens ({par.stats.new_tokens} tokens)",
            f"{par_time * 1000:.0f} ms", f"{seq_time * 1000:.0f} ms sequential", f"{seq_time / par_time:.2f}",
            "(none)", f"{par.stats.peak_cache_bytes / MB:.2f} / {seq.stats.peak_cache_bytes / MB:.2f}",
        )


def fork_rows(table):
    model = tiny_qwen_model(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    K = 4
    for prefix_length in (256, 1024):
        prefix = torch.randint(10, 2000, (1, prefix_length))
        with torch.no_grad():
            out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)

        def duplicate():
            layers = list(out.cache.layers)
            cache = LaneCache(out.cache, [prefix_length])
            cache.rebuild([0] * K, [])
            cache.settle()  # the sampler's next step would do it; here, now
            result = cache.nbytes()
            out.cache.layers[:] = layers  # undo, for the next repeat
            return result

        def reprefill():
            with torch.no_grad():
                again = model(input_ids=prefix.expand(K, -1), use_cache=True, logits_to_keep=1)
            return sum(layer.keys.nbytes + layer.values.nbytes for layer in again.cache.layers)

        (dup_time, dup_bytes), (pre_time, pre_bytes) = race(duplicate, reprefill)
        add_row(
            table, "fork cost", f"prefix {prefix_length} tokens, K={K}",
            f"{dup_time * 1000:.2f} ms copy", f"{pre_time * 1000:.1f} ms re-prefill", f"{pre_time / dup_time:.1f}",
            ">= 5", f"{dup_bytes / MB:.2f} / {pre_bytes / MB:.2f}",
        )


def toy_rows(table, folder: str):
    """eval.py's speedup on its first sampler call, raced: forking vs the tags read as text."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for eval.py
    import eval as eval_script
    from nanopar.data import load_problems
    from nanopar.defaults import resolve
    from nanopar.model import ModelSettings, load_model
    from nanopar.prompts import build_prompt, instructions_named, stop_ids

    if not Path(folder).exists():
        Console().print(f"toy speedup skipped: no model at {folder} (run `python train.py`)")
        return
    config = eval_script.EvalConfig(model=folder)  # eval.py's defaults: its sampling settings and batch
    resolve(config, [])  # as eval.py: the checkpoint's schema, mode and stride
    schema = schema_named(config.schema)
    model, tokenizer = load_model(ModelSettings(folder), schema)
    policy = Policy.for_tokenizer(tokenizer, config.mode, config.temperature, config.path_stride, schema)
    plain = dataclasses.replace(policy, tag_ids=None)
    settings, eos = SamplerSettings.from_flags(config), stop_ids(model, tokenizer)
    for name in config.benchmarks.split(","):
        problems = load_problems(name)[: config.batch_size]
        instructions = instructions_named(config.instructions, name, schema)
        prompts = [build_prompt(p, tokenizer, instructions, chat=config.chat) for p in problems]
        (par_time, par), (seq_time, seq) = race(
            lambda: sample(model, prompts, policy, settings, eos, config.samples),
            lambda: sample(model, prompts, plain, settings, eos, config.samples),
        )
        par_tokens, seq_tokens = (sum(r.stats.new_tokens for r in rs) for rs in (par, seq))
        forks = sum(r.stats.forks for r in par)
        add_row(
            table, "toy eval speedup (tok/s)", f"{name}, {len(prompts)} x {config.samples} lanes, {forks} forks "
            f"({par_tokens:,} / {seq_tokens:,} tokens)",
            f"{par_tokens / par_time:,.0f}", f"{seq_tokens / seq_time:,.0f} sequential",
            f"{(par_tokens / par_time) / (seq_tokens / seq_time):.2f}", ">= 1.3" if "easy" in name else ">= 1.0",
            f"{par[0].stats.peak_cache_bytes / MB:.2f} / {seq[0].stats.peak_cache_bytes / MB:.2f}",
        )


def step_rows(table):
    """A decode step's forward, fitted as t = fixed + a * rows + c * rows * columns (least squares)."""
    from transformers import DynamicCache

    model = tiny_qwen_model(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    sizes = [(N, W) for W in (20, 60, 120, 200) for N in ((4, 32) if QUICK else (4, 16, 48, 96, 128, 160))]
    times = []
    for N, W in sizes:
        ids = torch.randint(10, 2000, (N, W))
        layers = [(l.keys, l.values) for l in model(input_ids=ids, use_cache=True).cache.layers]
        mask = torch.zeros(N, 1, 1, W + 1)
        mask[0, ..., :3] = torch.finfo(torch.float32).min  # one padded row, as the sampler's steps mostly have
        step = lambda: model(input_ids=ids[:, :1], attention_mask=mask, position_ids=torch.full((N, 1), W),
                             cache=DynamicCache(ddp_cache_data=layers, config=model.config), use_cache=True)
        ((seconds, _),) = race(step)
        times.append(seconds)
    X = torch.tensor([[1.0, N, N * (W + 1)] for N, W in sizes], dtype=torch.float64)  # [S, 3]
    fixed, per_row, per_cell = torch.linalg.lstsq(X, torch.tensor(times, dtype=torch.float64)[:, None]).solution[:, 0].tolist()
    at = lambda N, W: fixed + per_row * N + per_cell * N * (W + 1)
    add_row(
        table, "decode step cost", f"1.2M model, {len(sizes)} sizes: fixed + per row + per cell",
        f"{fixed * 1e3:.2f} ms + {per_row * 1e6:.1f} us + {per_cell * 1e9:.0f} ns", "128 rows x 64 columns",
        f"fixed {fixed / at(128, 64):.0%}", "(none)", "",
    )


def tag_writer(model, tags: TagIds, eos: int):
    """Bias a random model's logits so that at T = 1 it writes blocks about as a trained one does:
    <Parallel> about once in 28 main-chain tokens, </Path> once in 19 path tokens, EOS once in 95;
    the tags the engine inserts itself are all but banned. -> the model"""
    vocab = model.config.vocab_size
    rate = lambda once_in: math.log(vocab / once_in)  # a logit that beats ~uniform logits that often
    bias_logits(model, {tags.block_open: rate(28), tags.path_close: rate(19), eos: rate(95),
                        tags.block_close: -10.0, tags.path_open: -10.0, tags.summary_open: -10.0})
    return model


def rebuild_rows(table):
    """The plain cache rebuild vs the lazy one, the same sampler call, on the toy's default
    sampling and on a tiny Qwen with the real vocabulary."""
    from nanopar.prompts import build_prompt, instructions_named, stop_ids
    from nanopar.toy import heldout, toy_model

    model, tokenizer = toy_model()
    tags = TagIds.from_tokenizer(tokenizer)
    tag_writer(model, tags, tokenizer.eos_token_id)
    problems = heldout("easy", 16 if QUICK else 64)
    toy_prompts = [build_prompt(p, tokenizer, instructions_named("parallel", "toy:easy"), chat=False) for p in problems]
    toy = (f"toy model, default sampling: {len(toy_prompts)} prompts x 8", model, toy_prompts,
           Policy.for_tokenizer(tokenizer, "structured", 1.0, 0), SamplerSettings(seed=0), stop_ids(model, tokenizer), 8)
    vocab = 151936
    real_tags = TagIds(*range(vocab - 6, vocab))
    real_model = tag_writer(tiny_qwen_model(vocab_size=vocab, hidden_size=64, num_layers=2), real_tags, eos=7)
    real = (f"real 151,936 vocab: {8 if QUICK else 16} prompts x 4", real_model, prompts(8 if QUICK else 16, vocab),
            Policy(real_tags), SamplerSettings(paths=2, max_new_tokens=128, max_path_tokens=32, seed=0), [7], 4)
    for name, model, batch_prompts, policy, settings, eos, samples in (toy, real):
        call = lambda cache: sample(model, batch_prompts, policy, settings, eos, samples, lane_cache=cache)
        (lazy_time, lazy), (plain_time, plain) = race(lambda: call(LazyLaneCache), lambda: call(LaneCache))
        assert [(r.ids, r.logprobs) for r in lazy] == [(r.ids, r.logprobs) for r in plain]  # the same samples
        tokens, forks = sum(r.stats.new_tokens for r in lazy), sum(r.stats.forks for r in lazy)
        add_row(
            table, "cache rebuild (s per call)", f"{name} ({tokens:,} tokens, {forks} forks)",
            f"{lazy_time:.2f} lazy", f"{plain_time:.2f} plain", f"{plain_time / lazy_time:.2f}", ">= 1.10 (else plain)",
            f"{lazy[0].stats.peak_cache_bytes / MB:.2f} / {plain[0].stats.peak_cache_bytes / MB:.2f}",
        )

# ------------------------------------------------------------------ 8. traffic


class TodaysDecoder(sampler_module._Decoder):
    """The decode step that the sampler's one-copy-each-way step replaced, for benchmark 8: tokens
    and positions in two copies to the device, the bans built after the forward by indexing with
    Python lists (on a GPU that copy waits for the forward), tokens and log-probs read back in two."""

    def forward(self, lanes):
        device = self.model.device
        tokens = torch.tensor([[lane.pending] for lane in lanes], device=device)  # [N, 1]
        positions = torch.tensor([[lane.position] for lane in lanes], device=device)  # [N, 1]
        out = self.model(input_ids=tokens, attention_mask=self.cache.step_mask(self.dtype, self.window),
                         position_ids=positions, cache=self.cache.cache, use_cache=True)
        self.cache.appended()
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache.nbytes())
        for lane in lanes:
            lane.position += 1
        logits = out.logits[:, -1]
        cells = [(i, ban) for i, lane in enumerate(lanes) if (ban := self.ban(lane)) >= 0]  # (row, token id)
        if not cells:
            return logits, None
        banned = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        rows, ids = zip(*cells)
        banned[list(rows), list(ids)] = True
        return logits, banned

    def read_back(self, tokens, logprobs):
        return tokens.tolist(), logprobs.tolist()


class TodaysLaneCache(LazyLaneCache):
    """The lazy lane cache with the rebuild and step mask that were replaced: the kept rows in one copy
    to the device, the padding per row in another at the next step, mask rows `width // 4 + 16` spare
    columns long (a row stride that is a multiple of 8 only by chance)."""

    def rebuild(self, keep, extra):
        self.lens = [self.lens[r] for r in keep] + [piece[0][0].shape[-2] for piece in extra]
        self._mask = None
        self._rebuild_layers(torch.tensor(keep, dtype=torch.long, device=self.device), extra, max(self.lens, default=0))

    def step_mask(self, dtype, window=None):
        width = self.width
        if min(self.lens) == width:
            return None
        if self._mask is None or self._mask.shape[-1] < width + 1 or self._mask.dtype != dtype:
            columns = torch.arange(width + 1 + max(16, width // 4), device=self.device)
            pad = width - torch.tensor(self.lens, device=self.device)  # [N]
            self._mask = torch.zeros(len(self.lens), len(columns), dtype=dtype, device=self.device)
            self._mask.masked_fill_(columns[None, :] < pad[:, None], torch.finfo(dtype).min)
        return self._mask[:, None, None, : width + 1]


class Traffic(TorchDispatchMode):
    """What a sampler call's decode steps would move on a GPU, counted from the ops' shapes: KV bytes the
    attention kernels read, tensors made from Python data (a copy to the device each: 0-dim ones are
    scalars, passed by value), values read back (`tolist`, `item`). With `counting()`: also the KV bytes
    the cache's layers copy into new buffers and the rebuilds."""

    def __init__(self):
        super().__init__()
        self.steps = self.kv_read = self.kv_copied = self.rebuilds = self.to_device = self.tag_rows = self.to_host = 0
        self.decoding = False  # after the prefill: the counts are the decode steps'

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.decoding and func.__name__.startswith("_scaled_dot_product"):  # (query, key, value, ...)
            self.kv_read += args[1].nbytes + args[2].nbytes
        elif self.decoding and func is torch.ops.aten.lift_fresh.default and args[0].dim() > 0:
            caller = sys._getframe(2)  # (the tag rows' index is made in nanopar/tag_rows.py, every forward)
            while caller is not None and not caller.f_code.co_filename.endswith("tag_rows.py"):
                caller = caller.f_back
            self.to_device += caller is None
            self.tag_rows += caller is not None
        elif self.decoding and func is torch.ops.aten._local_scalar_dense.default:
            self.to_host += 1
        return func(*args, **(kwargs or {}))

    def counting(self, model):
        """Patches and hooks that feed the counts (the decode steps start at the first draw); undo with
        the returned function."""
        update, rebuild, tolist, draw = kvcache._Layer.update, LazyLaneCache._rebuild_layers, torch.Tensor.tolist, sampler_module.draw
        traffic = self

        def counted_update(layer, key_states, value_states, *args, **kwargs):
            buffer = layer.key_buffer
            keys, values = update(layer, key_states, value_states, *args, **kwargs)
            if layer.key_buffer is not buffer:  # a new buffer: the filled columns copied, the step's own excepted
                traffic.kv_copied += (keys.nbytes + values.nbytes) * (keys.shape[-2] - key_states.shape[-2]) // keys.shape[-2]
            return keys, values

        def counted_rebuild(cache, keep, extra, width):
            traffic.rebuilds += traffic.decoding
            return rebuild(cache, keep, extra, width)

        def counted_tolist(tensor):
            traffic.to_host += traffic.decoding
            return tolist(tensor)

        def counted_draw(*args, **kwargs):
            traffic.decoding = True
            return draw(*args, **kwargs)

        def step(module, args, kwargs):
            traffic.steps += traffic.decoding

        kvcache._Layer.update, LazyLaneCache._rebuild_layers, torch.Tensor.tolist = counted_update, counted_rebuild, counted_tolist
        sampler_module.draw = counted_draw
        hook = model.register_forward_pre_hook(step, with_kwargs=True)

        def undo():
            kvcache._Layer.update, LazyLaneCache._rebuild_layers, torch.Tensor.tolist = update, rebuild, tolist
            sampler_module.draw = draw
            hook.remove()
        return undo

    def per_step(self) -> dict:
        n = max(self.steps, 1)
        return {"KV read MB": self.kv_read / n / MB, "KV copied MB": self.kv_copied / n / MB,
                "rebuilds": self.rebuilds / n, "copies to the device": self.to_device / n,
                "(tag rows' copies)": self.tag_rows / n, "reads back": self.to_host / n}


def traffic_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens: GSM8K chat turns one after another, each prompt's last turn
    its own question."""
    turns = gsm8k_prompts(tokenizer, count + 16)
    prompts = []
    for i in range(count):
        ids = [t for turn in turns[i : i + 17] for t in turn]
        if len(ids) < length:
            raise SystemExit(f"bench/sampler.py: 17 GSM8K turns hold {len(ids)} tokens, fewer than --context asks")
        prompts.append(ids[-length:])
    return prompts


def traffic_rows(table, config: BenchConfig):
    """Benchmark 8: today's decode step against the one that replaced it, on the real model.
    -> the per-step table"""
    import contextlib

    from nanopar.prompts import stop_ids

    global LOAD
    from nanopar.tags import TagIds

    console = Console()
    model, tokenizer, dtype = load_bench_model(config, console)
    samples = 32
    if config.lanes % samples or config.traffic_tokens >= config.context:
        raise SystemExit(f"bench/sampler.py: --lanes must be a multiple of {samples} and --traffic-tokens below --context")
    prompts_ids = traffic_prompts(tokenizer, config.lanes // samples, config.context - config.traffic_tokens)
    policy = Policy.for_tokenizer(tokenizer, "structured", 1.0, 0)
    tags = TagIds.from_tokenizer(tokenizer)
    if config.tag_bias:
        bias_logits(model, {tags.block_open: config.tag_bias, tags.path_close: config.tag_bias})
    settings = SamplerSettings(paths=3, max_new_tokens=config.traffic_tokens, max_path_tokens=max(4, config.traffic_tokens // 4),
                               max_blocks=1, seed=0)
    eos = stop_ids(model, tokenizer)
    prefill_end = []  # CLOCK() at the end of the last prefill: a call's decode time is its end minus this
    model.register_forward_hook(lambda m, a, k, out: prefill_end.append(CLOCK())
                                if k["input_ids"].shape[1] > 1 else None, with_kwargs=True)
    counts = {}  # side -> Traffic of its first call (the race's warm-up: counting slows it)
    decode = {"new": math.inf, "today": math.inf}  # side -> its fastest decode (seconds, prefill excluded)

    def call(side):
        decoder, cache = (sampler_module._Decoder, LazyLaneCache) if side == "new" else (TodaysDecoder, TodaysLaneCache)
        kept, sampler_module._Decoder = sampler_module._Decoder, decoder
        traffic = Traffic() if side not in counts else None
        undo = traffic.counting(model) if traffic else None
        try:
            with traffic or contextlib.nullcontext():
                rollouts = sample(model, prompts_ids, policy, settings, eos, samples, lane_cache=cache)
        finally:
            sampler_module._Decoder = kept
            if undo:
                undo()
        if traffic:
            counts[side] = traffic
        else:
            decode[side] = min(decode[side], CLOCK() - prefill_end[-1])
        return rollouts

    before = os.getloadavg()[0]
    if config.census:
        rollouts = call("new")
        LOAD = f"{before:.1f} -> {os.getloadavg()[0]:.1f}"
    else:
        (new_time, rollouts), (old_time, old) = race(lambda: call("new"), lambda: call("today"))
        assert [(r.ids, r.logprobs) for r in rollouts] == [(r.ids, r.logprobs) for r in old]  # the same samples
    tokens, forks = sum(r.stats.new_tokens for r in rollouts), sum(r.stats.forks for r in rollouts)
    eos_ended = sum(r.finish == "eos" for r in rollouts)
    setting = (f"{config.model}, {dtype}, {config.lanes} lanes, {config.context}-token context, {tokens:,} tokens, "
               f"{forks} forks, {eos_ended} EOS")
    steps = counts["new"].steps
    if not config.census:
        add_row(table, "traffic: whole call (s)", setting, f"{new_time:.2f}", f"{old_time:.2f} today",
                f"{old_time / new_time:.2f}", ">= 1.0", f"{rollouts[0].stats.peak_cache_bytes / MB:.0f}")
        add_row(table, "traffic: decode step (ms)", f"{steps} decode steps, prefill excluded",
                f"{decode['new'] / steps * 1e3:.1f}", f"{decode['today'] / steps * 1e3:.1f} today",
                f"{decode['today'] / decode['new']:.2f}", ">= 1.0", "")
    else:
        add_row(table, "traffic census", setting, f"{steps} decode steps", "", "", "",
                f"{rollouts[0].stats.peak_cache_bytes / MB:.0f}")
    per_step = Table(title=f"benchmark 8, per decode step (what a GPU pays for; {model.config.num_attention_heads} query "
                           f"heads, {model.config.num_key_value_heads} KV heads)")
    per_step.add_column("side")
    columns = list(counts["new"].per_step())
    for column in ["decode steps", *columns]:
        per_step.add_column(column)
    for side, traffic in counts.items():
        values = traffic.per_step()
        per_step.add_row(side, str(traffic.steps), *(f"{values[c]:.2f}" for c in columns))
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    per_step.caption = (f"KV read: the key and value tensors each attention kernel is handed; with K and V repeated to "
                        f"every query head it would be {group}x, plus the repeat's own copy")
    return per_step


def main(argv: list[str] | None = None):
    global QUICK, REPEATS, NEW_TOKENS, CLOCK
    config = parse_config(BenchConfig, argv, description=__doc__.split("\n")[0])
    chosen = [name.strip() for name in config.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"bench/sampler.py: unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if config.clock not in ("wall", "cpu"):
        raise SystemExit(f"bench/sampler.py: --clock is wall or cpu, got {config.clock!r}")
    QUICK = config.quick
    CLOCK = time.process_time if config.clock == "cpu" else time.perf_counter
    REPEATS = config.repeats or (1 if QUICK else 5)
    NEW_TOKENS = 32 if QUICK else 128
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(0)
    load = os.getloadavg()
    table = Table(title=f"nanopar sampler benchmark ({torch.get_num_threads()} threads, {'quick' if QUICK else 'full'}, "
                        f"best of {REPEATS}, {config.clock} time)")
    for column in ("benchmark", "setting", "nanopar", "baseline", "ratio", "target", "cache MB (nanopar / baseline)",
                   "load (1 min)"):
        table.add_column(column)
    started = time.perf_counter()
    with torch.no_grad():
        if "throughput" in chosen:
            throughput_rows(table, [int(b) for b in config.batches.split(",")])
        if "acceleration" in chosen:
            acceleration_rows(table)
        if "npr" in chosen:
            npr_rows(table)
        if "fork" in chosen:
            fork_rows(table)
        if "toy" in chosen:
            toy_rows(table, config.toy_model)
        if "steps" in chosen:
            step_rows(table)
        if "rebuild" in chosen:
            rebuild_rows(table)
        per_step = traffic_rows(table, config) if "traffic" in chosen else None
    table.caption = (f"load average (1, 5, 15 min) before {', '.join(f'{x:.2f}' for x in load)}, after "
                     f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {time.perf_counter() - started:.0f} s")
    Console(width=200).print(table)
    if per_step is not None:
        Console(width=200).print(per_step)


if __name__ == "__main__":
    main()
