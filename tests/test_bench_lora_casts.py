"""bench/lora_casts.py on a random tiny model: kept casts and casts made at every call sample the
same tokens (asserted inside), each side timed."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/lora_casts.py` has it

import lora_casts as bench  # noqa: E402
from nanopar import lora_dtype  # noqa: E402


def test_the_benchmark_times_both_sides_and_puts_the_library_back():
    library = lora_dtype.casts_kept
    report = bench.main(["--quick", "--model", "tiny:qwen2"])
    (row,) = report["rows"]
    assert row["lanes"] == 2 and row["kept"] > 0 and row["every_call"] > 0
    assert lora_dtype.casts_kept is library
