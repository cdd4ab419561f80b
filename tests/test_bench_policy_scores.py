"""bench/policy_scores.py on tiny sizes: it runs, checks that both forms agree, and reports a ratio."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/policy_scores.py` has it

import policy_scores as bench  # noqa: E402


def test_the_benchmark_times_both_forms_on_both_dtypes():
    rows = bench.main(["--rows", "4", "--vocab", "64", "--real-vocab", "60", "--repeats", "1"])
    assert [r["dtype"] for r in rows] == ["bfloat16", "float32"]
    assert all(r["plain_ms"] > 0 and r["policy_scores_ms"] > 0 and r["ratio"] > 0 for r in rows)
