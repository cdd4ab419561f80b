"""Tests of nanopar.toy.wrong_answers: each ending read off hand-written responses."""

import json

import pytest

from nanopar.toy.wrong_answers import ending, endings, main, slip_kind

EXTRA = {"numbers": [3, 7, 12], "target": 33}  # right: (7*3)+12


def record(response: str, correct: bool = False, finish: str = "eos", extracted: str | None = "x") -> dict:
    return {"response": response, "correct": correct, "finish": finish, "extracted": extracted, "extra": EXTRA}


CASES = [
    (record("7*3=21,21+12=33vs33yes so (7*3)+12\nFinal Answer: (7*3)+12", correct=True), "correct"),
    (record("12-7=5,5*3=15vs33no\n12-7=5", finish="length", extracted=None), "truncated"),
    (record("12-7=5,5*3=15vs33no\nFinal Answer:", extracted=None), "no answer"),
    (record("12-7=5,5*3=15vs33yes so (12-7)*3\nFinal Answer: (12-7)*3"), "slip not checked: verdict"),
    (record("12-7=5,5*3=33vs33yes so (12-7)*3\nFinal Answer: (12-7)*3"), "slip not checked: arithmetic"),
    (record("12-7=5,5*3vs33yes so (12-7)*3\nFinal Answer: (12-7)*3"), "slip not checked: other"),
    (record("7*3=21,21+12=33vs33yes so (7*3)+12\nFinal Answer: (7*3)-12"), "attempt right, answer miscopied"),
    (record("<Parallel><Path>12-7=5,5*3=15vs33yes so (12-7)*3</Path></Parallel><Summary>(12-7)*3</Summary>\n"
            "Final Answer: (12-7)*3"), "block: summary wrong"),
    (record("<Parallel><Path>7*3=21,21+12=33vs33yes so (7*3)+12</Path></Parallel><Summary>(7*3)+12</Summary>\n"
            "Final Answer: (7*3)+21"), "block: summary right, answer miscopied"),
    (record("<guideline><plan>1:7*3</plan></guideline><step>1:7*3=21,21+12=33vs33yes so (7*3)+12</step>"
            "<takeaway>(7*3)+12</takeaway>\nFinal Answer: 12+(3*7)"), "block: summary right, answer miscopied"),
    (record("I give up\nFinal Answer: 33"), "other"),
]


@pytest.mark.parametrize("rec, expected", CASES)
def test_each_ending(rec, expected):
    assert ending(rec) == expected


def test_slip_kind_reads_each_step():
    assert slip_kind("7*3=21,21+12=33") == "verdict"
    assert slip_kind("7*3=24,24+9=33") == "arithmetic"
    assert slip_kind("7*3=21,21+") == "other"


def test_main_prints_one_column_per_file(tmp_path, capsys):
    folder = tmp_path / "run-a"
    folder.mkdir()
    (folder / "samples.jsonl").write_text("\n".join(json.dumps(r) for r, _ in CASES) + "\n")
    main([str(folder / "samples.jsonl")])
    out = capsys.readouterr().out
    assert "run-a" in out and str(len(CASES)) in out
    assert endings([r for r, _ in CASES])["block: summary right, answer miscopied"] == 2
    with pytest.raises(SystemExit, match="usage"):
        main([])
