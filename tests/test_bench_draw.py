"""bench/draw.py on a small vocabulary: both draws take the same tokens and the table's errors are
measured against a float64 log-softmax."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/draw.py` has it

import draw as bench  # noqa: E402


def test_the_benchmark_times_both_draws_and_measures_their_error():
    rows = bench.main(["--lanes", "3", "5", "--vocab", "9000", "--real-vocab", "8990", "--repeats", "1"])  # two levels
    assert [r["lanes"] for r in rows] == [3, 5]
    for r in rows:
        assert r["same_tokens"] and r["plain_ms"] > 0 and r["in_place_ms"] > 0
        assert r["cdf_same_ids"] and r["cdf_one_ms"] > 0 and r["cdf_two_ms"] > 0
        assert 0 <= r["in_place_error"] < 1e-5 and 0 <= r["plain_error"] < 1e-4
