"""A GRPO stage's pool filtered by its starting model's own pass rate (--pool-samples): sampled once,
kept in the run folder, read again by a resumed run, refused in one line when it is not nanopar's.

Checked against independent computations: the kept problems against the grades saved with each
sampled response (accuracy's +1 / -1 read from `correct`), the stage's problems against the kept
ones, and a resumed run that must not sample the pool again.
"""

import json
import shutil
from collections import defaultdict

import pytest

import nanopar.pass_rate
import train
from nanopar import NanoparError
from nanopar.pass_rate import saved_pool

RUN = ["--skip", "sft,rl-hard", "--rl-easy-steps", "2", "--prompts-per-step", "2", "--group-size", "4",
       "--max-new-tokens", "64", "--max-path-tokens", "24", "--easy-reward", "accuracy", "--eval-problems", "0",
       "--pool-samples", "4", "--pool-problems", "12", "--save-rollouts", "--checkpoint-every", "1"]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_pool_keeps_what_the_start_solves_sometimes_and_a_resumed_run_reads_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train.main(["--out", str(out), *RUN])
    stage = out / "2-rl-easy"
    correct = defaultdict(list)
    for record in lines(stage / "pool_records.jsonl"):  # the toy base's responses, graded when sampled
        correct[record["id"]].append(record["correct"])
    assert len(correct) == 12 and all(len(c) == 4 for c in correct.values())
    sometimes = {problem for problem, c in correct.items() if 0 < sum(c) < 4}
    assert 0 < len(sometimes) < 12  # the premise: the base solves some problems always or never
    saved = json.loads((stage / "pool.json").read_text())["rewards"]
    assert {key.split("/", 1)[1] for key, rewards in saved.items() if len(set(rewards)) > 1} == sometimes
    trained = {r["id"] for r in lines(stage / "rollouts.jsonl")}
    assert trained <= sometimes and len(trained) == 4  # two steps of two problems, all from the kept ones
    pools = [r for r in lines(out / "metrics.jsonl") if r.get("event") == "pool"]
    assert len(pools) == 1 and pools[0]["problems"] == 12 and pools[0]["seconds"] > 0
    # resumed after step 1: the model is a checkpoint, so the pool is read, never sampled again
    shutil.rmtree(stage / "final")
    monkeypatch.setattr(nanopar.pass_rate, "evaluate", lambda *args, **kwargs: pytest.fail("sampled the pool again"))
    train.main(["--out", str(out), *RUN])
    assert [r["step"] for r in lines(stage / "rollouts.jsonl")] == [1] * 8 + [2] * 8  # cut at the checkpoint, step 2 again
    assert {r["id"] for r in lines(stage / "rollouts.jsonl")} == trained
    assert sum(r.get("event") == "pool" for r in lines(out / "metrics.jsonl")) == 1


def test_a_pool_made_otherwise_is_sampled_again_and_a_foreign_file_refused(tmp_path):
    (tmp_path / "pool.json").write_text(json.dumps({"how": {"samples": 4}, "rewards": {"gsm8k/1": [1.0, -1.0]}}))
    assert saved_pool(tmp_path, {"samples": 4}) == {"gsm8k/1": [1.0, -1.0]}
    assert saved_pool(tmp_path, {"samples": 8}) is None  # another key: sampled again
    assert saved_pool(tmp_path / "missing", {"samples": 4}) is None
    for foreign, said in ((json.dumps([1, 2]), "not an object"), (json.dumps({"rewards": {}}), "delete it")):
        (tmp_path / "pool.json").write_text(foreign)
        with pytest.raises(NanoparError) as refused:
            saved_pool(tmp_path, {"samples": 4})
        assert "\n" not in str(refused.value) and said in str(refused.value) and "pool.json" in str(refused.value)


@pytest.mark.slow
def test_a_pool_where_nothing_carries_a_signal_stops_in_one_line(tmp_path):
    """A cut of 8 tokens leaves the toy base no answer: every reward -1, nothing kept."""
    run = [a if a != "64" else "8" for a in RUN]
    with pytest.raises(NanoparError) as refused:
        train.main(["--out", str(tmp_path / "run"), *run])
    message = str(refused.value)
    assert "\n" not in message and "none of 12 problems" in message and "--pool-samples 0" in message
    assert (tmp_path / "run" / "2-rl-easy" / "pool.json").exists()  # what was sampled is kept
