"""The tag rows read row by row (nanopar/tag_rows.py) against peft's own forward, which writes them
into a new [V, d] matrix: the same values and gradients, tied or not, scaled or not, and no whole
matrix built by a training step or a sampler call."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from conftest import PAD, perturb_trainable
from nanopar.forward import make_batch, trace_logprobs
from nanopar.model import ModelSettings, apply_lora, load_model, save_checkpoint_model
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tag_rows import RowwiseTagRows
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model, word_tokenizer

V = 64
TAGS = TagIds(*range(V - 6, V))  # the last six rows
SHAPES = ("qwen tied", "qwen untied", "gemma scaled")


def base_model(shape: str):
    if shape == "gemma scaled":  # Gemma3TextScaledWordEmbedding: rows x sqrt(d) = 8
        config = Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=8,
                                  tie_word_embeddings=True)
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return tiny_qwen_model(vocab_size=V, tie_word_embeddings=shape == "qwen tied")


def lora_model(shape: str):
    """apply_lora on a tiny model, every trainable parameter moved (the tag rows away from the base's)."""
    model = apply_lora(base_model(shape), ModelSettings(shape, lora=True), TAGS)
    perturb_trainable(model, scale=0.5)
    return model


def tag_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, TrainableTokensLayer)]


def read(model, ids: torch.Tensor) -> tuple:
    """(embedding output [1, T, d], logits [1, T, V], the gradient of each trainable parameter) of
    one training forward + backward of a fixed function of the logits."""
    model.train().zero_grad(set_to_none=True)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(out.detach()))
    logits = model(ids).logits
    hook.remove()
    (logits.log_softmax(-1)[..., :V - 10].sum() + logits[..., -6:].square().sum()).backward()
    return seen[0], logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


IDS = torch.tensor([[3, TAGS.block_open, 9, TAGS.path_open, 12, 13, TAGS.path_close, TAGS.path_open, 20,
                     TAGS.path_close, TAGS.block_close, TAGS.summary_open, 30, TAGS.summary_close, 31]])  # [1, 15]


@pytest.mark.parametrize("shape", SHAPES)
def test_rowwise_tag_rows_give_peft_forwards_values_and_gradients(shape):
    model = lora_model(shape)
    layers = tag_layers(model)
    assert len(layers) == 2 and all(type(layer) is RowwiseTagRows for layer in layers)  # embedding and head
    embedded, logits, grads = read(model, IDS)
    for layer in layers:
        layer.__class__ = TrainableTokensLayer  # peft's forward, as it ships
    peft_embedded, peft_logits, peft_grads = read(model, IDS)

    assert torch.equal(embedded, peft_embedded)
    torch.testing.assert_close(logits, peft_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == peft_grads.keys()
    for name in grads:  # the same up to float rounding (the head's tag columns come from a smaller matmul)
        assert (grads[name] - peft_grads[name]).norm() <= 1e-5 * peft_grads[name].norm(), name
    rows = [g for n, g in grads.items() if "trainable_tokens_delta" in n]
    assert len(rows) == (1 if shape != "qwen untied" else 2) and all((g.abs().sum(-1) > 0).all() for g in rows)

    # by hand: the base's rows, each tag position its trained row, both x the embedding's scale
    embedding = layers[0].base_layer
    scale = getattr(embedding, "embed_scale", torch.tensor(1.0))
    delta = layers[0].trainable_tokens_delta["default"].detach()  # [6, d]
    expected = embedding.weight[IDS] * scale.to(embedding.weight.dtype)  # [1, T, d]
    for slot, tag in enumerate(TAGS.all()):
        expected[IDS == tag] = delta[slot] * scale.to(delta.dtype)
    assert torch.equal(embedded, expected)
    assert not torch.equal(expected, embedding.weight[IDS] * scale)  # the rows differ from the base's


@pytest.mark.parametrize("shape", SHAPES)
def test_with_the_adapter_disabled_the_model_is_its_base(shape):
    model = lora_model(shape)
    with torch.no_grad():
        base_logits = base_model(shape)(IDS).logits
        with model.disable_adapter():
            disabled = model(IDS).logits
        trained = model(IDS).logits
    assert torch.equal(disabled, base_logits)
    assert (trained - base_logits).abs().max() > 0.1


def test_a_training_step_and_a_sampler_call_never_build_a_whole_matrix(monkeypatch):
    """peft's forward, its merge and a wrapper's `.weight` all build the [V, d] matrix with the rows
    in (`get_merged_weights` or `merge`): refused here, so every read must go row by row."""
    model = lora_model("qwen untied")

    def refuse(*args, **kwargs):
        raise AssertionError("a whole [V, d] matrix was built")

    monkeypatch.setattr(TrainableTokensLayer, "get_merged_weights", refuse)
    monkeypatch.setattr(TrainableTokensLayer, "merge", refuse)
    policy = Policy(TAGS, "structured", 1.0, V)
    prompts, responses = [[3, 4, 5], [6, 7]], IDS[0, 1:].tolist()
    batch = make_batch(prompts, [responses, responses[:9]], [[1.0] * len(responses), [1.0] * 9], pad_id=PAD)
    for head_read in ("chunked", "plain"):
        model.zero_grad(set_to_none=True)
        logprobs, _ = trace_logprobs(model, batch, policy, with_entropy=True, head_read=head_read)
        (logprobs * batch.target_mask).sum().backward()
        rows = [p.grad for n, p in model.named_parameters() if "trainable_tokens_delta" in n]
        assert len(rows) == 2 and all(g.abs().sum() > 0 for g in rows), head_read
    made = []  # the tensors the tag rows' forwards built from their id lists (a copy to a GPU each)
    real_as_tensor = torch.as_tensor
    monkeypatch.setattr(torch, "as_tensor", lambda *a, **k: made.append(1) or real_as_tensor(*a, **k))
    rollouts = sample(model, prompts, policy, SamplerSettings(max_new_tokens=12, seed=0), eos_ids=[])
    assert [len(r.ids) for r in rollouts] == [12, 12]
    assert made == []  # the tag ids made once per device (above), not once a forward (13 here, x 2 layers)


def test_a_saved_adapter_loads_with_the_rowwise_forward(tmp_path):
    """A checkpoint's adapter, loaded by `load_model` through peft, reads its rows row by row too,
    with the logits of the model that saved it."""
    tokenizer = word_tokenizer()
    folder = tmp_path / "base"
    base_model("qwen untied").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model, tokenizer = load_model(ModelSettings(str(folder), lora=True))
    ids = torch.tensor([tokenizer.encode("a <Parallel><Path> b </Path><Path> a </Path></Parallel> b")])
    with torch.no_grad():
        for layer in tag_layers(model):
            layer.trainable_tokens_delta["default"].add_(1.0)
        logits = model(ids).logits
    save_checkpoint_model(model, tokenizer, str(tmp_path / "saved"))
    for trainable in (True, False):
        loaded, _ = load_model(ModelSettings(str(tmp_path / "saved"), lora=trainable))
        assert [type(layer) for layer in tag_layers(loaded)] == [RowwiseTagRows] * 2
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, logits, rtol=0, atol=1e-6)

