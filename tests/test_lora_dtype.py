"""LoRA in its base layer's dtype (nanopar/lora_dtype.py) against peft's own forward, and against an
independent float64 computation: peft's values and gradients bit for bit on a float32 base, no
float32 detour on a bfloat16 one, float32 parameters and gradients."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.lora.layer import Linear as LoraLinear

from conftest import OpOutputs, perturb_trainable
from nanopar.lora_dtype import CLASSES, BaseDtypeLoraLinear, casts_kept
from nanopar.model import ModelSettings, apply_lora
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model

V, D, MLP = 96, 64, 160  # vocabulary, width, MLP width: distinct, so shapes say which tensor is which
TAGS = TagIds(*range(V - 6, V))
IDS = torch.tensor([[3, 7, 11, 13, TAGS.block_open, 17, 19, 23, 29, 31, 37, 41]])  # [1, 12]


def lora_model(dtype: torch.dtype):
    """A tiny Qwen2 (q/k/v biases) with LoRA on every projection, its trainable parameters moved."""
    base = tiny_qwen_model(arch="qwen2", vocab_size=V, hidden_size=D, intermediate_size=MLP, dtype=dtype)
    model = apply_lora(base, ModelSettings("tiny", lora=True), TAGS)
    perturb_trainable(model, scale=0.05)  # an adapter well into training: B A x beside W x
    return model


def use_peft_forward(model) -> None:
    for layer in model.modules():
        if type(layer) in CLASSES.values():
            layer.__class__ = next(peft for peft, ours in CLASSES.items() if ours is type(layer))


def read(model, keep: torch.dtype = torch.float32) -> tuple[torch.Tensor, dict]:
    """(logits [1, T, V] in `keep`, gradient of every trainable parameter) of a forward + backward."""
    model.train().zero_grad(set_to_none=True)
    logits = model(IDS).logits.to(keep)
    logits.log_softmax(-1)[..., : V - 6].sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def activations(ops: OpOutputs, rows: int) -> list[tuple]:
    """The shapes of the float32 tensors shaped as an MLP projection's output over the sequence,
    [..., rows, MLP] (the model's own norms work in float32 at width D: not counted)."""
    return [s for _, dtype, s in ops.seen if dtype == torch.float32 and len(s) >= 2 and s[-1] == MLP and s[-2] == rows]


def test_every_lora_linear_gets_the_base_dtype_forward():
    model = lora_model(torch.float32)
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 2 * 7 and all(type(m) is BaseDtypeLoraLinear for m in layers)


def test_on_a_float32_base_peffs_forward_runs_bit_for_bit():
    model = lora_model(torch.float32)
    logits, grads = read(model)
    use_peft_forward(model)
    peft_logits, peft_grads = read(model)
    assert torch.equal(logits, peft_logits)
    assert grads.keys() == peft_grads.keys() and any("lora_A" in n for n in grads)
    assert all(torch.equal(grads[name], peft_grads[name]) for name in grads)
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "lora_" in n)


