"""The lane cache (nanopar/kvcache.py) against a hand-written rebuild: the plain `LaneCache` and
the lazy `LazyLaneCache` give the model the same tensors, step after step."""

import pytest
import torch
from transformers import DynamicCache

from nanopar.kvcache import SPARE_COLUMNS, LaneCache, LazyLaneCache, join

CACHES = {"plain": LaneCache, "lazy": LazyLaneCache}


def reference_rebuild(layers, lens, keep, extra):
    """Zero-filled new rows, the kept rows and the joined pieces right-aligned in them, shared
    left padding trimmed. -> (layers [(keys, values)], lens)"""
    new_lens = [lens[r] for r in keep] + [piece[0][0].shape[-2] for piece in extra]
    width = max(new_lens)
    out = []
    for i, (keys, values) in enumerate(layers):
        pair = []
        for which, old in enumerate((keys, values)):
            N, H, W, D = old.shape
            new = old.new_zeros(len(new_lens), H, width, D)
            shared = min(width, W)
            new[: len(keep), :, width - shared :] = old[keep, :, W - shared :]
            for j, piece in enumerate(extra):
                part = piece[i][which]
                new[len(keep) + j, :, width - part.shape[-2] :] = part
            pair.append(new)
        out.append(tuple(pair))
    return out, new_lens


@pytest.mark.parametrize("kind", sorted(CACHES))
@pytest.mark.parametrize("case", ["drop and duplicate", "a join longer than every row", "trim", "only joins"])
def test_a_rebuild_then_a_step_equals_the_reference_rebuild_and_a_concatenation(case, kind):
    g = torch.Generator().manual_seed(0)
    N, H, W, D, layers = 5, 2, 9, 4, 3
    lens = [9, 4, 7, 2, 9] if case != "trim" else [5, 4, 7, 2, 6]
    tensors = [(torch.randn(N, H, W, D, generator=g), torch.randn(N, H, W, D, generator=g)) for _ in range(layers)]
    keep, extra_rows = {"drop and duplicate": ([4, 1, 1, 0, 3], []), "a join longer than every row": ([2, 3], [(0, 1)]),
                        "trim": ([1, 3, 3], []), "only joins": ([], [(2, 2)])}[case]
    cache = DynamicCache()
    for i, (k, v) in enumerate(tensors):
        cache.update(k.clone(), v.clone(), i)
    lanes = CACHES[kind](cache, lens)
    # a join: row a's tokens then row b's (a merge: prefix ‖ paths)
    extra = [join([lanes.piece(a, 0, lens[a]), lanes.piece(b, 1, lens[b])]) for a, b in extra_rows]
    expected, expected_lens = reference_rebuild(tensors, lens, keep, extra)
    lanes.rebuild(keep, extra)
    assert lanes.lens == expected_lens and lanes.width == max(expected_lens) == cache.get_seq_length()
    new = [(torch.randn(len(expected_lens), H, 1, D, generator=g), torch.randn(len(expected_lens), H, 1, D, generator=g))
           for _ in range(layers)]
    for i, (k, v) in enumerate(new):  # what the model's next forward does, layer by layer
        got = cache.update(k, v, i)
        for which in range(2):
            assert torch.equal(got[which], torch.cat([expected[i][which], new[i][which]], dim=-2))
    lanes.appended()
    assert getattr(lanes, "plan", None) is None and lanes.lens == [n + 1 for n in expected_lens]


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_the_step_mask_is_the_mask_of_each_step(kind):
    cache = DynamicCache()
    cache.update(torch.zeros(3, 1, 6, 2), torch.zeros(3, 1, 6, 2), 0)
    lanes = CACHES[kind](cache, [6, 2, 4])
    for step in range(40):  # past the mask's spare columns
        width = lanes.width
        expected = torch.zeros(3, width + 1)
        for row, n in enumerate(lanes.lens):
            expected[row, : width - n] = torch.finfo(torch.float32).min
        assert torch.equal(lanes.step_mask(torch.float32)[:, 0, 0], expected)
        cache.update(torch.zeros(3, 1, 1, 2), torch.zeros(3, 1, 1, 2), 0)
        lanes.appended()
        if step == 20:
            lanes.rebuild([2, 0, 0], [])
    lanes.rebuild([1], [])
    assert lanes.step_mask(torch.float32) is None  # one row: no padding, sdpa's unmasked path


