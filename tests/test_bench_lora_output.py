"""bench/lora_output.py on a random tiny model: the 2-D output and the 2-D view read the same
log-probs (asserted inside) and gradients, each side timed, and the library's forward is put back."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/lora_output.py` has it

import lora_output as bench  # noqa: E402
from nanopar import lora_dtype  # noqa: E402


def test_the_benchmark_times_both_sides_and_puts_the_library_back():
    library = lora_dtype.BaseDtypeLora.forward
    report = bench.main(["--quick", "--model", "tiny:qwen2", "--dtype", "bfloat16"])
    (row,) = report["rows"]
    assert row["output"] > 0 and row["view"] > 0
    assert row["gradient_cosine"] > 0.999  # bfloat16 sums in another order, the same gradient
    assert lora_dtype.BaseDtypeLora.forward is library
