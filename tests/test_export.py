"""export.py: a checkpoint merged into a plain transformers folder and written as GGUF, each
checked against an independent computation: the adapter's own formula, the PEFT model's logits,
nanopar's sampler on the checkpoint, transformers' GGUF reader, and llama.cpp where installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import export
from conftest import offline_qwen_tokenizer, perturb_trainable, small_qwen_folder, small_qwen_tokenizer
from nanopar import NanoparError
from nanopar.checkpoint import save_checkpoint, trained_with
from nanopar.export_check import agreement, llama_cpp_greedy, logit_gap, sampler_greedy, transformers_greedy
from nanopar.gguf_writer import write_gguf
from nanopar.merge import merged_model
from nanopar.model import ModelSettings, load_model
from nanopar.policy import Policy
from nanopar.prompts import stop_ids
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import PARALLEL_R1
from nanopar.tiny import tiny_qwen_model

RUN = {"schema": "parallel-r1", "mode": "causal", "instructions": "none", "easy_data": "toy:easy"}


def trained_checkpoint(folder: Path, base: str, seed: int = 0, **settings) -> Path:
    """A LoRA checkpoint of `base` whose adapter and tag rows moved away from the start (seeded
    noise on every trainable parameter), saved as a stage saves one."""
    torch.manual_seed(seed)
    model, tokenizer = load_model(ModelSettings(base, lora=True, lora_rank=4, lora_alpha=8, **settings))
    perturb_trainable(model, seed, scale=0.2)
    return save_checkpoint(folder, model, tokenizer, config=RUN | {"load_in_4bit": settings.get("load_in_4bit", False)})


def prompts_of(tokenizer, texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy's pretrained base with a moved adapter, exported to a folder."""
    where = tmp_path_factory.mktemp("toy")
    checkpoint = trained_checkpoint(where / "final", "toy:model")
    export.main(["--checkpoint", str(checkpoint), "--out", str(where / "exported")])
    return checkpoint, where / "exported"


def test_the_merged_weights_are_the_adapters_formula(toy):
    """W' = W + (alpha / r) B A for a projection, and the tag rows are the adapter's stored rows,
    read from the files, not through peft."""
    checkpoint, exported = toy
    adapter = load_file(checkpoint / "adapter_model.safetensors")
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    merged = load_file(exported / "model.safetensors")
    base, _ = load_model(ModelSettings("toy:model"))
    name = "model.layers.1.self_attn.v_proj"
    A = adapter[f"base_model.model.{name}.lora_A.weight"]  # [r, d_in]
    B = adapter[f"base_model.model.{name}.lora_B.weight"]  # [d_out, r]
    W = base.get_submodule(name).weight.detach()
    expected = W + config["lora_alpha"] / config["r"] * B @ A
    assert B.abs().max() > 0 and (expected - W).abs().max() > 1e-3  # the adapter moved the weight
    torch.testing.assert_close(merged[f"{name}.weight"], expected, rtol=0, atol=1e-6)
    rows = next(v for k, v in adapter.items() if "trainable_tokens_delta" in k)  # [n_tags, d]
    ids = config["trainable_token_indices"]
    ids = ids if isinstance(ids, list) else next(iter(ids.values()))
    torch.testing.assert_close(merged["model.embed_tokens.weight"][ids], rows, rtol=0, atol=0)


def test_the_folder_loads_without_nanopar_and_decodes_as_the_sampler(toy, tmp_path):
    """Plain transformers in a process where `import nanopar` fails: the tags are special tokens,
    the greedy tokens are the sampler's (causal mode) on the checkpoint, tags included."""
    checkpoint, exported = toy
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompts = prompts_of(tokenizer, ["3 + 4 = ? in parallel", "12 - 5 = ?", "2 * 9 + 1 = ?"])
    script = f"""
import sys, json, torch
sys.modules["nanopar"] = None  # any import of nanopar fails here
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({str(exported)!r})
model = AutoModelForCausalLM.from_pretrained({str(exported)!r}, dtype=torch.float32).eval()
out = []
for prompt in {prompts!r}:
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)[0, len(prompt):].tolist()
    out.append(ids)
special = {{t.content: t.special for t in tokenizer.added_tokens_decoder.values()}}
print(json.dumps({{"tokens": out, "special": special, "template": tokenizer.chat_template}}))
"""
    plain = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      cwd=tmp_path).stdout.splitlines()[-1])
    assert all(plain["special"][tag] for tag in PARALLEL_R1.all())
    assert plain["template"] == tokenizer.chat_template
    reference = sampler_greedy(str(checkpoint), prompts, 60)
    for mine, theirs in zip(reference, plain["tokens"]):
        assert len(mine) >= 10 and theirs[:len(mine)] == mine
    parallel = tokenizer.convert_tokens_to_ids("<Parallel>")
    assert any(parallel in tokens for tokens in reference)  # the blocks are written as text, as trained


