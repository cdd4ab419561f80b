"""How an evaluation's variance splits between problems and within a problem: what k samples buy.

An evaluation of n problems at k samples each reports the mean of the problems' means. Each
problem i has its own rate p_i; one sample's outcome varies around it by s_i^2 (p_i (1 - p_i) for
a 0/1 grade), so over problems drawn from a population (a benchmark's: problems as the unit, as
`evaluation.summarize`'s standard error takes them) the reported mean varies by

    var(mean) = (between + within / k) / n      between = var over problems of p_i
                                                within  = mean over problems of s_i^2

k shrinks only the `within` part, n both. A paired comparison of two models on the same problems
has the same shape, its per-problem difference d_i = after_i - before_i in place of the mean:

    var(mean d) = (between_d + (within_before + within_after) / k) / n

and for two close models between_d is small, so there k buys almost as much as n (Miller 2024,
"Adding error bars to evals", arXiv 2411.00640: resample each question, compare pair by pair).
Both parts are estimated from one evaluation with k >= 2 samples a problem (a one-way
random-effects split): `within` from each problem's sample variance over k - 1, `between` as the
variance of the problems' means less within / k, and at least 0. Not here: collecting the outcomes
(evaluation.summarize, heldout.held_out_rewards), choosing k for a run (docs/qwen.md).
"""

from __future__ import annotations

import math
import statistics

from . import NanoparError


def split(outcomes: list[list[float]]) -> dict | None:
    """{"between": ..., "within": ..., "samples": k} of one evaluation's outcomes (a list per problem,
    every list k >= 2 long); None with fewer than two problems or one sample a problem, where
    within cannot be told from between.

    >>> split([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # within: (1/3 + 0 + 0) / 3; means 1/2, 1, 0
    {'between': 0.2222222222222222, 'within': 0.1111111111111111, 'samples': 4}
    """
    if len(outcomes) < 2 or min(map(len, outcomes)) < 2:
        return None
    if len(set(map(len, outcomes))) > 1:
        raise NanoparError(f"a variance split needs the same samples for every problem, got {sorted(set(map(len, outcomes)))}")
    k = len(outcomes[0])
    within = statistics.fmean(statistics.variance(o) for o in outcomes)
    between = statistics.variance([statistics.fmean(o) for o in outcomes]) - within / k
    return {"between": max(between, 0.0), "within": within, "samples": k}


def paired_split(before: list[list[float]], after: list[list[float]]) -> dict | None:
    """The split of a paired difference: `before[i]` and `after[i]` the outcomes of problem i under
    each model (k >= 2 each). "within" is the sum of both models' within-problem variances (what
    var(d_i) holds of sampling), "between" the variance of the true differences.

    >>> paired_split([[1, 0], [0, 0], [1, 1]], [[1, 1], [1, 0], [1, 1]])  # d = 0.5, 0.5, 0
    {'between': 0.0, 'within': 0.3333333333333333, 'samples': 2}
    """
    if len(before) != len(after):
        raise NanoparError(f"a paired split needs the same problems: {len(before)} against {len(after)}")
    a, b = split(before), split(after)
    if a is None or b is None:
        return None
    if a["samples"] != b["samples"]:
        raise NanoparError(f"a paired split needs the same samples a problem: {a['samples']} against {b['samples']}")
    k, within = a["samples"], a["within"] + b["within"]
    differences = [statistics.fmean(y) - statistics.fmean(x) for x, y in zip(before, after)]
    return {"between": max(statistics.variance(differences) - within / k, 0.0), "within": within, "samples": k}


def standard_error(parts: dict, problems: int, samples: int) -> float:
    """The standard error of a mean (or of a paired difference) over `problems` problems at
    `samples` samples each, from a measured split.

    >>> parts = {"between": 0.16, "within": 0.09}  # one sample: sqrt(0.25 / 100); nine: sqrt(0.17 / 100)
    >>> round(standard_error(parts, 100, 1), 4), round(standard_error(parts, 100, 9), 4)
    (0.05, 0.0412)
    """
    return math.sqrt((parts["between"] + parts["within"] / samples) / problems)
