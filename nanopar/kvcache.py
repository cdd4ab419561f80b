"""Lanes over one batched KV cache: rows that can be duplicated, dropped, cut and joined.

The sampler decodes many sequences ("lanes") in one forward. Their keys and values live in one
`DynamicCache`, one row per lane, **right-aligned**: lane r occupies the last `lens[r]` columns of
its row in every layer, the columns to its left are padding that no query attends to. Every
decode step appends one column to every row, so the alignment holds by itself; forks, merges and
finished lanes change the set of rows, which `rebuild` does in one pass per step.

    row 0   . . . a b c d      lens = [4, 6]   (. = padding, never attended)
    row 1   . p q r s t u

A decode step copies the cache once anyway (`DynamicCache` appends a column by concatenation), so
`rebuild` is lazy: it records the new rows, and the next step's append builds them in that same
copy (`index_select` straight into the new tensor), instead of a copy of its own. The tensors the
model sees are exactly those an eager rebuild would give.

Not here: what the lanes mean (sampler.py) or which positions their tokens have (layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

Piece = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one row [H, n, D]


@dataclass
class _Plan:
    """A pending rebuild: the rows `index` of the old cache (trimmed or padded to `width`
    columns), then one row per piece of `extra`."""

    index: torch.Tensor  # [n_keep] long
    extra: list[Piece]
    width: int


def _rebuilt(old: torch.Tensor, plan: _Plan, layer: int, which: int, new: torch.Tensor | None) -> torch.Tensor:
    """One layer's keys (which = 0) or values (1) after `plan`, and `new` columns appended. One copy."""
    N, H, W, D = old.shape
    width, keep = plan.width, plan.index.shape[0]
    out = old.new_empty(keep + len(plan.extra), H, width + (0 if new is None else new.shape[-2]), D)
    shared = min(width, W)
    out[:keep, :, : width - shared] = 0
    rows = out[:keep, :, width - shared : width]
    if old.device.type == "cpu":  # straight into the new tensor (an advanced-index gather is ~5x slower)
        torch.index_select(old[:, :, W - shared :], 0, plan.index, out=rows)
    else:  # (a strided `out` is a CPU-tested path only)
        rows.copy_(torch.index_select(old[:, :, W - shared :], 0, plan.index))
    for j, piece in enumerate(plan.extra):
        part = piece[layer][which]  # [H, n, D]
        out[keep + j, :, : width - part.shape[-2]] = 0
        out[keep + j, :, width - part.shape[-2] : width] = part
    if new is not None:
        out[:, :, width:] = new
    return out


class _Layer(DynamicLayer):
    """A `DynamicLayer` whose next update first applies the owner's pending rebuild, in the same copy."""

    def __init__(self, owner: "LaneCache", index: int, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.owner, self.index = owner, index
        self.keys, self.values, self.is_initialized, self.device = keys, values, True, keys.device

    def get_seq_length(self) -> int:  # what the model reads before its update: the rebuilt width
        return self.owner.width

    def update(self, key_states, value_states, *args, **kwargs):
        plan = self.owner.plan
        if plan is None:
            return super().update(key_states, value_states)
        self.keys = _rebuilt(self.keys, plan, self.index, 0, key_states)
        self.values = _rebuilt(self.values, plan, self.index, 1, value_states)
        if self.index == len(self.owner.cache.layers) - 1:  # the last layer: the rebuild is done
            self.owner.plan = None
        return self.keys, self.values


class LaneCache:
    def __init__(self, cache: DynamicCache, lens: list[int]):
        self.cache = cache  # the model's cache object, passed to every forward
        self.lens = list(lens)  # real tokens per row (right-aligned)
        self._mask = None  # [N, columns] the step mask with spare columns; steps keep it, rebuilds reset it
        self.plan: _Plan | None = None  # a rebuild the next forward applies
        cache.layers[:] = [_Layer(self, i, layer.keys, layer.values) for i, layer in enumerate(cache.layers)]

    @property
    def width(self) -> int:
        """Columns per row (the longest lane plus nothing: `rebuild` trims shared padding)."""
        return self.plan.width if self.plan is not None else self.cache.layers[0].keys.shape[-2]

    def piece(self, row: int, start: int, end: int) -> Piece:
        """A copy of tokens [start, end) of a lane (0 = its first real token), every layer."""
        self.settle()
        offset = self.width - self.lens[row]
        return [
            (layer.keys[row, :, offset + start : offset + end].clone(),
             layer.values[row, :, offset + start : offset + end].clone())
            for layer in self.cache.layers
        ]

    def step_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive mask for one decode step: each row sees its real tokens and the new one.

        None when no row has padding: the model then attends to everything, and sdpa takes its
        faster unmasked path. [N, 1, 1, W+1]: a view of a mask made once per set of rows, with
        spare columns (a step moves no row's first real column, it adds a visible one).
        """
        width = self.width
        if min(self.lens) == width:
            return None
        if self._mask is None or self._mask.shape[-1] < width + 1 or self._mask.dtype != dtype:
            columns = torch.arange(width + 1 + max(16, width // 4), device=self.device)  # spare columns
            pad = width - torch.tensor(self.lens, device=self.device)  # [N] padding columns per row
            self._mask = torch.zeros(len(self.lens), len(columns), dtype=dtype, device=self.device)
            self._mask.masked_fill_(columns[None, :] < pad[:, None], torch.finfo(dtype).min)
        return self._mask[:, None, None, : width + 1]

    def appended(self) -> None:
        """Record the column the last forward appended to every row."""
        if self.plan is not None:
            raise RuntimeError("the forward did not update the lane cache (use_cache=True, cache=LaneCache.cache)")
        self.lens = [n + 1 for n in self.lens]

    def rebuild(self, keep: list[int], extra: list[Piece]) -> None:
        """New rows: the rows `keep` (in that order, repeats allowed = duplication), then `extra`.

        Rows not kept are freed; shared left padding is trimmed. Lazy: the next forward's append
        does it (`settle` does it now).
        """
        self.settle()
        lens = [self.lens[r] for r in keep] + [piece[0][0].shape[-2] for piece in extra]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.plan = _Plan(index, extra, max(lens, default=0))
        self.lens = lens
        self._mask = None

    def settle(self) -> None:
        """Apply a pending rebuild now, without a forward."""
        if self.plan is not None:
            for i, layer in enumerate(self.cache.layers):
                layer.keys = _rebuilt(layer.keys, self.plan, i, 0, None)
                layer.values = _rebuilt(layer.values, self.plan, i, 1, None)
            self.plan = None

    @property
    def device(self) -> torch.device:
        return self.cache.layers[0].keys.device

    def nbytes(self) -> int:
        """Bytes held by keys and values."""
        return sum(l.keys.nbytes + l.values.nbytes for l in self.cache.layers)


def join(pieces: list[Piece]) -> Piece:
    """Concatenate pieces along the sequence: the row of prefix ‖ path₁ ‖ … ‖ path_K."""
    return [
        (torch.cat([p[i][0] for p in pieces], dim=-2), torch.cat([p[i][1] for p in pieces], dim=-2))
        for i in range(len(pieces[0]))
    ]
