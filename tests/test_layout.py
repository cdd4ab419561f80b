"""The structured layout (layout.py) against independent computations on tiny Qwen models.

The reference for a path token is a plain causal run of the shared prefix + that path alone:
under the Unseen layout a path must behave exactly as if its siblings did not exist.
"""

import pytest
import torch

from conftest import A, A_, P, P_, S, S_, TAGS, V
from nanopar.layout import build_layout
from nanopar.tiny import tiny_qwen_model

ATOL = 1e-5


def words(n, seed):
    return torch.randint(0, V - 6, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def two_block_trace():
    """prefix, block 1 (3 paths, a preamble token, gap tokens), summary, main, block 2 (2 paths)."""
    prefix = words(5, 1) + [P] + words(1, 2)
    paths1 = [[A, *words(4, 3), A_], [A, *words(2, 4), A_, *words(1, 5)], [A, *words(6, 6), A_]]
    middle = [P_, S, *words(3, 7), S_, *words(2, 8), P]
    paths2 = [[A, *words(3, 9), A_], [A, *words(5, 10), A_]]
    tail = [P_, S, *words(4, 11), S_, *words(2, 12)]
    ids = prefix + sum(paths1, []) + middle + sum(paths2, []) + tail
    return ids, prefix, paths1, middle, paths2


def logits(model, ids, layout_mode="structured", attention_mask=None, path_stride=0, shift=(0, 0)):
    """The model's logits under the layout; `shift` = (from, by): positions from index `from` on
    are moved by `by` (a lone path placed where it sits in a block with a stride)."""
    ids = torch.tensor(ids) if not torch.is_tensor(ids) else ids
    ids = ids if ids.dim() == 2 else ids[None]
    layout = build_layout(ids, TAGS, layout_mode, attention_mask=attention_mask, path_stride=path_stride)
    positions = layout.position_ids.clone()  # [B, T]
    positions[:, shift[0] :] += shift[1]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=layout.attention_mask, position_ids=positions)
    return out.logits


def plain_logits(model, ids, shift=(0, 0)):
    """A plain causal run, positions from index shift[0] on moved by shift[1]."""
    positions = torch.arange(len(ids))
    positions[shift[0] :] += shift[1]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), position_ids=positions[None]).logits[0]


@pytest.fixture(params=[(a, i) for a in ("qwen2", "qwen3") for i in ("eager", "sdpa")], ids=lambda p: "-".join(p))
def model(request):
    arch, impl = request.param
    return tiny_qwen_model(arch=arch, attn_implementation=impl, vocab_size=V, seed=3)


def test_positions_and_mask_of_a_hand_written_block():
    # q P <Path> a </Path> <Path> b b </Path> </Parallel> <Summary> s </Summary>
    ids = torch.tensor([[1, P, A, 2, A_, A, 3, 3, A_, P_, S, 4, S_]])
    layout = build_layout(ids, TAGS)
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9]]
    seen = (layout.attention_mask[0, 0] == 0).int()
    expected = torch.tril(torch.ones(13, 13, dtype=torch.int))
    expected[5:9, 2:5] = 0  # the second path never sees the first
    assert torch.equal(seen, expected)
    assert layout.attention_mask.dtype == torch.float32 and layout.attention_mask.max() == 0
    causal = build_layout(ids, TAGS, "causal")
    assert causal.position_ids.tolist() == [list(range(13))]
    assert torch.equal((causal.attention_mask[0, 0] == 0).int(), torch.tril(torch.ones(13, 13, dtype=torch.int)))
    assert build_layout(ids, TAGS, "causal", path_stride=5).position_ids.tolist() == [list(range(13))]  # no part


def test_a_stride_gives_path_k_its_own_start_and_the_block_continues_after_the_furthest_path():
    # q P <Path> a </Path> <Path> b b </Path> <Path> c </Path> </Parallel> <Summary> s </Summary> r
    ids = torch.tensor([[1, P, A, 2, A_, A, 3, 3, A_, A, 5, A_, P_, S, 4, S_, 6]])
    #                  q  P  path 1    path 2 (start 2 + 5)  path 3 (2 + 10)  after: max(5, 11, 15)
    expected = [0, 1, 2, 3, 4, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18, 19]
    assert build_layout(ids, TAGS, path_stride=5).position_ids.tolist() == [expected]
    # a stride shorter than a path: ranges overlap, and the block still ends after its furthest path
    assert build_layout(ids, TAGS, path_stride=1).position_ids.tolist() == [
        [0, 1, 2, 3, 4, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9, 10, 11]]
    # the mask does not depend on the stride
    assert torch.equal(build_layout(ids, TAGS, path_stride=5).attention_mask, build_layout(ids, TAGS).attention_mask)


