"""Problems, the unit of data every stage reads, and SFT traces, from four kinds of source:

    load_problems("aime24")                       # a benchmark shipped in nanopar/benchmarks/
    load_problems("data/my_set.jsonl")             # JSON Lines (or .txt: a question a line)
    load_problems("openai/gsm8k:main", split="test")   # a hub data set (owner/name[:config])
    load_problems("toy:easy")                     # a registered source (here the toy world)
    load_problems("data/my_set.jsonl[-100:]")      # any of them sliced (Python's syntax): the last 100
    load_problems("toy:easy+toy:hard")            # a mix: the sets' problems interleaved, one of each in turn
    load_traces("toy:parallel") / load_traces("traces.jsonl")   # question/answer/response records
    load_traces("parallel-gsm8k")                 # a shipped set of traces (Parallel-R1's cold start)

Sources are the plug-in point for synthetic worlds: `SOURCES` maps a spec prefix to a `Source`
(problems, teacher traces, optionally a model, e.g. "toy:model"), or to a "module:attribute"
imported on first use, so nothing general imports the toy. `register_source("maze", Source(...))`
makes "maze:small" work wherever a spec does. Records map by field (question = "question" /
"problem" / "prompt", answer = "answer", or as named; id = "id" / "unique_id" or "<name>:<line>", the rest into
`Problem.extra`); bad input is never skipped but a one-line `NanoparError` that says where.
`read_jsonl` / `write_jsonl` (atomic) are the plain JSON Lines helpers, `read_json` / `write_json`
(atomic) the JSON ones; nanopar/benchmarks/README.md
lists the shipped sets, their sources and licenses.
Not here: prompts (prompts.py), grading answers (grading.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import re
import secrets
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from . import NanoparError
from .tags import PARALLEL_R1


@dataclass
class Problem:
    id: str  # stable id: "<source>:<line>" or the data set's own id
    question: str  # the problem statement shown to the model
    answer: str  # the gold answer as the data set gives it (GSM8K: solution ending "#### 42")
    source: str = ""  # where it came from: a file path, a hub name, "toy-easy", ...
    extra: dict = field(default_factory=dict)  # any other fields of the record (e.g. a teacher trace)


@dataclass(frozen=True)
class Source:
    """A plug-in world behind a spec prefix: what "<prefix>:..." names in `load_problems`,
    `load_traces` and `model.load_model`. Each function gets the whole spec and raises a
    NanoparError naming the valid ones for a spec it does not know."""

    problems: Callable[[str], list[Problem]]  # "toy:easy" -> problems
    traces: Callable[[str, Any], list[dict]] | None = None  # ("toy:parallel", tag schema) -> SFT records in its tags
    model: Callable[[str, Any, str], tuple] | None = None  # (name, dtype, attn_implementation) -> (model, tokenizer)
    model_names: tuple[str, ...] = ()  # the names `model` builds ("toy:model"), listed in errors
    instructions: dict[str, str] | None = None  # its own text for an instruction name ("parallel" -> ...)
    bases: dict[str, str] | None = None  # recipe -> the traces its base model is pretrained on (--pretrain-data auto)
    shipped_bases: dict[str, str] | None = None  # recipe -> a folder holding that base, pretrained (--pretrained-base auto)
    heldout_sets: dict[str, str] | None = None  # training set -> its held-out set ("toy:easy" -> "toy:easy:heldout")


# spec prefix -> Source, or "module:attribute" of one, imported on first use (then stored here)
SOURCES: dict[str, Source | str] = {"toy": "nanopar.toy:SOURCE"}


def register_source(prefix: str, source: Source | str) -> None:
    """Serve every spec "<prefix>:..." from `source`, or from the Source a "module:attribute"
    string names (imported on first use); an earlier source of that prefix is replaced."""
    if not prefix or ":" in prefix or not isinstance(source, (Source, str)):
        raise NanoparError(f"register_source takes a prefix without ':' and a Source, not {prefix!r}, {source!r}")
    SOURCES[prefix] = source


def source_for(spec: str) -> Source | None:
    """The registered source of a spec's prefix ("toy:easy" -> the toy world's), else None; of a
    mix ("toy:easy+toy:hard"), the one source of all its parts, else None."""
    parts = mix_parts(spec)
    if len(parts) > 1:
        sources = [source_for(part) for part in parts]
        return sources[0] if all(s is sources[0] for s in sources) else None
    prefix, colon, _ = spec.partition(":")
    if not colon or prefix not in SOURCES:
        return None
    if isinstance(SOURCES[prefix], str):
        SOURCES[prefix] = plugin_named(SOURCES[prefix], Source)
    return SOURCES[prefix]


def plugin_named(entry: str, kind: type | None = None):
    """The object a "module:attribute" string names, imported now; one of `kind` (a type) if given.

    >>> plugin_named("nanopar.data:Problem") is Problem
    True
    """
    module, _, attribute = entry.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise NanoparError(f"cannot load the plug-in {entry!r}: {error}") from None
    if kind is not None and not isinstance(found, kind):
        raise NanoparError(f"the plug-in {entry!r} is a {type(found).__name__}, not a {kind.__name__}")
    return found


BENCHMARK_DIR = Path(__file__).with_name("benchmarks")

# name -> (file in nanopar/benchmarks/, or a fixed slice of one: "file.jsonl[:-41]", question field, answer field)
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "gsm8k": ("gsm8k_test.jsonl", "question", "answer"),  # answer: worked solution ending "#### N"
    "gsm8k_train": ("gsm8k_train.jsonl", "question", "answer"),  # same form; stage-1 RL / cold start
    "math500": ("math500.jsonl", "problem", "answer"),  # answer: LaTeX
    "aime24": ("aime24.jsonl", "problem", "answer"),  # answer: integer (as text)
    "aime25": ("aime25.jsonl", "problem", "answer"),
    "amc23": ("amc23.jsonl", "problem", "answer"),
    "dapo": ("dapo_math_17k.jsonl", "problem", "answer"),  # answer: integer; Parallel-R1's stage-2 RL set
    # Parallel-R1's cold-start traces (Parallel-GSM8K, 341): the first 300 train, the last 41 are held out;
    # answer: integer (as text); also traces (`load_traces`): question, answer, response
    "parallel-gsm8k": ("parallel_gsm8k_sft.jsonl[:-41]", "question", "answer"),
    "parallel-gsm8k:heldout": ("parallel_gsm8k_sft.jsonl[-41:]", "question", "answer"),
}

# a shipped training set -> its shipped test set: the held-out data of a run that trains on it
TEST_SETS: dict[str, str] = {"gsm8k_train": "gsm8k", "parallel-gsm8k": "parallel-gsm8k:heldout"}


def heldout_set_of(spec: str) -> str | None:
    """The held-out set that goes with a training set: a registered source's own (`Source.heldout_sets`)
    or a shipped one (`TEST_SETS`); None when there is none (the caller holds out a slice)."""
    source = source_for(spec)
    if source is not None:
        return (source.heldout_sets or {}).get(spec)
    return TEST_SETS.get(spec)

MIX = "+"  # "a+b": a mix of data sets (`mix_parts`)
SLICE = re.compile(r"^(.+)\[(-?\d+)?:(-?\d+)?\]$")  # "spec[start:stop]": a slice of a data set's problems
QUESTION_FIELDS = ("question", "problem", "prompt")  # tried in this order when none is named
ANSWER_FIELD = "answer"
ID_FIELDS = ("id", "unique_id")  # a record's own id, when it has one
HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+(:[\w.-]+)?$")  # owner/name or owner/name:config
FILE_SUFFIXES = (".jsonl", ".txt")


def load_problems(
    spec: str,
    question_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    split: str = "train",
) -> list[Problem]:
    """Problems from a registered source ("toy:easy"), a shipped benchmark name, a .jsonl / .txt
    file, or a hub data set; any of them sliced by a suffix "[start:stop]" (e.g. "[-100:]"); or a
    mix of them, "a+b" (`mix_parts`): their problems interleaved one by one, a, b, a, b, ..., the
    longer set's rest after the shorter ends, so that any first N problems hold each set alike.

    `question_field` / `answer_field` name the record fields (defaults above; `answer_field=""`:
    records without answers, e.g. prompts to sample); `limit` keeps the first N problems; `split`
    is used for hub data sets only (files have no splits).

    >>> [(p.id, p.answer) for p in load_problems("aime24", limit=2)]
    [('aime24:1', '204'), ('aime24:2', '113')]
    >>> [p.id for p in load_problems("aime24[-2:]")]
    ['aime24:29', 'aime24:30']
    """
    if limit is not None and limit < 0:
        raise NanoparError(f"limit must be >= 0, not {limit}")
    parts = mix_parts(spec)
    if len(parts) > 1:
        sets = [load_problems(part, question_field, answer_field, None, split) for part in parts]
        mixed = [p for turn in itertools.zip_longest(*sets) for p in turn if p is not None]
        ids = Counter(p.id for p in mixed)
        if (twice := next((i for i, n in ids.items() if n > 1), None)) is not None:
            raise NanoparError(f"{spec}: the problem {twice} is in two parts of the mix")
        return mixed[:limit]
    name, part = split_slice(spec)
    if part is not None:  # the whole set, then the slice, then the limit
        return load_problems(name, question_field, answer_field, None, split)[part][:limit]
    source = source_for(spec)
    if source is not None:
        return source.problems(spec)[:limit]
    if spec in BENCHMARKS:
        _, default_question, default_answer = BENCHMARKS[spec]
        path, records = _shipped(spec)
        answer_field = default_answer if answer_field is None else answer_field
        return _to_problems(records, _at(path), spec, spec, question_field or default_question, answer_field, limit)
    path = Path(spec)
    if path.is_file():
        if path.suffix == ".txt":
            if question_field or answer_field:
                raise NanoparError(f"{path}: a .txt file holds questions only; field names apply to .jsonl")
            lines = ((n, {"question": line}) for n, line in _numbered_lines(path) if line.strip())
            return _to_problems(lines, _at(path), str(path), path.stem, "question", "", limit)
        if path.suffix != ".jsonl":
            raise NanoparError(f"{path}: unsupported file type; use .jsonl (JSON Lines) or .txt (a question a line)")
        records = _numbered_jsonl(path)
        return _to_problems(records, _at(path), str(path), path.stem, question_field, answer_field, limit)
    if HUB_NAME.match(spec) and not spec.endswith(FILE_SUFFIXES) and not path.exists():
        return _load_hub(spec, question_field, answer_field, limit, split)
    raise NanoparError(f"benchmark or file not found: {spec} (known benchmarks: {', '.join(BENCHMARKS)})")


def load_traces(spec: str | Path, schema=None) -> list[dict]:
    """SFT traces: a registered source's ("toy:parallel", written in `schema`'s tags, Parallel-R1's
    when None), or every record of a shipped set ("parallel-gsm8k") or a .jsonl file, as written:
    whether the traces of a run's parallel SFT are parallel in its schema is
    `RunInputs.check_traces`'s to judge.

    A record needs string fields question and response (answer and id are optional); a record
    without them, or a missing file, is a one-line NanoparError.

    >>> [len(load_traces(name)) for name in ("parallel-gsm8k", "parallel-gsm8k:heldout")]
    [300, 41]
    """
    source = source_for(spec) if isinstance(spec, str) else None
    if source is not None:
        if source.traces is None:
            raise NanoparError(f"{spec}: the source {spec.partition(':')[0]!r} has no traces")
        return source.traces(spec, schema or PARALLEL_R1)
    if isinstance(spec, str) and spec in BENCHMARKS:
        path, numbered = _shipped(spec)
    else:
        path = Path(spec)
        if not path.is_file():
            raise NanoparError(f"traces not found: {path}")
        numbered = _numbered_jsonl(path)
    records = []
    for number, record in numbered:
        if not isinstance(record.get("question"), str) or not isinstance(record.get("response"), str):
            raise NanoparError(f"{path}:{number}: a trace needs string fields question and response")
        records.append(record)
    return records


def read_jsonl(path: str | Path) -> list[dict]:
    """Every record of a JSON Lines file (blank lines allowed); a bad line is a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise NanoparError(f"file not found: {path}")
    return [record for _, record in _numbered_jsonl(path)]


