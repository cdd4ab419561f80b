"""The attention layout of a batch of traces: a 4D additive mask and position ids.

Two modes, one function (`build_layout`), used by the sampler *and* the trainer so they can
never disagree about what a token saw:

- "structured" (Parallel-R1's Unseen, NPR): a path sees the shared prefix and itself, never a
  sibling; everything outside a block's paths sees everything before it. *Multiverse
  positions*, one rule (`path_start`, `after_block`, also the sampler's): path k of a block
  starts at start + k × stride, the token after the block continues after its furthest path.
  Stride 0 shares positions, as Multiverse's, NPR's and Parallel-R1's released engines do
  (Parallel-R1's moves every path back to the block's start, `append_tokens` in
  verl/verl/parallel_thinking_generation_v3/parallel_thinking_loop_v3.py); stride ≥ the
  longest path gives each path a disjoint range, as the Parallel-R1 write-up describes.
- "causal" (Seen): the plain causal mask and ordinary positions (the stride plays no part).

    tokens          q  P  A1 A2 A3 B1 B2 /  s      (P = <Parallel>, A/B = paths, / = </Parallel>)
    stride 0        0  1  2  3  4  2  3  5  6      B1 sees q P B1, never A1..A3
    stride 3        0  1  2  3  4  5  6  7  8

Which token belongs to which path comes from the lenient reading in `trace.py` (text between
paths belongs to the path before it), in the trace's tag schema: NPR's steps are its paths, its
guideline (the plans) shared text before them, its takeaway what follows the block. The mask is
additive float (0 = attend, finfo(dtype).min = blocked): transformers passes a 4D mask through
untouched, and a bool mask is silently wrong under eager attention. Padding may be on either
side; pads get position 0 and are never seen.

A model whose layers mix sliding-window and full attention (Gemma-3: 5 of 6 layers see only the
last 512 tokens) would read a 4D mask as the mask of every layer, its window gone: `window`
(`sliding_window(model)`) gives it a second mask, by layer type. The window counts the tokens a
query sees (its own among them), not positions: in causal mode that is the model's own rule; in
structured mode it is what the sampler's cache row of a lane holds (prefix ‖ its own path).
Not here: the incremental (cached) masks of the sampler (kvcache.py), which need padding and the window.
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
    attention_mask: torch.Tensor | dict[str, torch.Tensor]  # [B, 1, T, T] additive float: 0 attend, finfo.min
    # blocked; with a window, one such mask per layer type ("full_attention", "sliding_attention")
    position_ids: torch.Tensor  # [B, T] long; pads are 0


def mask_dtype(model) -> torch.dtype:
    """The dtype a model's additive masks take: its compute dtype (float32 under 4-bit, whose
    embedding stays in the compute dtype; float32 if the embedding is not a float tensor)."""
    # its first parameter, not `.weight`: for peft's trainable-token wrapper that builds a new [V, d] matrix
    dtype = next(model.get_input_embeddings().parameters()).dtype
    return dtype if dtype.is_floating_point else torch.float32


def sliding_window(model) -> int | None:
    """The window of a model whose layers mix sliding-window and full attention (`layer_types`
    holds "sliding_attention": Gemma-3, a Qwen2/3 with use_sliding_window), else None. Such a
    model takes a dict of masks by layer type."""
    config = model.config.get_text_config(decoder=True)
    if "sliding_attention" not in (getattr(config, "layer_types", None) or ()):
        return None
    return config.sliding_window


def path_start(start: int, k: int, stride: int) -> int:
    """The position of path k's first token (its <Path>) in a block whose paths start at `start`."""
    return start + k * stride


def after_block(start: int, lengths: list[int], stride: int) -> int:
    """The position after a block: one past its furthest path (`lengths`: tokens of each path).

    >>> after_block(5, [3, 1, 2], 0), after_block(5, [3, 1, 2], 4)
    (8, 15)
    """
    return max(path_start(start, k, stride) + n for k, n in enumerate(lengths))


def structured_roles(
    ids: list[int], tag_ids: TagIds, prompt_length: int = 0, path_stride: int = 0
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
        for k, path in enumerate(block.paths):
            first = path_start(position, k, path_stride)
            for j, i in enumerate(range(prompt_length + path.start, prompt_length + path.end)):
                positions[i], path_of[i], block_of[i] = first + j, path_number, b
            path_number += 1
        position = after_block(position, list(map(len, block.paths)), path_stride)
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
    path_stride: int = 0,  # structured: path k starts at start + k * stride (0 = shared positions)
    window: int | None = None,  # a sliding window (`sliding_window(model)`): then a mask per layer type
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
            pos, path, block = structured_roles(input_ids[row, where].tolist(), tag_ids, prompt_length, path_stride)
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
    mask = additive(allowed, dtype)  # [B, 1, T, T]
    if window is not None:  # sliding layers: keys among the last `window` tokens the query sees
        seen = allowed.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)  # [B, T, T] seen keys from j to the query
        mask = {"full_attention": mask, "sliding_attention": additive(allowed & (seen <= window), dtype)}
    return Layout(attention_mask=mask, position_ids=positions)


# an additive mask's rows lie a multiple of this many columns apart in memory: CUDA's memory-efficient
# attention kernel, the one that takes a mask, first copies a mask whose row stride is not a multiple of 8
# into a padded one, in every layer (and again in backward)
MASK_ALIGNMENT = 8


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, T] bool (True = attend) -> [B, 1, T, T] additive mask, a view of rows padded to a
    multiple of MASK_ALIGNMENT columns."""
    B, T, S = allowed.shape
    padded = torch.zeros(B, 1, T, -(-S // MASK_ALIGNMENT) * MASK_ALIGNMENT, dtype=dtype, device=allowed.device)
    mask = padded[..., :S]  # [B, 1, T, S]
    return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