@pytest.mark.parametrize("stride", [0, 7], ids=["shared", "disjoint"])
def test_every_path_token_matches_a_plain_run_of_prefix_and_that_path(model, stride):
    ids, prefix, paths1, middle, paths2 = two_block_trace()
    assert max(map(len, paths1[:-1] + paths2[:-1])) <= 7  # stride 7: the paths' position ranges are disjoint
    full = logits(model, ids, path_stride=stride)[0]  # [T, V]
    start = len(prefix)
    for k, path in enumerate(paths1):
        alone = plain_logits(model, prefix + path, shift=(len(prefix), k * stride))[len(prefix) :]
        diff = (full[start : start + len(path)] - alone).abs().max().item()
        assert diff <= ATOL, diff
        start += len(path)
    # block 2: the reference is the trace cut after its own path (its siblings removed)
    before2 = prefix + sum(paths1, []) + middle
    start = len(before2)
    for k, path in enumerate(paths2):
        alone = logits(model, before2 + path, path_stride=stride, shift=(len(before2), k * stride))[0, len(before2) :]
        assert (full[start : start + len(path)] - alone).abs().max().item() <= ATOL
        start += len(path)


def test_summary_sees_every_path_and_paths_never_see_siblings(model):
    ids, prefix, paths1, middle, paths2 = two_block_trace()
    base = logits(model, ids)[0]
    first_path_token = len(prefix) + 1
    second_path_start = len(prefix) + len(paths1[0])
    summary_start = len(prefix) + sum(map(len, paths1))
    changed = list(ids)
    changed[first_path_token] = (changed[first_path_token] + 1) % (V - 6)
    after = logits(model, changed)[0]
    same_block_sibling = slice(second_path_start, summary_start)
    assert (after[same_block_sibling] - base[same_block_sibling]).abs().max() == 0
    assert (after[summary_start:] - base[summary_start:]).abs().max(-1).values.min() > 1e-4


@pytest.mark.parametrize("stride", [0, 7], ids=["shared", "disjoint"])
def test_padded_batches_match_single_runs(model, stride):
    ids, *_ = two_block_trace()
    short = [7, 8, P, A, 9, A_, A, 10, 11, A_, P_, S, 12, S_]
    causal_only = words(9, 13)
    seqs = [ids, short, causal_only]
    T = max(map(len, seqs))
    for side in ("left", "right"):
        batch = torch.zeros(len(seqs), T, dtype=torch.long)
        real = torch.zeros(len(seqs), T, dtype=torch.long)
        for row, seq in enumerate(seqs):
            span = slice(T - len(seq), T) if side == "left" else slice(0, len(seq))
            batch[row, span], real[row, span] = torch.tensor(seq), 1
        batched = logits(model, batch, attention_mask=real, path_stride=stride)
        for row, seq in enumerate(seqs):
            single = logits(model, seq, path_stride=stride)[0]
            got = batched[row][real[row].bool()]
            assert (got - single).abs().max().item() <= ATOL, (side, row)


def test_causal_mode_equals_the_model_default(model):
    ids, *_ = two_block_trace()
    assert (logits(model, ids, "causal")[0] - plain_logits(model, ids)).abs().max().item() <= ATOL


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(Exception, match="unknown attention mode 'unseen'"):
        build_layout(torch.tensor([[1]]), TAGS, "unseen")


def test_tags_quoted_in_the_prompt_are_plain_text():
    # the prompt quotes a whole block; only the response's block is structure
    prompt = [1, P, A, 2, A_, A, 3, A_, P_, 9]
    response = [P, A, 4, A_, A, 5, 5, A_, P_, S, 6, S_]
    ids = torch.tensor([prompt + response])
    layout = build_layout(ids, TAGS, prompt_lengths=[len(prompt)])
    n = len(prompt)
    expected_positions = list(range(n + 1)) + [n + 1, n + 2, n + 3, n + 1, n + 2, n + 3, n + 4, n + 5, n + 6, n + 7, n + 8]
    assert layout.position_ids[0].tolist() == expected_positions
    seen = layout.attention_mask[0, 0] == 0
    assert seen[:n, :n].equal(torch.tril(torch.ones(n, n, dtype=torch.bool)))  # prompt: plain causal
    assert not seen[n + 4 :, n + 1 : n + 4][:4].any()  # the response's second path never sees the first


@pytest.mark.parametrize("T", [5, 8, 13])
def test_the_layouts_mask_rows_are_aligned_in_memory_and_hold_the_same_values(T):
    """Every stride of the 4D mask but the last is a multiple of MASK_ALIGNMENT (CUDA's memory-efficient
    kernel otherwise pads a copy in every layer), and its values are those of an unpadded mask built
    from the same bool pattern, for the sliding variant too."""
    from nanopar.layout import MASK_ALIGNMENT

    ids = torch.tensor([words(T, 3), words(T, 4)])
    for window in (None, 3):
        layout = build_layout(ids, TAGS, "causal", attention_mask=torch.ones(2, T, dtype=torch.long), window=window)
        masks = [layout.attention_mask] if window is None else list(layout.attention_mask.values())
        for mask in masks:
            assert mask.shape == (2, 1, T, T)
            assert all(stride % MASK_ALIGNMENT == 0 for stride in mask.stride()[:-1]), mask.stride()
        causal = torch.ones(T, T).tril().bool()
        if window is not None:
            causal &= torch.ones(T, T).triu(-(window - 1)).bool()
        expected = torch.zeros(2, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
        assert torch.equal(masks[-1], expected)
