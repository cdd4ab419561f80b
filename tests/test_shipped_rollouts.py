"""The toy's shipped rollouts (nanopar/toy/rollouts.jsonl): the file its manifest names, records
that read again to the structure they saved, blocks in them, and a re-scoring that reports what
GRPO would see of a reward, fast, right after install."""

import hashlib
import re
import time
from fnmatch import fnmatch
from pathlib import Path

import eval as eval_script
from nanopar.data import read_jsonl
from nanopar.evaluation import record_trace

TOY = Path(__file__).resolve().parent.parent / "nanopar" / "toy"
ROLLOUTS, MANIFEST = TOY / "rollouts.jsonl", TOY / "rollouts.md"


def structure(trace) -> dict:
    """A trace as `rollouts.rollout_record` saves it."""
    return {"main": [[m.start, m.end] for m in trace.main],
            "blocks": [{"open": b.open, "close": b.close, "paths": [[p.start, p.end] for p in b.paths],
                        "summary": None if b.summary is None else [b.summary.start, b.summary.end], "valid": b.valid}
                       for b in trace.blocks],
            "stray": trace.stray, "truncated": trace.truncated}


def test_the_file_is_the_one_its_manifest_names_and_installs_with_the_package():
    stated = re.search(r"^sha256: ([0-9a-f]{64})$", MANIFEST.read_text(), re.M)[1]
    assert hashlib.sha256(ROLLOUTS.read_bytes()).hexdigest() == stated
    assert eval_script.SHIPPED_ROLLOUTS["toy:rollouts"] == ROLLOUTS
    pyproject = (TOY.parent.parent / "pyproject.toml").read_text()
    patterns = re.findall(r'"([^"]+)"', re.search(r'^"nanopar.toy" = \[(.*)\]$', pyproject, re.M)[1])
    assert all(any(fnmatch(name, p) for p in patterns) for name in ("rollouts.jsonl", "rollouts.md"))


def test_every_record_reads_again_to_its_saved_structure_and_blocks_are_there():
    records = read_jsonl(ROLLOUTS)
    traces = [record_trace(r, f"rollouts.jsonl:{i}") for i, r in enumerate(records, 1)]
    assert [structure(t) for t in traces] == [r["structure"] for r in records]
    valid = sum(b.valid for t in traces for b in t.blocks)
    assert valid >= 50 and sum(r["has_parallel"] for r in records) >= 25  # enough blocks to score a block reward on
    assert any(t.stray for t in traces) and any(t.truncated for t in traces)  # and broken ones
    sizes = {}
    for r in records:
        sizes[(r["source"], r["id"])] = sizes.get((r["source"], r["id"]), 0) + 1
    assert set(sizes.values()) == {4}  # groups of 4: a no-gradient share to report


def test_the_readmes_first_reward_command_reports_the_no_gradient_share_in_seconds(capsys):
    started = time.perf_counter()
    reports = eval_script.main(["--rescore", "toy:rollouts", "--reward", "parallel"])
    seconds = time.perf_counter() - started
    overall = reports["all"]
    assert overall["count"] == 256 and overall["groups"] == 64
    assert 0 < overall["no_gradient"] < 1 and 0 < overall["agreement"] <= 1
    assert sum(overall["histogram"].values()) == 256
    out = capsys.readouterr().out
    assert "no gradient (reward)" in out and "reward distribution" in out
    assert seconds < 30, f"{seconds:.1f} s"