def test_nanopar_runs_the_folder_as_it_ran_the_checkpoint(toy):
    """The folder keeps the run's config: nanopar's structured sampler (it forks at <Parallel>)
    writes on it the very tokens it writes on the checkpoint."""
    checkpoint, exported = toy
    settings = SamplerSettings(max_new_tokens=60, seed=0)
    tokens = []
    for model_name in (checkpoint, exported):
        assert trained_with(str(model_name))["schema"] == "parallel-r1"
        model, tokenizer = load_model(ModelSettings(str(model_name)))
        policy = Policy.for_tokenizer(tokenizer, "structured", 0.0)
        prompts = prompts_of(tokenizer, ["3 + 4 = ? in parallel", "12 - 5 = ?"])
        tokens.append([r.ids for r in sample(model, prompts, policy, settings, stop_ids(model, tokenizer))])
    assert tokens[0] == tokens[1] and any(tokenizer.convert_tokens_to_ids("<Parallel>") in t for t in tokens[0])


def test_a_full_model_exports_as_it_is_with_its_own_tags(tmp_path):
    """The toy's shipped NPR base (a full model and its run's config, a pretrain stage's final/):
    the folder's logits are the checkpoint's, bit for bit, over its real vocabulary; NPR's tags
    are its special tokens and the run's config rides along."""
    from nanopar.tags import NPR

    shipped = Path(__file__).resolve().parent.parent / "nanopar" / "toy" / "bases" / "npr"
    export.main(["--checkpoint", str(shipped), "--out", str(tmp_path / "npr")])
    model, tokenizer = load_model(ModelSettings(str(shipped)), NPR)
    folder = AutoModelForCausalLM.from_pretrained(tmp_path / "npr", dtype=torch.float32).eval()
    assert folder.config.vocab_size == len(tokenizer) < model.config.vocab_size  # the padding rows cut
    prompt = prompts_of(tokenizer, ["5 5 4 to 100 <guideline><plan>1: try"])[0]
    assert logit_gap(model, folder, prompt) == 0.0
    special = {t.content for t in AutoTokenizer.from_pretrained(tmp_path / "npr").added_tokens_decoder.values() if t.special}
    assert set(NPR.all()) <= special and trained_with(str(tmp_path / "npr"))["schema"] == "npr"


def test_a_4bit_run_exports_the_weights_it_trained_against(tmp_path):
    """A checkpoint trained over an NF4 base: the merged folder's logits are the 4-bit PEFT model's
    (de-quantised first), further from a merge into the original float32 base than that."""
    base = tmp_path / "base"
    from nanopar.tiny import char_tokenizer

    tiny_qwen_model(arch="qwen2", vocab_size=128, hidden_size=64).save_pretrained(base)
    char_tokenizer().save_pretrained(base)
    checkpoint = trained_checkpoint(tmp_path / "final", str(base), load_in_4bit=True)
    merged, tokenizer = merged_model(checkpoint)
    four_bit, _ = load_model(ModelSettings(str(checkpoint), load_in_4bit=True))
    plain, _ = load_model(ModelSettings(str(checkpoint)))  # the adapter over the original weights
    prompt = tokenizer.encode("what is 12 + 30? <Parallel> think", add_special_tokens=False)
    assert logit_gap(four_bit, merged, prompt) < 1e-5
    assert logit_gap(plain, merged, prompt) > 100 * logit_gap(four_bit, merged, prompt)