def test_on_a_bfloat16_base_no_float32_activation_is_written_and_the_values_hold():
    """peft's forward writes float32 [..., out] products beside a bfloat16 base; this one writes none.
    Both are measured against a float64 copy of the same model (base and adapter)."""
    model = lora_model(torch.bfloat16)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)  # master weights
    reference = lora_model(torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    reference.to(torch.float64)
    use_peft_forward(reference)
    exact, exact_grads = read(reference, keep=torch.float64)  # [1, T, V], {name: gradient} in float64

    with OpOutputs() as seen:
        logits, grads = read(model)
    assert activations(seen, IDS.numel()) == []  # no float32 [.., T, MLP] anywhere, forward or backward
    use_peft_forward(model)
    with OpOutputs() as seen_peft:
        peft_logits, _ = read(model)
    assert activations(seen_peft, IDS.numel())  # the test can fail

    ours, peft = (logits.double() - exact).abs().max(), (peft_logits.double() - exact).abs().max()
    # both carry the bfloat16 base's rounding; the update's own bfloat16 products add little to it
    # (measured: 0.0073 against peft's 0.0064, logits up to 2.1)
    assert ours <= 1.5 * peft and ours <= 0.01 * exact.abs().max(), (ours, peft)
    for name, g in grads.items():  # float32 gradients, in the direction of the float64 ones
        assert g.dtype == torch.float32, name
        cosine = torch.nn.functional.cosine_similarity(g.double().flatten(), exact_grads[name].flatten(), dim=0)
        # measured: >= 0.9999, as peft's float32 detour. With an update as large as the base's own
        # (noise x 0.3) the bfloat16 products cost more: 0.88 at worst against peft's 0.98
        assert cosine > 0.999, (name, cosine)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_disabled_adapter_is_the_base(dtype):
    model = lora_model(dtype)
    base = tiny_qwen_model(arch="qwen2", vocab_size=V, hidden_size=D, intermediate_size=MLP, dtype=dtype)
    with torch.no_grad():
        with model.disable_adapter():
            disabled = model(IDS).logits
        trained = model(IDS).logits
        plain = base(IDS).logits
    assert torch.equal(disabled, plain)
    assert (trained.float() - plain.float()).abs().max() > 0.05


def test_over_bitsandbytes_4bit_layers_computing_in_bfloat16_the_values_and_gradients_hold(tmp_path):
    """The 4-bit class (what a GPU user's --load-in-4bit gets, bfloat16 compute), here on the CPU:
    its output is copied before the update is added in place, the numbers are peft's to bfloat16's rounding."""
    from bitsandbytes.nn import Linear4bit
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from nanopar.lora_dtype import BaseDtypeLoraLinear4bit
    from nanopar.model import disable_bnb_cpu_repack

    tiny_qwen_model(arch="qwen2", vocab_size=V, hidden_size=D, intermediate_size=MLP).save_pretrained(tmp_path)
    quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quantized, dtype=torch.bfloat16,
                                                device_map="cpu")
    assert disable_bnb_cpu_repack(base) == 2 * 7
    model = apply_lora(base, ModelSettings("tiny", lora=True), TAGS)
    perturb_trainable(model)
    layers = [m for m in model.modules() if isinstance(m, LoraLinear) or type(m) is BaseDtypeLoraLinear4bit]
    assert len(layers) == 2 * 7 and all(type(m) is BaseDtypeLoraLinear4bit for m in layers)
    assert all(isinstance(m.base_layer, Linear4bit) for m in layers)
    logits, grads = read(model)
    use_peft_forward(model)
    peft_logits, peft_grads = read(model)
    assert (logits - peft_logits).abs().max() <= 0.02 * peft_logits.abs().max()
    for name, g in grads.items():
        cosine = torch.nn.functional.cosine_similarity(g.flatten(), peft_grads[name].flatten(), dim=0)
        assert g.dtype == torch.float32 and cosine > 0.999, (name, cosine)


def test_kept_casts_give_the_same_logits_and_are_dropped_at_the_scopes_end():
    """Inside `casts_kept` under no gradient each layer casts its adapter once: the same logits as
    casting at every call; a change to the adapter after the scope is seen by the next call; a
    forward that records a gradient inside the scope still reaches the float32 parameters."""
    model = lora_model(torch.bfloat16).eval()
    layer = next(m for m in model.modules() if isinstance(m, BaseDtypeLoraLinear))
    with torch.no_grad():
        fresh = model(IDS).logits
        with casts_kept(model):
            kept_first, kept_again = model(IDS).logits, model(IDS).logits
            assert set(layer.kept_casts) == {"default"}
        assert layer.kept_casts is None
    assert torch.equal(fresh, kept_first) and torch.equal(fresh, kept_again)
    with torch.no_grad():
        layer.lora_B["default"].weight.add_(0.5)  # an optimiser step between two sampler calls
        moved = model(IDS).logits
        with casts_kept(model):
            assert torch.equal(model(IDS).logits, moved) and not torch.equal(moved, fresh)
    with casts_kept(model):
        model(IDS).logits.float().sum().backward()
    assert layer.lora_B["default"].weight.grad is not None and layer.lora_B["default"].weight.grad.abs().sum() > 0
    assert layer.kept_casts is None
