"""LoRA computed in its base layer's dtype: peft's LoRA linear without the float32 detour.

peft keeps LoRA's A [r, in] and B [out, r] in float32 beside a bfloat16 (or float16) base
(`autocast_adapter_dtype`), and its forward casts each layer's input up to meet them:

    y = base(x)                              [..., out] bfloat16
    y = y + B(A(x.float())) * s              x cast up, a float32 [..., out] product, scaled, added
    y = y.to(bfloat16)                       and cast back

so every adapted projection writes its input cast up and three float32 tensors of its output's
size (on Qwen's MLP out = 4,864: most of a LoRA model's prefill, docs/qwen.md "Speed"). `BaseDtypeLora` casts the
adapter's weights down instead (an [r, in] and an [out, r] copy, nothing per row) and adds the
update to the base's output in one fused multiply-add:

    y = base(x); y += A(x) (s B)^T           in place, everything in the base's dtype

The parameters stay float32: the optimiser updates float32 master weights (a bfloat16 B, which
starts at zero, would round away the small updates of a low learning rate), and their gradients
come back through the casts in float32. What changes is the precision of the update's products,
the base's own: bfloat16 against peft's float32 (tests/test_lora_dtype.py measures the gap). A
float32 input (a float32 model, bitsandbytes' 4-bit layers computing in float32 on a CPU) has no
detour to skip: peft's forward runs, bit for bit as before.

While the adapter cannot change, inside `casts_kept(model)` (a sampler call, under no gradient),
each layer casts it once and keeps the casts: a decode step calls every adapted projection once
per token, and its two casts and the scaling are a visible share of a step (bench/races.py, lora_casts). Outside,
and whenever a gradient is recorded, the casts are made at each call, as above.

Not here (peft's own forward runs them): float32, merged or disabled adapters, mixed adapter batches
(`adapter_names=`), LoRA variants (DoRA, ...), LoRA with a bias; LoRA on layers other than a
linear or a bitsandbytes 4-bit linear is refused (nanopar adapts the projections only).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit  # bitsandbytes is a dependency
from peft.tuners.lora.layer import VARIANT_KWARG_KEYS, LoraLayer
from peft.tuners.lora.layer import Linear as LoraLinear

from . import NanoparError


class BaseDtypeLora:
    """The forward of a peft LoRA linear, in the base's dtype (module docstring). Mixed into a
    subclass of each peft layer class it serves; `use_base_dtype_lora` swaps the classes."""

    copy_base_output = False  # bitsandbytes' 4-bit layer: its output may not be written in place
    kept_casts: dict | None = None  # inside `casts_kept`: {adapter name: (A, s B) in the base's dtype}

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        # peft's own forward where there is no detour to skip (float32 meets float32 adapters) and
        # for what this one leaves out (module docstring)
        if x.dtype == torch.float32 or self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None \
                or any(name in self.lora_variant or self.lora_bias.get(name, False) for name in self.active_adapters):
            return super().forward(x, *args, **kwargs)
        for key in ("adapter_names", *VARIANT_KWARG_KEYS):  # peft's own arguments, not the base layer's
            kwargs.pop(key, None)
        rows = x.reshape(-1, x.shape[-1])  # [n, in]: the base's output is made 2-D, not viewed as 2-D
        flat = self.base_layer(rows, *args, **kwargs)  # [n, out] in the base's dtype
        if self.copy_base_output:  # a view made inside bitsandbytes' autograd Function: autograd forbids
            flat = flat.clone()  # writing it in place (peft's 4-bit forward copies it too)
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            A, B = self.adapter_in(name, flat.dtype)  # [r, in], [out, r] scaled
            down = F.linear(self.lora_dropout[name](rows.to(flat.dtype)), A)  # [n, r]
            # in place: the base's output is fresh and its backward does not keep it (addmm's copy
            # of an [n, out] input would cost as much as the update itself); on a view of a
            # [..., out] output autograd would copy the gradient twice in backward (CopySlices)
            flat.addmm_(down, B.t())  # [n, out] += down B^T
        return flat.view(*x.shape[:-1], flat.shape[-1])  # [..., out]

    def adapter_in(self, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [r, in], s B [out, r]) in `dtype`: cast now, or once per `casts_kept` scope where no
        gradient is recorded (a kept cast would hold no path back to the float32 parameters)."""
        keep = self.kept_casts is not None and not torch.is_grad_enabled()
        if keep and name in self.kept_casts and self.kept_casts[name][0].dtype == dtype:
            return self.kept_casts[name]
        casts = self.lora_A[name].weight.to(dtype), (self.lora_B[name].weight * self.scaling[name]).to(dtype)
        if keep:
            self.kept_casts[name] = casts
        return casts


@contextlib.contextmanager
def casts_kept(model):
    """Within: every base-dtype LoRA layer of `model` keeps its adapter's casts from its first call
    under no gradient to the end (the caller promises the adapter does not change meanwhile: a
    sampler call). Dropped on the way out, so a later call sees the adapter as it is then."""
    layers = [m for m in model.modules() if isinstance(m, BaseDtypeLora)]
    for layer in layers:
        layer.kept_casts = {}
    try:
        yield
    finally:
        for layer in layers:
            layer.kept_casts = None


class BaseDtypeLoraLinear(BaseDtypeLora, LoraLinear):
    pass


class BaseDtypeLoraLinear4bit(BaseDtypeLora, LoraLinear4bit):
    copy_base_output = True


CLASSES = {LoraLinear: BaseDtypeLoraLinear, LoraLinear4bit: BaseDtypeLoraLinear4bit}  # peft's class -> ours


def use_base_dtype_lora(model) -> int:
    """Give every peft LoRA linear in `model` the base-dtype forward; returns how many. A LoRA layer
    of another kind (an embedding's, a convolution's: nanopar adapts linears only) is refused."""
    others = sorted({type(m).__name__ for m in model.modules()
                     if isinstance(m, LoraLayer) and type(m) not in CLASSES and type(m) not in CLASSES.values()})
    if others:
        raise NanoparError(f"LoRA on {', '.join(others)}: nanopar's base-dtype forward serves linear layers only")
    layers = [m for m in model.modules() if type(m) in CLASSES]
    for layer in layers:
        layer.__class__ = CLASSES[type(layer)]
    return len(layers)
