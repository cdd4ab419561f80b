"""bench/head_chunk.py on tiny sizes: every chunk size reads the same log-probs and gradient as the
plain log_softmax of the full logits, and the benchmark reports a row per chunk size."""

import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/head_chunk.py` has it

import head_chunk as bench  # noqa: E402


def test_each_chunk_size_reads_what_the_full_logits_give():
    config = bench.HeadChunkConfig(positions=13, hidden=8, vocab=40, real_vocab=37, temperature=0.7)
    torch.manual_seed(0)
    head = torch.nn.Linear(config.hidden, config.vocab, bias=False, dtype=torch.float64).requires_grad_(False)
    hidden = torch.randn(config.positions, config.hidden, dtype=torch.float64, requires_grad=True)  # [n, d]
    targets = torch.randint(0, config.real_vocab, (config.positions,))
    logits = head(hidden)[:, : config.real_vocab] / config.temperature  # [n, V'] the plain read, by hand
    expected = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    (grad,) = torch.autograd.grad(expected.sum(), hidden)
    for chunk in (1, 4, 13, 50):
        chosen = bench.read_once(head, hidden, targets, config, chunk)
        torch.testing.assert_close(chosen, expected)
        torch.testing.assert_close(hidden.grad, grad, rtol=1e-5, atol=1e-6)


def test_the_benchmark_reports_every_chunk_size():
    rows = bench.main(["--positions", "16", "--hidden", "8", "--vocab", "64", "--real-vocab", "60",
                       "--chunks", "8", "3", "--repeats", "1"])
    assert [r["chunk"] for r in rows[:2]] == [8, 3] and all(r["seconds"] > 0 for r in rows[:2])
    assert rows[2]["chunk"] == 8 and rows[2]["fresh"] > 0 and rows[2]["reused"] > 0  # the buffers' race, checked equal
    assert rows[3]["slopes"] > 0 and rows[3]["recompute"] > 0 and rows[3]["difference"] < 2e-2  # the roads' race, bf16


def test_both_roads_give_the_hand_written_gradient():
    """The slopes (this frozen head's road) and the recompute (any other head's) against autograd
    through the full logits in float64 (the read keeps its scores in float32)."""
    from nanopar import head as head_module
    config = bench.HeadChunkConfig(positions=13, hidden=8, vocab=40, real_vocab=37, temperature=0.7)
    torch.manual_seed(0)
    head = torch.nn.Linear(config.hidden, config.vocab, bias=False, dtype=torch.float64).requires_grad_(False)
    hidden = torch.randn(config.positions, config.hidden, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, config.real_vocab, (config.positions,))
    expected = torch.log_softmax(head(hidden)[:, : config.real_vocab] / config.temperature, -1)
    (grad,) = torch.autograd.grad((expected.gather(-1, targets[:, None]).squeeze(-1) * torch.arange(13)).sum(), hidden)
    linear_head, slopes = head_module._linear_head, []

    def spied(*args):  # the slopes road, counted
        linear = linear_head(*args)
        real = linear.slopes
        linear.slopes = lambda *a, **k: slopes.append(1) or real(*a, **k)
        return linear

    for road in (spied, lambda *args: None):
        head_module._linear_head = road
        try:
            hidden.grad = None
            chosen, _ = head_module.head_logprobs(hidden, targets, head, config.temperature, config.real_vocab, chunk=4)
            (chosen * torch.arange(13)).sum().backward()
        finally:
            head_module._linear_head = linear_head
        torch.testing.assert_close(hidden.grad, grad, rtol=1e-5, atol=1e-6)  # float32 scores, as the read keeps them
        assert len(slopes) == 4  # 13 positions in chunks of 4: the slopes road, then the recompute's (none)


def test_reused_buffers_read_what_fresh_tensors_read():
    """The chunked read writes every chunk into buffers made at the first: the log-probs, the entropy
    and the gradient are bit for bit those of a fresh tensor per chunk, in bf16 at T = 0.7 and in
    float32 at T = 1, with a last chunk shorter than the others."""
    from nanopar import head as head_module
    from nanopar.head import head_logprobs
    for dtype, temperature in ((torch.bfloat16, 0.7), (torch.float32, 1.0), (torch.float32, 0.5)):
        torch.manual_seed(0)
        head = torch.nn.Linear(8, 40, bias=False, dtype=dtype).requires_grad_(False)
        hidden = torch.randn(13, 8, dtype=dtype, requires_grad=True)
        targets = torch.randint(0, 37, (13,))
        read = {}
        for kind in (bench.FreshBuffers, head_module._ChunkBuffers):
            saved, head_module._ChunkBuffers = head_module._ChunkBuffers, kind
            try:
                hidden.grad = None
                chosen, entropy = head_logprobs(hidden, targets, head, temperature, 37, with_entropy=True, chunk=4)
                (chosen * torch.arange(13)).sum().backward()
            finally:
                head_module._ChunkBuffers = saved
            read[kind] = (chosen.detach(), entropy, hidden.grad.clone())
        fresh, reused = read.values()
        assert all(torch.equal(a, b) for a, b in zip(fresh, reused)), (dtype, temperature)
