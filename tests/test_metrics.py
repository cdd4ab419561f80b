"""metrics.py: a GRPO step's numbers against a hand count, and the metrics log's readers."""

import pytest

from conftest import PARALLEL_CASES, one_line, text_ids, text_rollout
from nanopar import NanoparError
from nanopar.data import read_jsonl
from nanopar.grading import Grade
from nanopar.metrics import MetricsLog, plot_metrics, rollout_metrics, structure_metrics
from nanopar.rollouts import response_structure
from nanopar.rewards import RewardResult
from nanopar.sampler import Rollout
from nanopar.tags import TagIds

TAGS = TagIds(100, 101, 102, 103, 104, 105)
P, P_, PATH, PATH_, S, S_, EOS = 100, 101, 102, 103, 104, 105, 0


def rollout(ids: list[int], finish: str) -> Rollout:
    return text_rollout([7], ids, TAGS, finish)


def result(total: float, correct: bool, error: str | None = None) -> RewardResult:
    components = {"accuracy": 1.0 if correct else -1.0, "format": total}
    return RewardResult(total, components, Grade(correct, None, error), True)


def test_rollout_metrics_by_hand():
    rollouts = [
        rollout([1, 2, P, PATH, 5, 6, PATH_, PATH, 7, PATH_, P_, S, 8, S_, 9, EOS], "eos"),  # a valid block at 2/16
        rollout([1, 2, 3, EOS], "eos"),
        rollout([P, PATH, 5, PATH_, P_, S, 8, S_], "length"),  # one path: a block, not a valid one
        rollout([1] * 10, "length"),
    ]
    results = [result(1.0, True), result(-1.0, False), result(-1.0, False), result(-1.0, False, "no answer found")]
    m = rollout_metrics(rollouts, results, group_size=2)
    assert m["reward"] == -0.5 and m["accuracy"] == 0.25 and m["parse_failures"] == 0.25
    assert m["reward/accuracy"] == -0.5 and m["reward/format"] == -0.5
    assert m["zero_variance_groups"] == 0.5  # (1, -1) teaches something, (-1, -1) nothing
    assert m["parallel_ratio"] == 0.25 and m["blocks_per_response"] == 0.5
    assert m["relative_position"] == (2 / 16 + 0 / 8) / 2 and m["paths_per_block"] == 1.5  # over blocks
    assert m["branch_counts"] == {"1": 0.5, "2": 0.5}  # Parallel-R1: a block's branches are its paths
    assert m["response_length"] == (16 + 4 + 8 + 10) / 4 and m["truncation_rate"] == 0.5
    # the shorter path (3 tokens: <Path> 7 </Path>) runs beside the longer one: 13 tokens on the critical path
    assert m["acceleration"] == (16 + 4 + 8 + 10) / (13 + 4 + 8 + 10)


def test_parallel_ratio_counts_what_the_strict_parallel_reward_calls_valid():
    """A <Path> after the summary, a nested <Path> and a truncated block hold a block with two
    closed paths, yet none is a valid parallel trace: the ratio counts the clean one."""
    from nanopar.data import Problem
    from nanopar.rewards import score
    from nanopar.trace import parse_trace

    names = sorted(PARALLEL_CASES)
    rollouts = [rollout(text_ids(PARALLEL_CASES[n][0], TAGS), "eos") for n in names]
    results = [score("parallel-strict", PARALLEL_CASES[n][0], r.trace, Problem("p", "q", "4"))
               for n, r in zip(names, rollouts)]
    m = rollout_metrics(rollouts, results, group_size=len(names))
    assert m["parallel_ratio"] == 1 / 6 and m["reward/parallel-strict"] == (1 - 5) / 6
    assert [r.total > 0 for r in results] == [n == "clean" for n in names]
    assert m["blocks_per_response"] == 5 / 6  # the sequential one has no block
    # the weaker "at least one valid block" would count 3 of them: clean, nested, after the summary
    assert [any(b.valid for b in parse_trace(PARALLEL_CASES[n][0]).blocks) for n in names] == [
        True, True, False, True, False, False]


def test_the_log_drops_lines_past_a_resumed_step(tmp_path):
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    for stage, step in [("sft", 1), ("sft", 2), ("rl", 1), ("rl", 2), ("rl", 3)]:
        log.write({"stage": stage, "step": step})
    log.drop_after("rl", 1)
    lines = read_jsonl(log.path)
    assert [(r["stage"], r["step"]) for r in lines] == [("sft", 1), ("sft", 2), ("rl", 1)]


def test_a_torn_last_line_is_a_one_line_error_naming_it(tmp_path):
    """A line cut short (a crash mid-write, or a read while it is written) is named, not a traceback."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"stage": "rl", "step": 1, "reward": 0.5})
    with log.path.open("a") as f:
        f.write('{"stage": "rl", "step": 2, "rew')
    before = log.path.read_text()
    for read in (lambda: log.drop_after("rl", 1), lambda: plot_metrics(log.path, tmp_path / "m.png")):
        with pytest.raises(NanoparError) as error:
            read()
        assert one_line(error).startswith(f"{log.path}:2: not valid JSON")
    assert log.path.read_text() == before and not (tmp_path / "m.png").exists()


def test_npr_branch_counts_are_the_plans_the_model_chose():
    """Under NPR a block's branch count is the number of plans of its guideline (the model's
    choice), also when its steps do not match them (a malformed round written causally)."""
    from conftest import NPR_TAGS as N

    def round_ids(plans, steps):
        return ([N.block_open] + [N.plan_open, 1, N.plan_close] * plans + [N.plans_close]
                + [N.path_open, 2, N.path_close] * steps + [N.summary_open, 3, N.summary_close])

    rollouts = [text_rollout([1], round_ids(2, 2) + round_ids(3, 3) + [9], N),
                text_rollout([1], round_ids(1, 1) + [9], N),
                text_rollout([1], round_ids(3, 2) + [9], N)]  # three plans, two steps: malformed
    m = structure_metrics([response_structure(r) for r in rollouts])
    assert m["branch_counts"] == {"1": 0.25, "2": 0.25, "3": 0.5} and m["branches_per_block"] == 9 / 4
    assert m["paths_per_block"] == 8 / 4 and m["parallel_ratio"] == 1 / 3  # one plan: sequential; 3 != 2: invalid
