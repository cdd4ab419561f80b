"""An RL stage alone, from a saved stage's model, in a folder of its own: `train.py --start-from`.
It trains what the same stage of the original run would (same seeds, same start), leaves the
original run's folder untouched, and a reward file keys only the stages whose reward reads it."""

import hashlib
import shutil
from pathlib import Path

import pytest

import train
from conftest import one_line, read_metrics, reward_file
from nanopar import NanoparError
from test_train import SMALL, weights


def files(folder: Path) -> dict[str, str]:
    """Every file under `folder` -> its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_an_rl_stage_alone_from_a_saved_cold_start(tmp_path, monkeypatch, registry):
    monkeypatch.chdir(tmp_path)  # the default run folders are relative: runs/...
    original = train.main(["--out", "runs/default", *SMALL, "--stages", "pretrain,sft"])
    shutil.copytree(original, "runs/copy")
    untouched = files(original)
    rewards = reward_file(tmp_path, "short", 60)
    mine = ["--reward-file", str(rewards), "--easy-reward", "format:1,short:1"]

    alone = train.main([*SMALL, "--start-from", "runs/default/2-sft/final", "--stages", "rl-easy", *mine])
    assert alone == Path("runs/default-2-sft-final")  # named after the stage it starts from, not runs/default
    assert sorted(p.name for p in alone.iterdir() if p.is_dir()) == ["0-model", "1-rl-easy"]  # its start evaluated
    assert [m["step"] for m in read_metrics(alone) if "step" in m] == [1, 2, 3]
    assert files(original) == untouched

    # the same stage in the copy of the original run: its cold start was trained without the reward
    # file, which only rl-easy reads, so it is reused, not refused; the same seeds give the same model
    in_run = train.main(["--out", "runs/copy", *SMALL, "--stages", "rl-easy", *mine])
    a, b = weights(alone / "1-rl-easy" / "final"), weights(in_run / "3-rl-easy" / "final")
    assert all(a[name].equal(b[name]) for name in a)
    assert any(not a[name].equal(c) for name, c in weights(original / "2-sft" / "final").items())  # it trained


@pytest.mark.parametrize("args, message", [
    (["--stages", "rl-easy", "--out", "runs/default"], "--out runs/default holds the model this run starts from"),
    (["--stages", "rl-easy", "--model", "tiny:qwen3"], "--start-from is the model the run starts from: give it or"),
    ([], "--start-from needs --stages: the stages to run from it"),
])
def test_start_from_refuses_what_would_overwrite_or_mislead(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "default" / "2-sft" / "final").mkdir(parents=True)
    with pytest.raises(NanoparError) as error:
        train.main([*SMALL, "--start-from", "runs/default/2-sft/final", *args])
    assert one_line(error).startswith(message)


def test_start_from_a_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(NanoparError) as error:
        train.main([*SMALL, "--start-from", str(tmp_path / "nope"), "--stages", "rl-easy"])
    assert one_line(error) == f"--start-from {tmp_path / 'nope'}: no such folder (a stage's final/ or checkpoint-N/)"
