"""train.py --ablations: the arms' configs, their shared cold start, resume, the tables, bad input."""

import dataclasses
import json

import pytest
from rich.console import Console

import nanopar.model
import nanopar.runner
import train
from conftest import one_line, read_metrics
import ablations
from nanopar import NanoparError
from nanopar.results import evaluation_key
from nanopar.rewards import schedule_from_string

TINY = ["--pretrain-steps", "2", "--sft-steps", "2", "--rl-easy-steps", "1", "--rl-hard-steps", "2",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "24", "--max-path-tokens", "8",
        "--sft-batch", "4", "--checkpoint-every", "0", "--eval-problems", "2", "--eval-samples", "1"]
STAGES = {"unseen": ["pretrain", "sft", "rl-easy", "rl-hard"], "unseen-parallel-strict": ["rl-hard"],
          "unseen-parallel": ["rl-hard"],
          "unseen-alternating": ["rl-hard"], "unseen-no-rl-easy": ["rl-hard"], "seen": ["sft", "rl-easy", "rl-hard"],
          "seen-no-rl-easy": ["rl-hard"], "unseen-disjoint": ["sft", "rl-easy", "rl-hard"]}  # what each arm trains


def opened(tmp_path, *flags):
    config = train.resolved_config(["--out", str(tmp_path), "--ablations", *TINY, *flags])[0]
    return ablations.open_arms(config, Console(quiet=True))


def no_model(monkeypatch):
    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(nanopar.model, "load_model", load_model)  # every script loads through it


def test_the_arms_differ_exactly_as_intended_and_share_one_cold_start(tmp_path, monkeypatch):
    """Each arm's config is the command's with only its own changes (reward, mode, skip, stride),
    plus where it starts: the arms after unseen's stages start from unseen's folders, so every arm
    has the same pretrained base and each mode one cold start. Opening them loads no model."""
    no_model(monkeypatch)
    arms = opened(tmp_path)
    assert {name: [s.name for s in chosen] for name, (_, _, chosen) in arms.items()} == STAGES
    base = dataclasses.asdict(arms["unseen"][1].config)
    unseen = tmp_path / "ablations" / "unseen"
    changed = {}
    for name, (_, runner, _) in arms.items():
        config = dataclasses.asdict(runner.config)
        assert config["out"] == str(tmp_path / "ablations" / name) and not config["ablations"]
        changed[name] = {k: v for k, v in config.items() if v != base[k] and k != "out"}
    skip_to_rl_hard = "pretrain,sft,rl-easy"
    assert changed == {
        "unseen": {},
        "unseen-parallel-strict": {"hard_reward": "parallel-strict", "skip": skip_to_rl_hard,
                                   "model": str(unseen / "3-rl-easy" / "final")},
        "unseen-parallel": {"hard_reward": "parallel", "skip": skip_to_rl_hard,
                            "model": str(unseen / "3-rl-easy" / "final")},
        "unseen-alternating": {"hard_reward": "alternating:2:1", "skip": skip_to_rl_hard,
                               "model": str(unseen / "3-rl-easy" / "final")},
        "unseen-no-rl-easy": {"skip": skip_to_rl_hard, "model": str(unseen / "2-sft" / "final")},
        "seen": {"mode": "causal", "skip": "pretrain", "model": str(unseen / "1-pretrain" / "final")},
        "seen-no-rl-easy": {"mode": "causal", "skip": skip_to_rl_hard,
                            "model": str(tmp_path / "ablations" / "seen" / "1-sft" / "final")},
        "unseen-disjoint": {"path_stride": 8 + 2, "skip": "pretrain", "model": str(unseen / "1-pretrain" / "final")},
    }
    assert (base["mode"], base["path_stride"], base["hard_reward"], base["model"]) == ("structured", 0, "accuracy",
                                                                                       "toy:model")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing written before the arms run


