"""The trainable tag rows read row by row: peft's trainable tokens without a [V, d] copy per forward.

`model.apply_lora` trains the tag rows through peft's `trainable_token_indices`: a
TrainableTokensLayer around the input embedding (and around the LM head, tied or not) keeps the
current tag rows as an [n_tags, d] parameter. peft's forward is the plain version of the idea:

    W' = W with the tag rows replaced by the parameter   (index_copy: a new [V, d] matrix)
    embedding: F.embedding(ids, W') x embed_scale         head: h @ W'^T

so every training forward writes a whole new matrix (Qwen's 151,936 x 896: 0.54 GB in float32),
once for the embedding and once for the head, and its backward builds a dense [V, d] gradient of
which n_tags rows are kept. `RowwiseTagRows` computes the same values from the rows it changes:

    embedding: base(ids) [..., d], then the positions holding a tag take that tag's row x embed_scale
    head:      base(h) [..., V], then the tag columns are h @ rows^T [..., n_tags]

The embedding is equal bit for bit; the head's tag columns are the same dot products, summed by
a smaller matmul (equal to float rounding). Gradients reach only the [n_tags, d] parameter.
`use_rowwise_tag_rows` swaps the class of peft's layers in place: same attributes, parameters,
state dict and adapter file; peft's merge, unmerge and disabled adapter run as before.

Not here: several adapters with overlapping tag ids (peft refuses them; so does this forward),
DeepSpeed ZeRO-3, layers other than an embedding or a linear head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer


class RowwiseTagRows(TrainableTokensLayer):
    """peft's TrainableTokensLayer with a forward that touches only the tag rows (module docstring)."""

    def forward_adapters(self, x: torch.Tensor, active_adapters, *args, **kwargs) -> torch.Tensor:
        if self.disable_adapters or not active_adapters or self.merged:
            return super().forward_adapters(x, active_adapters, *args, **kwargs)  # base rows, or written in
        self._check_overlapping_tokens(active_adapters)
        base = self.base_layer
        result = base(x, *args, **kwargs)
        for name in active_adapters:
            index = self.tag_index(name, result.device)  # [n] tag ids
            rows = self.trainable_tokens_delta[name].to(base.weight)  # [n, d]
            if isinstance(base, torch.nn.Embedding):
                result = _embed_tag_rows(x, result, index, rows, self._get_embed_scale())
            elif isinstance(base, torch.nn.Linear):
                # in place on the head's fresh output, which its backward does not keep (autograd
                # would refuse otherwise): a copy of [..., V] logits would cost more than the matmul
                result.index_copy_(-1, index, F.linear(x, rows))  # [..., V], tag columns [..., n]
            else:
                raise ValueError(f"tag rows around a {type(base).__name__}: only an embedding or a linear head")
        return result


    def tag_index(self, name: str, device: torch.device) -> torch.Tensor:
        """[n] adapter `name`'s tag ids on `device`, made once: a new one each forward is a copy to
        a GPU, which waits for the work queued before it (the head's: the whole decoder's)."""
        made = self.__dict__.setdefault("tag_indices", {})  # (a layer's class is swapped in: no __init__ of ours)
        if (name, device) not in made:
            made[name, device] = torch.as_tensor(self.token_indices[name], device=device)
        return made[name, device]


def _embed_tag_rows(ids: torch.Tensor, embedded: torch.Tensor, index: torch.Tensor, rows: torch.Tensor,
                    scale: torch.Tensor | None) -> torch.Tensor:
    """ids [...], embedded [..., d] (the base's rows), index [n], rows [n, d] -> [..., d] with each
    tag position holding its row (x scale, as the base scales its own rows)"""
    hit = ids.unsqueeze(-1) == index  # [..., n] at most one True per position
    which = hit.int().argmax(-1)  # [...] the tag's slot in rows (0 where none)
    tagged = F.embedding(which, rows)  # [..., d]
    if scale is not None:
        tagged = tagged * scale.to(tagged.dtype)
    return torch.where(hit.any(-1, keepdim=True), tagged, embedded)


def use_rowwise_tag_rows(model) -> int:
    """Give every peft TrainableTokensLayer in `model` the row-wise forward; returns how many."""
    layers = [m for m in model.modules() if type(m) is TrainableTokensLayer]  # a tied head's too
    for layer in layers:
        layer.__class__ = RowwiseTagRows
    return len(layers)
