"""bench/row_skip.py on a random tiny model: it reads only the rows with a signal, every row on its
other side, and both sides end at the same gradient."""

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/row_skip.py` has it

import row_skip as bench  # noqa: E402


def test_advantages_hold_a_signal_in_the_first_groups_only():
    advantages = bench.advantages_with_signal(groups=3, group_size=4, with_signal=1).view(3, 4)
    assert advantages[0].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)  # (r - mean) / (std + eps)
    assert advantages[1:].eq(0).all()


def test_the_benchmark_skips_the_rows_of_no_signal_and_keeps_the_gradient():
    report = bench.main(["--quick", "--model", "tiny:qwen2", "--max-new-tokens", "4"])
    by_share = {row["with_signal"]: row for row in report["rows"]}
    assert sorted(by_share) == [1, 2]
    assert by_share[2]["read_rows"] == by_share[2]["read_rows_all"] == 1.0
    assert by_share[1]["read_rows"] == 0.5 and by_share[1]["read_rows_all"] == 1.0
    for row in report["rows"]:  # the 1e-6 rows add ~1e-6 of the gradient's norm (one micro-batch either way here)
        assert row["grad_norm_ratio"] == pytest.approx(1.0, abs=1e-4)
        assert row["skip_seconds"] > 0 and row["read_all_seconds"] > 0