def write_jsonl(path: str | Path, records: Iterable[dict]) -> Path:
    """Write records (dicts or dataclass instances) as JSON Lines, atomically.

    The lines go to a temporary file in the same folder, which then replaces `path` in one
    step (`os.replace`): a reader never sees half a file, and a failure part-way (say a record
    that is not JSON-serialisable) leaves `path` as it was. Parent folders are created.
    """
    def lines(out) -> None:
        for number, record in enumerate(records, 1):
            if dataclasses.is_dataclass(record) and not isinstance(record, type):
                record = dataclasses.asdict(record)
            if not isinstance(record, dict):  # read_jsonl would refuse the line
                raise TypeError(f"{path}: record {number} is a {type(record).__name__}, not a dict")
            try:
                line = json.dumps(record, ensure_ascii=False)
            except (TypeError, ValueError) as error:
                raise TypeError(f"{path}: record {number} is not JSON-serialisable ({error})") from error
            out.write(line + "\n")

    return _write_atomically(Path(path), lines)


def write_json(path: str | Path, value, indent: int = 1) -> Path:
    """Write one JSON document (indented), atomically as `write_jsonl` writes its lines."""
    return _write_atomically(Path(path), lambda out: out.write(json.dumps(value, indent=indent) + "\n"))


def read_json(path: str | Path) -> dict:
    """A JSON object written by `write_json`; a file that is not one is a one-line error naming it."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise NanoparError(f"{path}: not JSON ({error}); move it away to write it again") from None
    if not isinstance(value, dict):
        raise NanoparError(f"{path}: a JSON {type(value).__name__}, not an object; move it away to write it again")
    return value


def _write_atomically(path: Path, write: Callable) -> Path:
    """`write(file)` into a temporary file beside `path`, which then replaces it in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # same folder: same file system
    try:
        with open(temp, "x", encoding="utf-8") as out:  # "x": never clobber; mode follows the umask
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    finally:
        if temp.exists():  # only after a failure
            temp.unlink()
    return path


