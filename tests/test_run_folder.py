"""A run folder is reused only by a command that would train its stages the same way.

A folder's begun stages are compared with what the command would train there (run_folder.py): a
changed reward, model or step count is refused in one line that names the flag and the way out,
the same command resumes, --restart trains the stale stages again and keeps the rest, and a flag
that changes no model (evaluation, memory knobs) never refuses. The default folder follows what
a run trains.
"""

import dataclasses
import json

import pytest

import train
from nanopar import NanoparError
from nanopar.curriculum import TrainConfig, recipe
from nanopar.run_folder import BOOKKEEPING, PER_STAGE, RESULT_FLAGS

TINY = ["--pretrain-steps", "2", "--sft-steps", "1", "--rl-easy-steps", "1", "--rl-hard-steps", "1",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "24", "--max-path-tokens", "8",
        "--sft-batch", "4", "--easy-reward", "format", "--hard-reward", "format", "--eval-problems", "0"]


def stamps(out):
    """{stage folder: modification time of its final/ weights}: what a rerun kept or retrained."""
    return {d.name: (d / "final").stat().st_mtime_ns for d in sorted(out.iterdir()) if (d / "final").is_dir()}


def test_a_changed_reward_is_refused_the_same_command_resumes_and_restart_retrains_only_what_changed(tmp_path):
    out = tmp_path / "run"
    train.main(["--out", str(out), *TINY])
    before = stamps(out)
    assert list(before) == ["1-pretrain", "2-sft", "3-rl-easy", "4-rl-hard"]
    changed = ["--out", str(out), *TINY, "--hard-reward", "accuracy"]
    with pytest.raises(NanoparError) as refused:
        train.main(changed)
    message = str(refused.value)
    assert "\n" not in message and "4-rl-hard" in message and "--hard-reward 'format' -> 'accuracy'" in message
    assert "--out" in message and "--restart" in message and "3-rl-easy" not in message
    assert json.loads((out / "config.json").read_text())["hard_reward"] == "format"  # the refusal wrote nothing
    train.main(["--out", str(out), *TINY])  # the same command: every stage done, nothing retrained
    assert stamps(out) == before
    train.main([*changed, "--restart"])
    after = stamps(out)
    assert {name for name in before if after[name] != before[name]} == {"4-rl-hard"}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["stage"] == "rl-hard" and "step" in line] == [1]  # not twice
    assert json.loads((out / "config.json").read_text())["hard_reward"] == "accuracy"


def test_a_changed_step_count_is_refused_for_a_begun_stage_only(tmp_path):
    out = tmp_path / "run"
    train.main(["--out", str(out), *TINY, "--stages", "pretrain,sft"])
    # rl-easy has not begun: its new length is simply what it trains with
    train.main(["--out", str(out), *TINY, "--stages", "pretrain,sft,rl-easy", "--rl-easy-steps", "2"])
    with pytest.raises(NanoparError, match=r"holds 3-rl-easy, trained with other settings \(--rl-easy-steps 2 -> 1\)"):
        train.main(["--out", str(out), *TINY])
    # a changed cold start makes every stage after it stale
    with pytest.raises(NanoparError, match=r"holds 2-sft, 3-rl-easy, trained .*--sft-steps 1 -> 3"):
        train.main(["--out", str(out), *TINY, "--rl-easy-steps", "2", "--sft-steps", "3"])
    # what changes no model never refuses: evaluation, checkpoints, micro-batches
    train.main(["--out", str(out), *TINY, "--rl-easy-steps", "2", "--stages", "pretrain,sft,rl-easy",
                "--micro-batch", "3", "--checkpoint-every", "5", "--eval-problems", "1"])


def test_a_changed_model_is_refused(tmp_path):
    out = tmp_path / "run"
    small = ["--out", str(out), "--pretrain-data", "", "--stages", "sft", *TINY]
    train.main([*small, "--model", "tiny:qwen2"])
    with pytest.raises(NanoparError, match=r"holds 1-sft, trained with other settings \(--model 'tiny:qwen2' -> "
                                           r"'tiny:qwen3'\): give this run its own --out, or add --restart"):
        train.main([*small, "--model", "tiny:qwen3"])


def test_every_flag_either_changes_a_stage_or_is_named_bookkeeping():
    """A flag missing from both lists would let a changed folder resume silently: each flag that
    is neither bookkeeping nor a RESULT_FLAGS entry must change some stage's recipe entry."""
    counted = set(BOOKKEEPING).union(*RESULT_FLAGS.values(), PER_STAGE)
    bases = [train.resolved_config(flags)[0] for flags in (["--baseline"], ["--sft-data", ""], ["--recipe", "npr"])]
    for field in dataclasses.fields(TrainConfig):
        if field.name in counted:
            continue

        def changes_a_stage(base) -> bool:
            value = getattr(base, field.name)
            other = (not value) if isinstance(value, bool) else value + 1 if isinstance(value, (int, float)) else \
                ("npr" if value == "parallel-r1" else value + "-changed")
            changed = dataclasses.replace(base, **{field.name: other})
            return [dataclasses.asdict(s) for s in recipe(changed)] != [dataclasses.asdict(s) for s in recipe(base)]

        assert any(changes_a_stage(base) for base in bases), f"--{field.name} changes no stage"
    assert not set(BOOKKEEPING) & set().union(*RESULT_FLAGS.values())


@pytest.mark.parametrize("flags, folder", [
    ([], "runs/default"), (["--recipe", "npr"], "runs/npr"),
    (["--model", "Qwen/Qwen3-4B-Instruct-2507"], "runs/Qwen3-4B-Instruct-2507"),
    (["--model", "pypi:smollm2"], "runs/smollm2"), (["--model", "models/q.gguf", "--recipe", "npr"], "runs/q-npr"),
    (["--model", "runs/qwen/1-sft/final"], "runs/qwen-1-sft-final"),
    (["--preset", "qwen"], "runs/qwen"), (["--preset", "qwen", "--out", "mine"], "mine")])
def test_the_default_folder_follows_what_the_run_trains(flags, folder):
    assert train.resolved_config(flags)[0].out == folder
