"""bench/kv_append.py on a random tiny model: both caches sample the same tokens, each call is timed."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/kv_append.py` has it

import kv_append as bench  # noqa: E402


def test_the_benchmark_times_both_caches_on_the_same_tokens():
    report = bench.main(["--quick", "--model", "tiny:qwen2", "--max-new-tokens", "70"])  # past the spare columns
    assert set(report["best"]) == set(bench.CACHES) and all(s > 0 for s in report["best"].values())
    assert report["ratio"] > 0
