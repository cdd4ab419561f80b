"""What --rescore says a reward does to GRPO before training (no-gradient share, agreement with
accuracy, spread within groups, per component), against hand counts; and the metrics plot's
component panels and its overlay of several runs (train.py --plot a,b)."""

import json

import pytest

import eval as eval_script
import train
from conftest import one_line
from nanopar import NanoparError
from nanopar.eval_report import group_keys, reward_report
from nanopar.grading import Grade
from nanopar.metrics import panels
from nanopar.rewards import RewardResult


def result(accuracy: float, parallel: float, correct: bool) -> RewardResult:
    """A spec "accuracy:1,parallel:0.5" as score would give it."""
    return RewardResult(accuracy + 0.5 * parallel, {"accuracy": accuracy, "parallel": parallel},
                        Grade(correct, None), True)


# Three prompts of two or three responses and one prompt answered once (no group):
#   p1: right+block, wrong+block, wrong       totals 1.5, -0.5, -1   accuracy 1, 0, 0
#   p2: right, right+block                    totals 1, 1.5          accuracy 1, 1  (accuracy: no gradient)
#   p3: wrong, wrong                          totals -1, -1          (both: no gradient)
#   p4: right+block                           alone: in no group
KEYS = ["p1", "p1", "p1", "p2", "p2", "p3", "p3", "p4"]
RESULTS = [result(1, 1, True), result(-1, 1, False), result(-1, 0, False), result(1, 0, True), result(1, 1, True),
           result(-1, 0, False), result(-1, 0, False), result(1, 1, True)]


def test_the_group_numbers_by_hand():
    report = reward_report(RESULTS, groups=KEYS)
    assert report["groups"] == 3  # p4 has one response
    assert report["no_gradient"] == pytest.approx(1 / 3)  # p3 only: p2's block pays 0.5 more
    assert report["no_gradient_accuracy"] == pytest.approx(2 / 3)  # p2 (all right) and p3 (all wrong)
    # p1's accuracy advantages: +2/3, -1/3, -1/3; the reward's (mean 0): +1.5, -0.5, -1: all three agree;
    # p2 and p3 have no accuracy advantage, so they are not counted
    assert report["agreement"] == pytest.approx(1.0)
    # population stds: p1 of (1.5, -0.5, -1) is sqrt(7/6); p2 of (1, 1.5) is 0.25; p3 is 0
    assert report["group_std"] == pytest.approx(((7 / 6) ** 0.5 + 0.25 + 0) / 3)
    parallel = report["per_component"]["parallel"]
    # parallel alone: p1 (1, 1, 0) advantages +1/3, +1/3, -2/3: agrees on the right one and the
    # last wrong one, not on the wrong one with a block: 2 of 3
    assert parallel["agreement"] == pytest.approx(2 / 3) and parallel["no_gradient"] == pytest.approx(1 / 3)
    assert parallel["mean"] == pytest.approx(4 / 8) and parallel["histogram"] == {"0": 4, "1": 4}
    assert parallel["group_std"] == pytest.approx(((2 / 9) ** 0.5 + 0.5 + 0) / 3)
    accuracy = report["per_component"]["accuracy"]
    assert accuracy["agreement"] == 1.0 and accuracy["no_gradient"] == report["no_gradient_accuracy"]
    # the keys it had before stay
    assert report["mean"] == pytest.approx(sum(r.total for r in RESULTS) / 8) and report["accuracy"] == 0.5


def test_a_reward_that_ignores_the_answer_disagrees_where_accuracy_has_a_say():
    """A flat reward in a mixed group pushes nothing: its responses count as disagreeing."""
    flat = [result(0, 1, True), result(0, 1, False), result(0, 1, True), result(0, 0, True)]
    report = reward_report(flat, groups=["a", "a", "b", "b"])
    # a: reward (0.5, 0.5) flat, accuracy mixed: 0 of 2 agree; b: accuracy all right: not counted
    assert report["agreement"] == 0.0 and report["no_gradient"] == 0.5 and report["no_gradient_accuracy"] == 0.5
    assert reward_report(flat[2:], groups=["b", "b"])["agreement"] is None  # no group with a right and a wrong answer


def test_one_response_per_problem_has_no_groups(tmp_path, capsys):
    report = reward_report(RESULTS[:3])
    assert report["groups"] == 0 and report["no_gradient"] is report["agreement"] is report["group_std"] is None
    samples = tmp_path / "samples.jsonl"
    records = [{"id": str(i), "source": "toy", "answer": "4", "response": "Final Answer: 4"} for i in range(3)]
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    reports = eval_script.main(["--rescore", str(samples), "--reward", "accuracy"])
    assert reports["all"]["no_gradient"] is None
    assert "one response per problem: no group" in capsys.readouterr().out


def test_groups_are_a_prompts_responses_within_a_training_step():
    records = [{"stage": "rl", "step": 1, "source": "toy", "id": "a"}, {"stage": "rl", "step": 2, "source": "toy", "id": "a"},
               {"source": "toy", "id": "a"}, {"source": "toy", "id": "a"}]
    keys = group_keys(records)
    assert keys[0] != keys[1] and keys[2] == keys[3] != keys[0]


def test_a_component_gets_a_panel_when_some_run_logged_it():
    assert panels([[{"reward": 1.0}]]) == ["reward", "accuracy", "parallel_ratio", "relative_position"]
    assert panels([[{"reward": 1.0}], [{"reward": 1.0, "reward/parallel": 0.5}]])[4:] == ["reward/parallel"]


def write_run(folder, rewards):
    folder.mkdir(parents=True)
    lines = [{"stage": "rl-easy", "step": i + 1, "reward": r, "accuracy": 0.5, "parallel_ratio": 0.1,
              "relative_position": None, "reward/accuracy": r, "reward/parallel": 0.0} for i, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_plot_overlays_several_runs_in_the_first_folder(tmp_path):
    write_run(tmp_path / "a", [0.1, 0.2])
    write_run(tmp_path / "b", [0.3, 0.1, 0.4])
    write_run(tmp_path / "c", [0.0])
    assert train.main(["--plot", str(tmp_path / "a")]) == tmp_path / "a" / "metrics.png"
    png = train.main(["--plot", f"{tmp_path / 'a'},{tmp_path / 'b'},{tmp_path / 'c'}"])
    assert png == tmp_path / "a" / "metrics-vs-b-c.png" and png.stat().st_size > 0


def test_plot_names_a_folder_without_metrics(tmp_path):
    write_run(tmp_path / "a", [0.1])
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "nowhere", tmp_path / "empty"):
        with pytest.raises(NanoparError) as error:
            train.main(["--plot", f"{tmp_path / 'a'},{missing}"])
        assert one_line(error).startswith(f"{missing}: no metrics.jsonl there")