# --------------------------------------------------------------------------- internals


def _shipped(name: str) -> tuple[Path, Iterable[tuple[int, dict]]]:
    """A shipped set's file and its (line number, record) pairs: only the fixed slice its
    `BENCHMARKS` entry names when it names one (line numbers stay the file's), else read lazily."""
    file, part = split_slice(BENCHMARKS[name][0])
    path = BENCHMARK_DIR / file
    if part is None:
        return path, _numbered_jsonl(path)
    return path, list(_numbered_jsonl(path))[part]


def mix_parts(spec: str) -> list[str]:
    """The data sets a mix names: "toy:easy+toy:hard" -> ["toy:easy", "toy:hard"]; any other spec
    (an existing file whose name holds "+" too) -> [spec]. An empty part is a one-line error.

    >>> mix_parts("toy:easy+toy:hard[:100]"), mix_parts("aime24")
    (['toy:easy', 'toy:hard[:100]'], ['aime24'])
    """
    if MIX not in spec or Path(spec).is_file():
        return [spec]
    parts = [part.strip() for part in spec.split(MIX)]
    if not all(parts):
        raise NanoparError(f"bad data mix {spec!r}: write data sets joined by '{MIX}', e.g. toy:easy+toy:hard")
    return parts


def split_slice(spec: str) -> tuple[str, slice | None]:
    """"name[start:stop]" -> ("name", slice(start, stop)); any other spec -> (spec, None)."""
    sliced = SLICE.match(spec)
    if not sliced:
        return spec, None
    start, stop = (int(bound) if bound else None for bound in sliced.group(2, 3))
    return sliced[1], slice(start, stop)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its newline), read lazily."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            yield number, line.rstrip("\n").rstrip("\r")


