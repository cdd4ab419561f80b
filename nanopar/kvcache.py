"""Lanes over one batched KV cache: rows that can be duplicated, dropped, cut and joined.

The sampler decodes many sequences ("lanes") in one forward. Their keys and values live in one
`DynamicCache`, one row per lane, **right-aligned**: lane r occupies the last `lens[r]` columns of
its row in every layer, the columns to its left are padding that no query attends to. Every
decode step appends one column to every row, so the alignment holds by itself; forks, merges and
finished lanes change the set of rows, which `rebuild` does in one pass per step.

    row 0   . . . a b c d      lens = [4, 6]   (. = padding, never attended)
    row 1   . p q r s t u

`LaneCache.rebuild` copies the new rows at once (`rebuilt_rows`, the plain version), and every
decode step appends its column the way `DynamicCache` does, by concatenation: a copy of the whole
cache per step. `LazyLaneCache` gives the model the very same values without those copies: each
layer keeps its keys and values in a buffer with `SPARE_COLUMNS` free columns on the right, a
step writes its column into them in place (a full buffer is copied once into one with spare
columns again), and a rebuild only records the new rows, which the next step's append builds in
a new buffer. The model reads views of the buffers' filled columns.
The sampler runs the plain one below the draw's vocabulary threshold (the toy, tiny models),
the lazy one from it (`sampler.cache_for_vocabulary`).
Not here: what the lanes mean (sampler.py) or which positions their tokens have (layout.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .layout import MASK_ALIGNMENT  # a step mask's rows, as every additive mask's, a multiple of it apart

Piece = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one row [H, n, D]


def rebuilt_rows(old: torch.Tensor, keep: torch.Tensor, extra: list[torch.Tensor], width: int,
                 new: torch.Tensor | None = None, spare: int = 0) -> torch.Tensor:
    """One layer's keys or values with new rows: the rows `keep` of `old`, then one row per tensor
    of `extra`, each right-aligned in `width` columns (zeros on the left, extra columns on the
    left cut), then the columns `new` appended to every row (the lazy rebuild's step), then
    `spare` columns left unwritten (the lazy cache's room to append in place). One copy.

    old [N, H, W, D], keep [n_keep] long, extra: [H, n, D] each, new [n_keep + n_extra, H, m, D]
    -> [n_keep + n_extra, H, width + m + spare, D]
    """
    N, H, W, D = old.shape
    n_keep = keep.shape[0]
    m = 0 if new is None else new.shape[-2]
    out = old.new_empty(n_keep + len(extra), H, width + m + spare, D)
    shared = min(width, W)  # columns of the old rows that fit
    out[:n_keep, :, : width - shared] = 0
    rows = out[:n_keep, :, width - shared : width]  # [n_keep, H, shared, D]
    if old.device.type == "cpu":  # straight into the new tensor (an advanced-index gather is ~5x slower)
        torch.index_select(old[:, :, W - shared :], 0, keep, out=rows)
    else:  # (a strided `out` is a CPU-tested path only)
        rows.copy_(torch.index_select(old[:, :, W - shared :], 0, keep))
    for j, part in enumerate(extra):
        out[n_keep + j, :, : width - part.shape[-2]] = 0
        out[n_keep + j, :, width - part.shape[-2] : width] = part
    if new is not None:
        out[:, :, width : width + m] = new
    return out


class LaneCache:
    """The rows of a `DynamicCache` as lanes; `rebuild` copies the new rows at once."""

    def __init__(self, cache: DynamicCache, lens: list[int], most_columns: int | None = None):
        self.cache = cache  # the model's cache object, passed to every forward
        self.lens = list(lens)  # real tokens per row (right-aligned)
        self.most_columns = most_columns  # the widest a row can grow (None: unknown): the lazy cache's spare columns stop there
        self._pad = None  # [N] long on the device: padding columns per row (a step keeps them: it adds a column to every row)
        self._mask = None  # [N, columns] the step mask with spare columns; steps keep it, rebuilds reset it

    @property
    def width(self) -> int:
        """Columns per row (the longest lane plus nothing: `rebuild` trims shared padding)."""
        return self.cache.layers[0].keys.shape[-2]

    def rebuild(self, keep: list[int], extra: list[Piece]) -> None:
        """New rows: the rows `keep` (in that order, repeats allowed = duplication), then `extra`.
        Rows not kept are freed; shared left padding is trimmed."""
        self.lens = [self.lens[r] for r in keep] + [piece[0][0].shape[-2] for piece in extra]
        width = max(self.lens, default=0)
        # the rows to keep and each new row's padding columns: one copy to the device
        index = torch.tensor(keep + [width - n for n in self.lens], dtype=torch.long, device=self.device)  # [n_keep + N]
        self._pad, self._mask = index[len(keep) :], None  # [N]
        self._rebuild_layers(index[: len(keep)], extra, width)

    def _rebuild_layers(self, keep: torch.Tensor, extra: list[Piece], width: int) -> None:
        """Every layer's keys and values rebuilt now (`rebuilt_rows`)."""
        for i, layer in enumerate(self.cache.layers):
            layer.keys = rebuilt_rows(layer.keys, keep, [piece[i][0] for piece in extra], width)
            layer.values = rebuilt_rows(layer.values, keep, [piece[i][1] for piece in extra], width)

    def piece(self, row: int, start: int, end: int) -> Piece:
        """A copy of tokens [start, end) of a lane (0 = its first real token), every layer."""
        offset = self.width - self.lens[row]
        return [
            (layer.keys[row, :, offset + start : offset + end].clone(),
             layer.values[row, :, offset + start : offset + end].clone())
            for layer in self.cache.layers
        ]

    def step_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor | dict | None:
        """Additive mask for one decode step: each row sees its real tokens and the new one.

        None when no row has padding: the model then attends to everything, and sdpa takes its
        faster unmasked path. [N, 1, 1, W+1]: a view of a mask made once per set of rows, with
        spare columns (a step moves no row's first real column, it adds a visible one).
        With a sliding `window` (`layout.sliding_window`), always a mask per layer type: the
        sliding layers' sees only the last `window` columns (a row holds exactly the tokens its
        lane sees, in order, so this is `layout.build_layout`'s window).
        """
        width = self.width
        if window is None and min(self.lens) == width:
            return None
        if self._mask is None or self._mask.shape[-1] < width + 1 or self._mask.dtype != dtype:
            if self._pad is None:  # (the first mask of a cache that was never rebuilt)
                self._pad = torch.tensor([width - n for n in self.lens], device=self.device)  # [N]
            # spare columns, and every row a multiple of MASK_ALIGNMENT long (an aligned row stride)
            spare = width + 1 + max(16, width // 4)
            columns = torch.arange(-(-spare // MASK_ALIGNMENT) * MASK_ALIGNMENT, device=self.device)  # [C]
            self._mask = torch.zeros(len(self.lens), len(columns), dtype=dtype, device=self.device)  # [N, C]
            self._mask.masked_fill_(columns[None, :] < self._pad[:, None], torch.finfo(dtype).min)
        mask = self._mask[:, None, None, : width + 1]  # [N, 1, 1, W+1], strides (C, C, C, 1)
        if window is None:
            return mask
        sliding = self._mask.clone()[:, None, None, : width + 1]  # (a clone of the view would drop the alignment)
        sliding[..., : max(0, width + 1 - window)] = torch.finfo(dtype).min
        return {"full_attention": mask, "sliding_attention": sliding}

    def appended(self) -> None:
        """Record the column the last forward appended to every row."""
        self.lens = [n + 1 for n in self.lens]

    @property
    def device(self) -> torch.device:
        return self.cache.layers[0].keys.device

    def nbytes(self) -> int:
        """Bytes held by keys and values."""
        return sum(l.keys.nbytes + l.values.nbytes for l in self.cache.layers)


# ------------------------------------------------------------------ the lazy rebuild


@dataclass
class _Plan:
    """A pending rebuild: the rows `keep` of the old cache, then one row per piece of `extra`, in
    `width` columns."""

    keep: torch.Tensor  # [n_keep] long
    extra: list[Piece]
    width: int


# free columns each layer's buffer keeps on the right: a decode step writes its column there in place
# instead of copying the whole cache into a new tensor, as a concatenation does (a copy of every lane's
# keys and values, per layer and step, which grows with lanes x tokens: bench/races.py's kv_append races
# the two); a full buffer is copied once into one with this many free columns again,
# never past the widest a row can grow (`most_columns`), so the buffers stay within bench/memory.py's bound
SPARE_COLUMNS = 64


class LazyLaneCache(LaneCache):
    """A `LaneCache` that writes each step's column in place and whose `rebuild` rides on the next
    forward's append: the same values, without a copy of the cache per step or per rebuild."""

    def __init__(self, cache: DynamicCache, lens: list[int], most_columns: int | None = None):
        super().__init__(cache, lens, most_columns)
        self.plan: _Plan | None = None  # a rebuild the next forward applies
        cache.layers[:] = [_Layer(self, i, layer.keys, layer.values) for i, layer in enumerate(cache.layers)]

    @property
    def width(self) -> int:
        return self.plan.width if self.plan is not None else super().width

    def _rebuild_layers(self, keep: torch.Tensor, extra: list[Piece], width: int) -> None:
        """Recorded for the next forward's append to build (`rebuild` is `LaneCache`'s)."""
        self.settle()
        self.plan = _Plan(keep, extra, width)

    def settle(self) -> None:
        """Apply a pending rebuild now, without a forward."""
        if self.plan is not None:
            plan, self.plan = self.plan, None
            super()._rebuild_layers(plan.keep, plan.extra, plan.width)  # new keys and values: each layer's next
            # update sees they are not its views and takes them as its buffers (`_Layer.update`)

    def piece(self, row: int, start: int, end: int) -> Piece:
        self.settle()
        return super().piece(row, start, end)

    def spare(self, columns: int) -> int:
        """Free columns for a buffer of `columns` filled ones: `SPARE_COLUMNS`, none past the widest
        a row can grow (so the buffers stay within bench/memory.py's bound)."""
        return SPARE_COLUMNS if self.most_columns is None else max(0, min(SPARE_COLUMNS, self.most_columns - columns))

    def appended(self) -> None:
        if self.plan is not None:
            raise RuntimeError("the forward did not update the lane cache (use_cache=True, cache=LaneCache.cache)")
        super().appended()

    def nbytes(self) -> int:
        """Bytes held by the layers' buffers, their spare columns included."""
        return sum(l.key_buffer.nbytes + l.value_buffer.nbytes for l in self.cache.layers)


class _Layer(DynamicLayer):
    """A `DynamicLayer` over buffers with spare columns: its update writes the new columns in place,
    or first applies the owner's pending rebuild, in the one copy that makes new buffers."""

    def __init__(self, owner: LazyLaneCache, index: int, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        # a weak reference: the owner holds its layers (cache.layers), and a strong one back would make a
        # cycle that only Python's cyclic collector frees, so a finished sampler call's buffers (GiBs on a
        # GPU) would stay allocated through the training read after it, until a collection happens to run
        self.owner, self.index = weakref.proxy(owner), index
        self.keys, self.values, self.is_initialized, self.device = keys, values, True, keys.device
        self.key_buffer, self.value_buffer = keys, values  # [N, H, capacity, D]; keys, values: their first columns
        self.view = keys  # the keys this layer last handed out: anything else in self.keys was set from outside

    def get_seq_length(self) -> int:  # what the model reads before its update: the rebuilt width
        return self.owner.width

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states [N, H, m, D] -> this layer's keys and values [N, H, width + m, D]
        (views of its buffers)."""
        plan, m = self.owner.plan, key_states.shape[-2]
        if self.keys is not self.view:  # set from outside (a settled rebuild, DynamicLayer's own methods): the buffers now
            self.key_buffer, self.value_buffer = self.keys, self.values
        if plan is not None:  # new rows: built in new buffers, the step's columns and the spare ones with them
            width = plan.width
            spare = self.owner.spare(width + m)
            self.key_buffer = rebuilt_rows(self.keys, plan.keep, [piece[self.index][0] for piece in plan.extra],
                                           width, key_states, spare)
            self.value_buffer = rebuilt_rows(self.values, plan.keep, [piece[self.index][1] for piece in plan.extra],
                                             width, value_states, spare)
            if self.index == len(self.owner.cache.layers) - 1:  # the last layer: the rebuild is done
                self.owner.plan = None
        else:  # the same rows: the new columns written after the filled ones
            width = self.keys.shape[-2]
            if width + m > self.key_buffer.shape[-2]:  # full: copied once into buffers with spare columns
                N, H, _, D = self.keys.shape
                capacity = width + m + self.owner.spare(width + m)
                self.key_buffer = self.keys.new_empty(N, H, capacity, D)
                self.key_buffer[:, :, :width] = self.keys
                self.value_buffer = self.values.new_empty(N, H, capacity, D)
                self.value_buffer[:, :, :width] = self.values
            self.key_buffer[:, :, width : width + m] = key_states
            self.value_buffer[:, :, width : width + m] = value_states
        self.keys = self.view = self.key_buffer[:, :, : width + m]  # [N, H, width + m, D] views
        self.values = self.value_buffer[:, :, : width + m]
        return self.keys, self.values


def join(pieces: list[Piece]) -> Piece:
    """Concatenate pieces along the sequence: the row of prefix ‖ path₁ ‖ … ‖ path_K."""
    return [
        (torch.cat([p[i][0] for p in pieces], dim=-2), torch.cat([p[i][1] for p in pieces], dim=-2))
        for i in range(len(pieces[0]))
    ]
