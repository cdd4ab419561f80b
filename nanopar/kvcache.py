"""Lanes over one batched KV cache: rows that can be duplicated, dropped, cut and joined.

The sampler decodes many sequences ("lanes") in one forward. Their keys and values live in one
`DynamicCache`, one row per lane, **right-aligned**: lane r occupies the last `lens[r]` columns of
its row in every layer, the columns to its left are padding that no query attends to. Every
decode step appends one column to every row, so the alignment holds by itself; forks, merges and
finished lanes change the set of rows, which `rebuild` does in one pass per step.

    row 0   . . . a b c d      lens = [4, 6]   (. = padding, never attended)
    row 1   . p q r s t u

Not here: what the lanes mean (sampler.py) or which positions their tokens have (layout.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

Piece = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one row [H, n, D]


class LaneCache:
    def __init__(self, cache: DynamicCache, lens: list[int]):
        self.cache = cache  # the model's cache object, passed to every forward
        self.lens = list(lens)  # real tokens per row (right-aligned)
        self._first_real = None  # [N] first real column per row; steps keep it, rebuilds reset it

    @property
    def width(self) -> int:
        """Columns per row (the longest lane plus nothing: `rebuild` trims shared padding)."""
        return self.cache.layers[0].keys.shape[-2]

    def piece(self, row: int, start: int, end: int) -> Piece:
        """A copy of tokens [start, end) of a lane (0 = its first real token), every layer."""
        offset = self.width - self.lens[row]
        return [
            (layer.keys[row, :, offset + start : offset + end].clone(),
             layer.values[row, :, offset + start : offset + end].clone())
            for layer in self.cache.layers
        ]

    def step_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive mask for one decode step: each row sees its real tokens and the new one.

        None when no row has padding: the model then attends to everything, and sdpa takes its
        faster unmasked path.
        """
        if min(self.lens) == self.width:
            return None
        if self._first_real is None:
            self._first_real = self.width - torch.tensor(self.lens, device=self.device)  # [N]
        columns = torch.arange(self.width + 1, device=self.device)  # [W+1]
        visible = columns[None, :] >= self._first_real[:, None]  # [N, W+1]
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device)
        return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None, None, :]  # [N, 1, 1, W+1]

    def appended(self) -> None:
        """Record the column the last forward appended to every row."""
        self.lens = [n + 1 for n in self.lens]

    def rebuild(self, keep: list[int], extra: list[Piece]) -> None:
        """New rows: the rows `keep` (in that order, repeats allowed = duplication), then `extra`.

        One copy of the cache; rows not kept are freed. Shared left padding is trimmed.
        """
        lens = [self.lens[r] for r in keep] + [piece[0][0].shape[-2] for piece in extra]
        width = max(lens, default=0)
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for i, layer in enumerate(self.cache.layers):
            for name in ("keys", "values"):
                old = getattr(layer, name)  # [N, H, W, D]
                N, H, W, D = old.shape
                new = old.new_zeros(len(lens), H, width, D)  # [N', H, width, D]
                shared = min(width, W)
                new[: len(keep), :, width - shared :] = old[index, :, W - shared :]
                for j, piece in enumerate(extra):
                    part = piece[i][0 if name == "keys" else 1]  # [H, n, D]
                    new[len(keep) + j, :, width - part.shape[-2] :] = part
                setattr(layer, name, new)
        self.lens = lens
        self._first_real = None

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