def _at(path: Path) -> Callable[[int], str]:
    """Where line N of a file is, for error messages: "path:N"."""
    return lambda number: f"{path}:{number}"


def _numbered_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for every non-blank line; raises on a line that is not a JSON object."""
    for number, line in _numbered_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise NanoparError(f"{path}:{number}: not valid JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(record, dict):
            raise NanoparError(f"{path}:{number}: not a JSON object (a {type(record).__name__})")
        yield number, record


def _to_problems(
    records: Iterable[tuple[int, dict]],
    where: Callable[[int], str],
    source: str,
    name: str,
    question_field: str | None,
    answer_field: str | None,
    limit: int | None,
) -> list[Problem]:
    """Map (line or row number, record) pairs to Problems; `where(number)` places errors."""
    answer_field = ANSWER_FIELD if answer_field is None else answer_field
    problems: list[Problem] = []
    seen: dict[str, str] = {}  # id -> where it was first seen
    for number, record in records:
        if limit is not None and len(problems) >= limit:
            break
        at = where(number)
        asked = question_field or next((f for f in QUESTION_FIELDS if f in record), None)
        if asked is None or asked not in record:
            wanted = question_field or "/".join(QUESTION_FIELDS)
            raise NanoparError(f"{at}: no {wanted} field (fields there: {_field_list(record)})")
        if answer_field and answer_field not in record:
            raise NanoparError(f"{at}: no {answer_field} field (fields there: {_field_list(record)})")
        id_field = next((f for f in ID_FIELDS if f in record), None)
        problem_id = _text(record[id_field], id_field, at) if id_field else f"{name}:{number}"
        if problem_id in seen:
            raise NanoparError(f"{at}: id {problem_id} repeats the id of {seen[problem_id]}")
        seen[problem_id] = at
        used = {asked, answer_field, id_field}
        problems.append(
            Problem(
                id=problem_id,
                question=_text(record[asked], asked, at),
                answer=_text(record[answer_field], answer_field, at) if answer_field else "",
                source=source,
                extra={k: v for k, v in record.items() if k not in used},
            )
        )
    return problems


def _text(value, field_name: str, at: str) -> str:
    """A field's value as text: strings as they are, numbers written out (AIME answers); else raise."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise NanoparError(f"{at}: field {field_name} is a {type(value).__name__}, not text")


def _field_list(record: dict) -> str:
    return ", ".join(record) if record else "none"


def _load_hub(spec: str, question_field, answer_field, limit, split) -> list[Problem]:
    """A hub data set "owner/name" or "owner/name:config", through the `datasets` library."""
    name, _, config = spec.partition(":")
    try:
        import datasets  # lazily: importing it takes seconds, and only hub data sets need it
    except ImportError:
        raise NanoparError(f"the hub data set {spec} needs the datasets package: pip install datasets") from None
    try:
        rows = datasets.load_dataset(name, config or None, split=split)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as error:
        # ConnectionError (offline), DatasetNotFoundError, an unknown split or config, ...
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise NanoparError(f"could not load the hub data set {spec} (split {split}): {reason}") from None
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))

    def where(number: int) -> str:
        return f"{spec} ({split} split) row {number}"

    source = f"{spec}[{split}]"
    return _to_problems(enumerate(rows, 1), where, source, spec, question_field, answer_field, limit)
