"""The split of an evaluation's variance between problems and within a problem (variance.py), and
what summarize and a held-out evaluation report of it.

Checked against known truths: outcomes drawn from problems whose rates are set by the test, where
between = the variance of those rates and within = the mean of p (1 - p); and the standard error
it predicts against the spread of many simulated evaluations.
"""

import random
import statistics

import pytest

from nanopar import NanoparError
from nanopar.evaluation import summarize
from nanopar.heldout import held_out_rewards
from nanopar.variance import paired_split, split, standard_error


def simulated(rates, k, rng):
    return [[float(rng.random() < p) for _ in range(k)] for p in rates]


def test_the_split_finds_the_rates_spread_and_the_noise_around_them():
    rng = random.Random(0)
    rates = [rng.choice([0.0, 0.1, 0.5, 0.9, 1.0]) for _ in range(4000)]
    parts = split(simulated(rates, 4, rng))
    assert parts["samples"] == 4
    assert parts["between"] == pytest.approx(statistics.pvariance(rates), abs=0.01)
    assert parts["within"] == pytest.approx(statistics.fmean(p * (1 - p) for p in rates), abs=0.005)


def test_the_predicted_standard_error_is_the_spread_of_repeated_evaluations():
    """200 problems at k = 1 and k = 8, the problems drawn from one population (rates ~ Beta(0.5,
    0.8)) as a benchmark's are: the standard error `standard_error` predicts from one evaluation's
    split is the standard deviation of 300 evaluations' means, within 10%."""
    rng = random.Random(1)
    problems = lambda: [rng.betavariate(0.5, 0.8) for _ in range(200)]
    parts = split(simulated(problems(), 8, rng))
    for k in (1, 8):
        means = [statistics.fmean(statistics.fmean(o) for o in simulated(problems(), k, rng)) for _ in range(300)]
        assert standard_error(parts, 200, k) == pytest.approx(statistics.stdev(means), rel=0.1)


def test_a_paired_split_holds_the_true_differences_and_both_models_noise():
    rng = random.Random(2)
    before = [rng.random() for _ in range(3000)]
    after = [min(1.0, p + (0.2 if i % 2 else 0.0)) for i, p in enumerate(before)]  # half the problems gain
    parts = paired_split(simulated(before, 4, rng), simulated(after, 4, rng))
    true = [b - a for a, b in zip(before, after)]
    assert parts["between"] == pytest.approx(statistics.pvariance(true), abs=0.006)
    assert parts["within"] == pytest.approx(statistics.fmean(p * (1 - p) for p in before + after) * 2, abs=0.01)
    with pytest.raises(NanoparError, match="same problems"):
        paired_split([[1, 0]] * 3, [[1, 0]] * 2)


def test_one_sample_a_problem_has_no_split_and_unequal_samples_are_refused():
    assert split([[1.0], [0.0], [1.0]]) is None and split([[1.0, 0.0]]) is None
    with pytest.raises(NanoparError, match="same samples"):
        split([[1.0, 0.0], [1.0, 0.0, 1.0]])


def record(problem, correct):
    return {"source": "s", "id": problem, "correct": correct, "flexible_correct": correct, "has_parallel": False,
            "extracted": "1", "parse_error": None, "format_ok": True, "blocks": 0, "valid_blocks": 0,
            "paths_per_block": [], "branches_per_block": [], "relative_positions": [], "new_tokens": 3,
            "critical_path": 3, "finish": "eos"}


def test_summarize_reports_the_split_of_accuracy_at_two_samples_and_none_at_one():
    two = [record(p, c) for p, cs in (("a", (1, 0)), ("b", (1, 1)), ("c", (0, 0))) for c in cs]
    result = summarize(two)
    # within: (0.5 + 0 + 0) / 3; means 0.5, 1, 0 have variance 0.25, less within / 2
    assert result["accuracy_within"] == pytest.approx(1 / 6)
    assert result["accuracy_between"] == pytest.approx(0.25 - 1 / 12)
    one = summarize([record(p, 1) for p in "ab"])
    assert one["accuracy_within"] is None and one["accuracy_between"] is None


def test_a_held_out_evaluation_splits_each_reward_it_scores():
    records = [record(p, c) | {"response": r"\boxed{%d}" % (c,), "answer": "1", "question": "q", "extra": {}}
               for p, cs in (("a", (1, 0)), ("b", (1, 1))) for c in cs]
    scored = held_out_rewards(records, ["accuracy"])
    # accuracy pays +1 / -1: problem a [1, -1] (variance 2), b [1, 1]; means 0 and 1
    assert scored["reward_splits"]["accuracy"] == {"between": pytest.approx(0.5 - 1 / 2), "within": 1.0, "samples": 2}
    assert scored["rewards"]["accuracy"] == {"s/a": 0.0, "s/b": 1.0}