def test_the_lazy_cache_appends_in_place_and_holds_the_plain_caches_values_step_after_step():
    """150 steps with rebuilds (a piece read between them settles one at once) against the plain
    cache's concatenations: the same tensors every step, and a new buffer only at a rebuild or
    when the spare columns run out."""
    g = torch.Generator().manual_seed(1)
    N, H, W, D, layers = 4, 2, 5, 3, 2
    start = [(torch.randn(N, H, W, D, generator=g), torch.randn(N, H, W, D, generator=g)) for _ in range(layers)]
    caches, lanes = {}, {}
    for kind, Cache in CACHES.items():
        caches[kind] = DynamicCache()
        for i, (k, v) in enumerate(start):
            caches[kind].update(k.clone(), v.clone(), i)
        lanes[kind] = Cache(caches[kind], [5, 3, 5, 4])
    lazy_layer = caches["lazy"].layers[0]
    new_buffers = 0
    for step in range(150):
        if step in (30, 100):  # drop a row, duplicate one, join two of them as a new row
            for kind in CACHES:
                joined = join([lanes[kind].piece(0, 0, 2), lanes[kind].piece(1, 0, lanes[kind].lens[1])])
                lanes[kind].rebuild([2, 1, 1], [joined])
        if step == 60:  # read a piece after a rebuild: the lazy cache applies it now, before any step
            for kind in CACHES:
                lanes[kind].rebuild([0, 1, 2], [])
                assert lanes[kind].piece(2, 0, 3)[0][0].shape == (H, 3, D)
        rows = len(lanes["plain"].lens)
        new = [(torch.randn(rows, H, 1, D, generator=g), torch.randn(rows, H, 1, D, generator=g)) for _ in range(layers)]
        buffer = lazy_layer.key_buffer
        for i, (k, v) in enumerate(new):
            plain, lazy = caches["plain"].update(k, v, i), caches["lazy"].update(k, v, i)
            assert torch.equal(plain[0], lazy[0]) and torch.equal(plain[1], lazy[1])
        new_buffers += lazy_layer.key_buffer is not buffer
        for kind in CACHES:
            lanes[kind].appended()
        assert lanes["lazy"].lens == lanes["plain"].lens and lanes["lazy"].width == lanes["plain"].width
    # 3 rebuilds (one of them settled at the piece) and ~150 / SPARE_COLUMNS grows, not 150 copies
    assert new_buffers <= 3 + 150 // SPARE_COLUMNS + 1
    assert lanes["lazy"].nbytes() >= lanes["plain"].nbytes()  # the spare columns are held too


def test_the_lazy_caches_spare_columns_stop_at_the_widest_a_row_can_grow():
    """Given the widest a row can grow, the buffers never hold more columns than that: the cache's
    peak is the concatenation's (bench/memory.py plans it so)."""
    g = torch.Generator().manual_seed(2)
    N, H, W, D, most = 3, 2, 6, 4, 20
    cache = DynamicCache()
    cache.update(torch.randn(N, H, W, D, generator=g), torch.randn(N, H, W, D, generator=g), 0)
    lanes = LazyLaneCache(cache, [6, 6, 4], most_columns=most)
    for step in range(most - W):
        if step == 3:
            lanes.rebuild([0, 2], [])
        rows = len(lanes.lens)
        keys, _ = cache.update(torch.randn(rows, H, 1, D, generator=g), torch.randn(rows, H, 1, D, generator=g), 0)
        lanes.appended()
        assert keys.shape[-2] == W + step + 1 <= cache.layers[0].key_buffer.shape[-2] <= most
    assert cache.layers[0].key_buffer.shape[-2] == most


def test_keys_set_from_outside_the_lazy_layer_become_its_buffers():
    """DynamicLayer's own methods (here `reorder_cache`) replace a layer's keys and values: the
    next step appends to those, as the plain cache's concatenation does, not to the old buffer."""
    g = torch.Generator().manual_seed(3)
    caches, lanes = {}, []  # the lane caches held, as the sampler holds its own (a lazy layer's owner is a weak reference)
    for kind, Cache in CACHES.items():
        caches[kind] = DynamicCache()
        caches[kind].update(torch.randn(3, 2, 4, 5, generator=torch.Generator().manual_seed(4)),
                            torch.randn(3, 2, 4, 5, generator=torch.Generator().manual_seed(5)), 0)
        lanes.append(Cache(caches[kind], [4, 4, 4]))
    for step in range(3):
        new = torch.randn(3, 2, 1, 5, generator=g), torch.randn(3, 2, 1, 5, generator=g)
        if step == 1:
            for cache in caches.values():
                cache.layers[0].reorder_cache(torch.tensor([2, 0, 1]))
        plain, lazy = (caches[kind].update(*new, 0) for kind in ("plain", "lazy"))
        assert torch.equal(plain[0], lazy[0]) and torch.equal(plain[1], lazy[1])


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_the_step_masks_rows_are_aligned_for_cudas_memory_efficient_kernel(kind):
    """Every stride of a step mask but the last is a multiple of MASK_ALIGNMENT (8 columns): CUDA's
    memory-efficient attention kernel takes such a mask as it is, and copies any other into a padded
    one. Both masks of a sliding window too, across spare columns running out and rebuilds."""
    from nanopar.kvcache import MASK_ALIGNMENT

    cache = DynamicCache()
    cache.update(torch.zeros(3, 1, 5, 2), torch.zeros(3, 1, 5, 2), 0)
    lanes = CACHES[kind](cache, [5, 2, 3])
    for step in range(30):
        for window in (None, 4):
            masks = lanes.step_mask(torch.float32, window)
            for mask in masks.values() if window else [masks]:
                assert mask.shape == (3, 1, 1, lanes.width + 1) and mask.stride()[-1] == 1
                assert all(stride % MASK_ALIGNMENT == 0 for stride in mask.stride()[:-1]), mask.stride()
        cache.update(torch.zeros(3, 1, 1, 2), torch.zeros(3, 1, 1, 2), 0)
        lanes.appended()
        if step == 10:
            lanes.rebuild([2, 0, 1], [])