def test_bad_input_is_one_line_and_writes_nothing(toy, tmp_path, monkeypatch, capsys):
    checkpoint, exported = toy
    cases = {
        "not a nanopar checkpoint": ["--checkpoint", str(tmp_path), "--out", str(tmp_path / "x")],
        "exists: give --replace": ["--checkpoint", str(checkpoint), "--out", str(exported)],
        "unknown --gguf kind 'q4'": ["--checkpoint", str(checkpoint), "--out", str(tmp_path / "x"), "--gguf", "q4"],
        "give --checkpoint": ["--out", str(tmp_path / "x")],
    }
    for message, argv in cases.items():
        with pytest.raises(NanoparError, match=message):
            export.main(argv)
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("adapter_config.json", "run_config.json"):
        config = json.loads((checkpoint / name).read_text())
        if name == "adapter_config.json":
            config["base_model_name_or_path"] = "./no/such/base"
        (moved / name).write_text(json.dumps(config))
    with pytest.raises(NanoparError, match="trained over './no/such/base', which cannot be found"):
        export.main(["--checkpoint", str(moved), "--out", str(tmp_path / "x")])
    monkeypatch.setattr(export.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    with pytest.raises(NanoparError, match="not enough disk for the export"):
        export.main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "x")])
    with pytest.raises(NanoparError, match="needs a byte-level BPE tokenizer"):  # the toy's word-level vocabulary
        write_gguf(exported, tmp_path / "toy.gguf", "f16", PARALLEL_R1.all())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moved"]  # nothing half-written was left


def test_a_failed_write_leaves_the_old_export_whole(toy, tmp_path, monkeypatch):
    """--replace over a good export, killed mid-write (an error in the GGUF writer): the old
    folder is untouched and no temporary folder is left."""
    checkpoint, _ = toy
    out = tmp_path / "out"
    export.main(["--checkpoint", str(checkpoint), "--out", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "write_gguf", killed)
    with pytest.raises(KeyboardInterrupt):
        export.main(["--checkpoint", str(checkpoint), "--out", str(out), "--replace", "--gguf", "f16"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


# ---------------------------------------------------------------- GGUF: a tiny Qwen2 with the real Qwen tokenizer


def test_the_small_qwen_tokenizer_reads_as_qwens(tmp_path):
    """The cut tokenizer splits text as the full one wherever the full one's pieces are in it."""
    full, small = offline_qwen_tokenizer(), small_qwen_tokenizer(tmp_path / "small")
    text = "In all, 12 + 30 is 42.\nThe one, and the other: as many as he had"
    pieces = full.encode(text)
    assert max(pieces) < 4096 and small.encode(text) == pieces
    chat = [{"role": "user", "content": "2 + 2?"}]
    assert small.decode(small.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)) == \
        full.decode(full.apply_chat_template(chat, add_generation_prompt=True, return_dict=False))


@pytest.fixture(scope="module")
def qwen_vocab_export(tmp_path_factory):
    """A tiny Qwen2 (d = 64, untied head) under Qwen's tokenizer (its first 4,096 ids), a moved
    adapter, exported with a float32 GGUF and a q8_0 one."""
    where = tmp_path_factory.mktemp("qwen_vocab")
    base = small_qwen_folder(where, seed=3, tie_word_embeddings=False)
    checkpoint = trained_checkpoint(where / "final", str(base), seed=1)
    export.main(["--checkpoint", str(checkpoint), "--out", str(where / "out"), "--gguf", "f32"])
    for kind in ("f16", "bf16", "q8_0"):
        write_gguf(where / "out", where / "out" / f"model.{kind}.gguf", kind, PARALLEL_R1.all())
    return checkpoint, where / "out", AutoTokenizer.from_pretrained(where / "out")  # the tags in it


@pytest.mark.slow
def test_the_gguf_reads_back_with_the_folders_logits_and_vocabulary(qwen_vocab_export):
    """transformers' GGUF reader gives back the folder's logits: exactly from f32, and from f16,
    bf16 and q8_0 those of the folder with every matrix rounded to that kind (q8_0: blocks of 32
    values, one scale, rounded here by gguf's own quantize and dequantize), so no weight went to
    the wrong place; and a tokenizer that writes the tags as single tokens."""
    import gguf

    _, out, _ = qwen_vocab_export
    folder = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    q8 = gguf.GGMLQuantizationType.Q8_0
    rounding = {"f32": lambda w: w, "f16": lambda w: w.half().float(), "bf16": lambda w: w.bfloat16().float(),
                "q8_0": lambda w: torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), q8), q8))}
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.encode("Natalia sold 48 clips. <Parallel><Path> half is 24</Path>", add_special_tokens=False)
    for kind, rounded in rounding.items():
        expected = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            for weight in expected.parameters():
                if weight.dim() == 2:  # matrices in the kind, vectors in float32
                    weight.copy_(rounded(weight))
        read = AutoModelForCausalLM.from_pretrained(out, gguf_file=f"model.{kind}.gguf", dtype=torch.float32).eval()
        assert logit_gap(expected, read, prompt) < 1e-6, kind
        assert (logit_gap(folder, read, prompt) > 1e-6) == (kind != "f32"), kind  # the rounding shows
    read_tokenizer = AutoTokenizer.from_pretrained(out, gguf_file="model.f32.gguf")
    assert read_tokenizer.encode("x <Parallel> y", add_special_tokens=False) == tokenizer.encode("x <Parallel> y", add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None,
                    reason="llama.cpp's check needs the optional extra: pip install xllamacpp==2026.10.11549")
