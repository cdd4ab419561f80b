"""The attention layout of a batch of traces: a 4D additive mask and position ids.

Two modes, one function (`build_layout`), used by the sampler *and* the trainer so they can
never disagree about what a token saw:

- "structured" (Parallel-R1's Unseen, NPR): a path sees the shared prefix and itself, never a
  sibling; everything outside a block's paths (`</Parallel>`, the summary, the main chain after
  it) sees everything before it. *Multiverse positions*: every path of a block starts at the
  same position, and the token after the paths continues at start + longest path.
- "causal" (Seen): the plain causal mask and ordinary positions.

Worked example (structured, P = <Parallel>, A/B = the two paths, / = </Parallel>):

    tokens     q  P  A1 A2 A3 B1 B2 /  s
    position   0  1  2  3  4  2  3  5  6
    B1 sees    q  P  .  .  .  B1          (not A1..A3)

Which token belongs to which path comes from the lenient reading in `trace.py` (text between
paths belongs to the path before it). The mask is additive float (0 = attend, finfo(dtype).min
= blocked): transformers passes a 4D mask through untouched, and a bool mask is silently wrong
under eager attention. Padding may be on either side; pads get position 0 and are never seen.
Not here: the incremental (cached) masks of the sampler, which only need padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import NanoparError
from .tags import TagIds
from .trace import parse_ids

MODES = ("structured", "causal")


@dataclass
class Layout:
    attention_mask: torch.Tensor  # [B, 1, T, T] additive float: 0 attend, finfo.min blocked
    position_ids: torch.Tensor  # [B, T] long; pads are 0


def mask_dtype(model) -> torch.dtype:
    """The dtype a model's additive masks take: its compute dtype (float32 under 4-bit, whose
    embedding stays in the compute dtype; float32 if the embedding is not a float tensor)."""
    dtype = model.get_input_embeddings().weight.dtype
    return dtype if dtype.is_floating_point else torch.float32


def structured_roles(
    ids: list[int], tag_ids: TagIds, prompt_length: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """Per token of one (unpadded) sequence: its position, its path number, its block number.

    The first `prompt_length` tokens are read as plain text (a prompt may quote the tags).
    Path and block numbers are -1 outside any path; path numbers count over the whole sequence.
    """
    trace = parse_ids(ids[prompt_length:], tag_ids)
    n = len(ids)
    positions, path_of, block_of = [0] * n, [-1] * n, [-1] * n
    cursor = position = path_number = 0  # next unplaced token, its position, next path number
    for b, block in enumerate(trace.blocks):
        if not block.paths:
            continue
        for i in range(cursor, prompt_length + block.paths[0].start):  # shared text up to <Path>
            positions[i], position = position, position + 1
        for path in block.paths:
            for j, i in enumerate(range(prompt_length + path.start, prompt_length + path.end)):
                positions[i], path_of[i], block_of[i] = position + j, path_number, b
            path_number += 1
        position += max(map(len, block.paths))
        cursor = prompt_length + block.paths[-1].end
    for i in range(cursor, n):
        positions[i], position = position, position + 1
    return positions, path_of, block_of


def build_layout(
    input_ids: torch.Tensor,  # [B, T]
    tag_ids: TagIds,
    mode: str = "structured",
    attention_mask: torch.Tensor | None = None,  # [B, T] 1 = token, 0 = pad; None = no padding
    prompt_lengths: list[int] | None = None,  # per row: leading real tokens read as plain text
    dtype: torch.dtype = torch.float32,  # the model's compute dtype (sets the blocked value)
) -> Layout:
    """The 4D mask and position ids for a batch of traces in `mode`."""
    if mode not in MODES:
        raise NanoparError(f"unknown attention mode {mode!r}: use one of {', '.join(MODES)}")
    B, T = input_ids.shape
    device = input_ids.device
    real = torch.ones(B, T, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
    positions = torch.zeros(B, T, dtype=torch.long)
    path_of = torch.full((B, T), -1, dtype=torch.long)
    block_of = torch.full((B, T), -1, dtype=torch.long)
    if mode == "causal":
        positions = (real.long().cumsum(-1) - 1).clamp(min=0).cpu() * real.cpu()
    else:
        for row in range(B):
            where = real[row].nonzero().squeeze(-1).cpu()  # [n] the real tokens, in order
            prompt_length = prompt_lengths[row] if prompt_lengths is not None else 0
            pos, path, block = structured_roles(input_ids[row, where].tolist(), tag_ids, prompt_length)
            positions[row, where] = torch.tensor(pos, dtype=torch.long)
            path_of[row, where] = torch.tensor(path, dtype=torch.long)
            block_of[row, where] = torch.tensor(block, dtype=torch.long)
    positions, path_of, block_of = positions.to(device), path_of.to(device), block_of.to(device)

    index = torch.arange(T, device=device)
    causal = index[None, :] <= index[:, None]  # [T, T] key j <= query i
    in_path = path_of >= 0  # [B, T]
    siblings = (
        in_path[:, :, None]
        & in_path[:, None, :]
        & (block_of[:, :, None] == block_of[:, None, :])
        & (path_of[:, :, None] != path_of[:, None, :])
    )  # [B, T, T] query and key in different paths of one block
    allowed = causal[None] & real[:, None, :] & ~siblings  # [B, T, T]
    allowed |= torch.eye(T, dtype=torch.bool, device=device)[None] & ~real[:, :, None]  # pads see themselves
    mask = torch.zeros(B, 1, T, T, dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)  # [B, 1, T, T]
    return Layout(attention_mask=mask, position_ids=positions)
