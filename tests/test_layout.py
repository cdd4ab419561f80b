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


def logits(model, ids, layout_mode="structured", attention_mask=None):
    ids = torch.tensor(ids) if not torch.is_tensor(ids) else ids
    ids = ids if ids.dim() == 2 else ids[None]
    layout = build_layout(ids, TAGS, layout_mode, attention_mask=attention_mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=layout.attention_mask, position_ids=layout.position_ids)
    return out.logits


def plain_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


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


def test_every_path_token_matches_a_plain_run_of_prefix_and_that_path(model):
    ids, prefix, paths1, middle, paths2 = two_block_trace()
    full = logits(model, ids)[0]  # [T, V]
    start = len(prefix)
    for path in paths1:
        alone = plain_logits(model, prefix + path)[len(prefix) :]
        diff = (full[start : start + len(path)] - alone).abs().max().item()
        assert diff <= ATOL, diff
        start += len(path)
    # block 2: the reference is the trace cut after its own path (its siblings removed)
    before2 = prefix + sum(paths1, []) + middle
    start = len(before2)
    for path in paths2:
        alone = logits(model, before2 + path)[0, len(before2) :]
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


def test_padded_batches_match_single_runs(model):
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
        batched = logits(model, batch, attention_mask=real)
        for row, seq in enumerate(seqs):
            single = logits(model, seq)[0]
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
