"""Where a toy response's answer went wrong, read from eval.py's saved samples.

    python -m nanopar.toy.wrong_answers runs/eval/samples.jsonl [more.jsonl ...]   # one column each

Each response gets one `ending`: correct; truncated; no answer; or, for a wrong answer, what wrote
it: the last line before "Final Answer:" is an attempt that said "yes so EXPR" (a *slip* when EXPR
misses: "verdict" when the steps are true and the value another, "arithmetic" when a step is false,
"other" for the rest; "miscopied" when EXPR is right and the answer line is not) or a block's
summary (wrong, or right and miscopied). The teacher's correction traces (teacher.py) write the
two commonest slips this finds in the toy base's answers.

Not here: grading itself (task.py), the evaluation's metrics (evaluation.py).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..data import Problem
from .task import FINAL, check_countdown

_CLAIM = re.compile(r"([^\n>]*)vs(\d+)yes so ([^\n<]*)$")  # an attempt's line that says it checks out
_SUMMARY = re.compile(r"<(?:Summary|takeaway)>([^<]*)</(?:Summary|takeaway)>$")  # a block's last words
_STEP = re.compile(r"(\d+)([-+*])(\d+)=(\d+)")


def slip_kind(steps: str) -> str:
    """"verdict" when every step "a op b=v" holds, "arithmetic" when one does not, "other" when a
    step cannot be read."""
    matches = [_STEP.fullmatch(step) for step in steps.split(",")]
    if not all(matches):
        return "other"
    true = all({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(v)
               for a, op, b, v in (m.groups() for m in matches))
    return "verdict" if true else "arithmetic"


def ending(record: dict) -> str:
    """One eval.py sample record's ending (see the module docstring)."""
    if record["correct"]:
        return "correct"
    if record["finish"] != "eos":
        return "truncated"
    if record["extracted"] is None:
        return "no answer"
    problem = Problem("", "", "", extra=record["extra"])  # what the toy's checker reads: numbers, target
    last = record["response"].rsplit(FINAL, 1)[0].rstrip("\n").split("\n")[-1]
    if summary := _SUMMARY.search(last):
        return "block: summary right, answer miscopied" if check_countdown(summary[1], problem) else "block: summary wrong"
    if claim := _CLAIM.search(last):
        if check_countdown(claim[3], problem):
            return "attempt right, answer miscopied"
        return f"slip not checked: {slip_kind(claim[1])}"
    return "other"


def endings(records: list[dict]) -> Counter:
    return Counter(ending(r) for r in records)


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit("usage: python -m nanopar.toy.wrong_answers SAMPLES.jsonl [more ...]")
    counts = {}
    for path in paths:
        with open(path) as f:
            counts[path] = endings([json.loads(line) for line in f if line.strip()])
    table = Table(title="how the responses end (share of all responses)")
    table.add_column("ending")
    for path in paths:  # eval.py's samples.jsonl is named by its folder
        table.add_column(Path(path).parent.name if Path(path).name == "samples.jsonl" else path, justify="right")
    kinds = sorted({k for c in counts.values() for k in c}, key=lambda k: -sum(c[k] for c in counts.values()))
    for kind in kinds:
        table.add_row(kind, *(f"{100 * counts[p][kind] / sum(counts[p].values()):.1f}%" for p in paths))
    table.add_row("responses", *(str(sum(counts[p].values())) for p in paths))
    Console().print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