def test_llama_cpp_runs_the_gguf_as_the_sampler(qwen_vocab_export):
    """llama.cpp's greedy tokens on the float32 GGUF are nanopar's sampler's on the checkpoint, up
    to the first step where the sampler's top two logits are within llama.cpp's rounding (1e-3)."""
    checkpoint, out, tokenizer = qwen_vocab_export
    texts = ["What is 7 * 6?", "Tom has 3 apples <Parallel>", "Solve 2x + 3 = 11."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                             return_dict=False) for t in texts]
    reference = sampler_greedy(str(checkpoint), prompts, 24)
    llama = llama_cpp_greedy(str(out / "model.f32.gguf"), prompts, 24)
    folder = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for prompt, mine, theirs in zip(prompts, reference, llama):
        with torch.no_grad():
            logits = folder(torch.tensor([prompt + mine])).logits[0, len(prompt) - 1:]  # [len(mine) + 1, V]
        top2 = logits.topk(2).values
        close = (top2[:, 0] - top2[:, 1] < 1e-3).nonzero()
        exact = int(close[0]) if len(close) else len(mine)
        assert agreement(mine, theirs) >= min(exact, len(mine)) and exact >= 8, (mine, theirs, exact)


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None,
                    reason="llama.cpp's check needs the optional extra: pip install xllamacpp==2026.10.11549")
def test_llama_cpp_reads_and_prints_the_tags_as_text(qwen_vocab_export):
    """The tags are user-defined tokens: llama.cpp reads "<Parallel>" in a text prompt as the one
    token transformers reads, and prints it when it writes it (a control token would print "")."""
    import xllamacpp

    _, out, tokenizer = qwen_vocab_export
    params = xllamacpp.CommonParams()
    params.model.path = str(out / "model.f32.gguf")
    params.n_ctx = 64
    server = xllamacpp.Server(params)
    prompt = "12 + 30 <Parallel><Path> 42"
    parallel = tokenizer.convert_tokens_to_ids("<Parallel>")
    reply = server.handle_completions({"prompt": prompt, "max_tokens": 2, "temperature": 0.0, "logprobs": 1,
                                       "logit_bias": [[parallel, 100.0]], "cache_prompt": False})
    assert reply["usage"]["prompt_tokens"] == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert [step["id"] for step in reply["choices"][0]["logprobs"]["content"]] == [parallel, parallel]
    assert reply["choices"][0]["text"] == "<Parallel><Parallel>"


def test_the_merged_model_is_freed_before_the_gguf_is_written(qwen_vocab_export, tmp_path, monkeypatch):
    """With the collector off, the merged model is gone (its last reference dropped, no cycle
    holding it) when the GGUF writer starts: the writer's copies of the weights never sit beside
    a whole model in memory."""
    import gc
    import weakref

    checkpoint, _, _ = qwen_vocab_export
    merged, written = [], []

    def tracked_merge(*args, **kwargs):
        model, tokenizer = merged_model(*args, **kwargs)
        merged.append(weakref.ref(model))
        return model, tokenizer

    def writer_after_the_model(*args, **kwargs):
        written.append(merged[0]() is None)
        return write_gguf(*args, **kwargs)

    monkeypatch.setattr(export, "merged_model", tracked_merge)
    monkeypatch.setattr(export, "write_gguf", writer_after_the_model)
    gc.disable()
    try:
        export.main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"), "--gguf", "f16"])
    finally:
        gc.enable()
    assert written == [True] and (tmp_path / "out" / "model.f16.gguf").is_file()


def test_the_gguf_check_compares_tokens_through_transformers(qwen_vocab_export):
    """The folder and its f32 GGUF under plain transformers decode the sampler's tokens."""
    checkpoint, out, tokenizer = qwen_vocab_export
    prompts = prompts_of(tokenizer, ["Natalia sold 48 clips", "<Parallel><Path>"])
    reference = sampler_greedy(str(checkpoint), prompts, 16)
    for gguf_file in (None, "model.f32.gguf"):
        for mine, theirs in zip(reference, transformers_greedy(str(out), prompts, 16, gguf_file=gguf_file)):
            assert theirs[:len(mine)] == mine