@pytest.mark.parametrize("steps", range(2, 41))
def test_the_alternating_arm_has_both_rewards_at_any_length(steps):
    spec = ablations.alternating_spec(steps)
    schedule = schedule_from_string(spec)
    rewards = [next(iter(schedule.spec(step))) for step in range(steps)]
    assert {"accuracy", "accuracy_parallel_bonus"} == set(rewards), (spec, rewards)  # the released schedule
    assert rewards.count("accuracy_parallel_bonus") <= max(1, steps // 5)  # the paper's 2 of 10, at most
    if steps >= 10:  # they alternate, not one switch
        assert rewards[-1] == "accuracy_parallel_bonus" or rewards.count("accuracy_parallel_bonus") >= 2


def fake_results(runner, stage, easy, hard, per_problem=None):
    """An eval.json for `stage` that `HeldOut.evaluate` takes as its own (its key matches), with
    `per_problem` accuracies on the hard set when given."""
    result = {"accuracy": None, "parallel_ratio": None}
    sets = runner.inputs.eval_sets()
    folder = runner.folder(stage)
    folder.mkdir(parents=True, exist_ok=True)
    results = {sets[0]: result | {"accuracy": easy, "parallel_ratio": 0.5, "accuracy_se": 0.011},
               sets[1]: result | {"accuracy": hard, "parallel_ratio": 0.25, "accuracy_se": hard / 10,
                                  "parallel_ratio_se": 0.02}
               | ({"per_problem": per_problem} if per_problem else {})}
    (folder / "eval.json").write_text(json.dumps({"how": evaluation_key(runner.config, runner.stages, stage), "results": results}))
    (runner.out / "metrics.jsonl").write_text("")


def test_the_tables_show_the_paper_numbers_beside_ours(tmp_path, monkeypatch):
    """Three tables, one per ablation, each column an arm's rl-hard as train.py's table shows a
    stage; under them the paper's parallel ratios and stage-1 differences, and ours (hard and easy
    accuracy, with - without rl-easy) from the arms' held-out results."""
    no_model(monkeypatch)
    arms = opened(tmp_path)
    hard = {"unseen": 0.10, "unseen-parallel-strict": 0.04, "unseen-parallel": 0.05, "unseen-alternating": 0.08,
            "unseen-no-rl-easy": 0.125, "seen": 0.20, "seen-no-rl-easy": 0.15, "unseen-disjoint": 0.0}
    for name, (_, runner, _) in arms.items():
        fake_results(runner, runner.stages[-1], easy=0.5, hard=hard[name])
    paid = [False, True, False]  # the parallel arm: its reward paid (a signal) on the 2nd of 3 steps
    (arms["unseen-parallel"][1].out / "metrics.jsonl").write_text("".join(
        json.dumps({"stage": "rl-hard", "step": i + 1, "skipped_no_signal": not p}) + "\n" for i, p in enumerate(paid)))
    rewards, stage1, positions = ablations.tables(arms)

    def cells(table, row):
        names = list(table.columns[0].cells)
        return {column.header: list(column.cells)[names.index(row)] for column in table.columns[1:]}

    assert cells(rewards, "paper: parallel ratio") == {"accuracy": "13.6%", "parallel-strict": "", "parallel": "80.3%",
                                                       "alternating": "63.0%"}
    assert cells(rewards, "hard: parallel ratio") == {"accuracy": "25.0%", "parallel-strict": "25.0%",
                                                      "parallel": "25.0%", "alternating": "25.0%"}
    assert cells(rewards, "hard: accuracy") == {"accuracy": "10.0%", "parallel-strict": "4.0%", "parallel": "5.0%",
                                                "alternating": "8.0%"}
    assert cells(rewards, "hard: parallel ratio ± SE")["parallel"] == "25.0% ± 2.0"
    assert cells(rewards, "easy: parallel ratio ± SE")["parallel"] == "50.0%"  # no standard error saved
    assert cells(rewards, "rl-hard steps with a signal") == {"accuracy": "0 of 0", "parallel-strict": "0 of 0",
                                                             "parallel": "1 of 3", "alternating": "0 of 0"}
    assert cells(stage1, "hard: with - without rl-easy") == {
        "Seen": "+5.0 pts", "Seen, no rl-easy": "", "Unseen": "-2.5 pts", "Unseen, no rl-easy": ""}
    assert cells(stage1, "easy: with - without rl-easy")["Seen"] == "+0.0 pts"
    assert cells(stage1, "paper: with - without stage 1") == {
        "Seen": "+2.3 pts", "Seen, no rl-easy": "", "Unseen": "-8.6 pts", "Unseen, no rl-easy": ""}
    assert [c.header for c in positions.columns] == ["", "shared (stride 0)", "disjoint"]
    assert "No paper number" in positions.caption and "2 rl-hard steps" in positions.caption
    assert cells(positions, "hard: accuracy") == {"shared (stride 0)": "10.0%", "disjoint": "0.0%"}
    assert cells(rewards, "hard: accuracy SE") == {"accuracy": "1.0%", "parallel-strict": "0.4%", "parallel": "0.5%",
                                                   "alternating": "0.8%"}
    assert rewards.title.endswith("standard error of an accuracy cell <= 1.1 points")  # easy's 1.1 is the largest
    assert stage1.title.endswith("<= 2.0 points")  # seen's hard 0.20 / 10
    # with per-problem accuracies the difference gets the standard error of the paired differences
    fake_results(arms["seen"][1], arms["seen"][1].stages[-1], easy=0.5, hard=0.25,
                 per_problem={"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0})
    fake_results(arms["seen-no-rl-easy"][1], arms["seen-no-rl-easy"][1].stages[-1], easy=0.5, hard=0.0,
                 per_problem={"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0})
    _, stage1, _ = ablations.tables(arms)
    # differences 0.5, 0.5, 0, 0: mean 0.25, sample sd 0.2887, over sqrt(4)
    assert cells(stage1, "hard: with - without rl-easy")["Seen"] == "+25.0 ± 14.4 pts"
    assert cells(stage1, "easy: with - without rl-easy")["Seen"] == "+0.0 pts"  # no per-problem accuracies


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--recipe", "npr"], "--ablations runs Parallel-R1's ablations: --recipe parallel-r1, not npr"),
        (["--stages", "rl-hard"], "--ablations sets --stages arm by arm: leave it out"),
        (["--skip", "rl-easy"], "--ablations sets --skip arm by arm: leave it out"),
        (["--mode", "causal"], "--ablations sets --mode arm by arm: leave it out"),
        (["--path-stride", "50"], "--ablations sets --path-stride arm by arm: leave it out"),
        (["--hard-reward", "parallel"], "--ablations sets --hard-reward arm by arm: leave it out"),
        (["--baseline"], "--ablations sets --baseline arm by arm: leave it out"),
        (["--sft-data", ""], "--ablations shares one cold start per mode: give ready traces with --sft-data"),
        (["--rl-hard-steps", "1"], "--ablations needs --rl-hard-steps >= 2"),
        (["--rl-easy-steps", "0"], "--ablations compares runs with and without rl-easy: --rl-easy-steps >= 1"),
        (["--eval-problems", "0"], "--ablations compares held-out results: --eval-problems >= 1"),
        (["--easy-reward", "acuracy"], "unknown reward 'acuracy'"),  # an arm's own check (Runner.validate)
    ],
)
def test_bad_combinations_are_one_line_errors_before_any_model_loads(flags, message, tmp_path, monkeypatch):
    no_model(monkeypatch)
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path), "--ablations", *TINY, *flags])
    assert one_line(error).startswith(message)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def count_trained(monkeypatch, crash_at=None):
    """Record each stage Runner.train trains, (arm, stage); raise at the start of call `crash_at`."""
    trained, real = [], nanopar.runner.Runner.train

    def counted(self, stage):
        trained.append((self.out.name, stage.name))
        if len(trained) == crash_at:
            raise RuntimeError("power cut")
        return real(self, stage)

    monkeypatch.setattr(nanopar.runner.Runner, "train", counted)
    return trained


@pytest.mark.slow
def test_an_interrupted_ablation_resumes_without_redoing_a_finished_stage(tmp_path, monkeypatch, capsys):
    """Killed at the start of its sixth stage, the same command trains only the stages not done
    (each once over both runs), leaves finished ones untouched, writes each arm's config.json, and
    prints the tables; a third run trains and evaluates nothing."""
    args = ["--out", str(tmp_path), "--ablations", *TINY]
    monkeypatch.setenv("COLUMNS", "200")  # the tables' cells unwrapped in the captured output
    first = count_trained(monkeypatch, crash_at=6)
    with pytest.raises(RuntimeError, match="power cut"):
        train.main(args)
    assert first[:5] == [("unseen", s) for s in STAGES["unseen"]] + [("unseen-parallel-strict", "rl-hard")]
    root = tmp_path / "ablations"
    finals = {f: f.stat().st_mtime_ns for f in root.glob("*/*/final")}
    assert len(finals) == 5
    second = count_trained(monkeypatch)
    train.main(args)
    everything = [(arm, stage) for arm, stages in STAGES.items() for stage in stages]
    assert first[:5] + second == everything  # the interrupted stage once more, nothing twice
    assert all(f.stat().st_mtime_ns == t for f, t in finals.items())
    assert sorted(str(f.relative_to(root)) for f in root.glob("*/[0-9]-*")) == sorted(
        f"{arm}/{n}-{stage}" for arm, stages in STAGES.items() for n, stage in enumerate(stages, 1))
    for arm in STAGES:
        config = json.loads((root / arm / "config.json").read_text())
        assert [s["name"] for s in config["resolved_stages"]] == STAGES[arm] and not config["ablations"]
    assert json.loads((root / "seen" / "config.json").read_text())["model"] == str(
        root / "unseen" / "1-pretrain" / "final")  # Seen's cold start from the one pretrained base
    text = capsys.readouterr().out
    assert "80.3%" in text and "-8.6 pts" in text and "(c) shared vs disjoint" in text
    logs = {arm: len(read_metrics(root / arm)) for arm in STAGES}
    third = count_trained(monkeypatch)
    train.main(args)
    assert third == [] and {arm: len(read_metrics(root / arm)) for arm in STAGES} == logs
