"""DAPO's dynamic sampling: a GRPO step trained only on groups that carry a signal.

    draw 0: B prompts x G responses -> drop the groups whose rewards are all equal
    draw 1, 2, ...: B more prompts each, while fewer than B groups are kept and draws remain
    -> the first B groups kept, in the order drawn

A group whose G rewards are all equal has advantage 0 for every member: without a KL term it adds
nothing to the gradient, only to the divisor of a token-mean loss. DAPO (Yu et al. 2025, its
"dynamic sampling") drops such groups and samples more prompts until the batch holds the asked
number of groups with both outcomes; verl's DAPO recipe draws whole generation batches
(`gen_batch_size`) up to `max_num_gen_batches` times and raises an error when that cap is reached.
Here each draw is B prompts, and at the cap the step trains on the groups it found (fewer than B,
none: no update), its metrics say how many. Informative groups beyond B are left unused, as verl
leaves them. Off by default: neither paper's released run filters (NPR's runs DAPO's trainer with
`enable_filter_groups=False`; Parallel-R1's has no filter).

"Carries a signal" is read on the rewards GRPO's advantages use: the members a PAPO stage keeps
(`RewardResult.layout_ok`) when it drops invalid rollouts, all of them otherwise; a group needs two
different rewards among them. Not here: sampling and scoring one draw (`grpo.sample_scored`), which
problems a draw takes (stage_steps.py), the advantages (`grpo.group_advantages`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .data import Problem


@dataclass
class Drawn:
    """Groups sampled and scored, prompt-major: problem i's responses are rollouts[i*G : (i+1)*G]."""

    problems: list[Problem] = field(default_factory=list)  # [P]
    rollouts: list = field(default_factory=list)  # [P * G] sampler.Rollout
    results: list = field(default_factory=list)  # [P * G] rewards.RewardResult

    def __add__(self, other: "Drawn") -> "Drawn":
        return Drawn(self.problems + other.problems, self.rollouts + other.rollouts, self.results + other.results)

    def groups(self, picked: list[int], group_size: int) -> "Drawn":
        """The groups numbered `picked`, in that order."""
        rows = [i * group_size + j for i in picked for j in range(group_size)]
        return Drawn([self.problems[i] for i in picked], [self.rollouts[r] for r in rows],
                     [self.results[r] for r in rows])


def has_signal(results: list, drop_invalid: bool = False) -> bool:
    """Whether one group's rewards hold two different values among the members the advantages count
    (a PAPO stage's: those whose layout is valid).

    >>> from types import SimpleNamespace as R
    >>> has_signal([R(total=1.0, layout_ok=True), R(total=-1.0, layout_ok=True)])
    True
    >>> has_signal([R(total=1.0, layout_ok=True), R(total=-1.0, layout_ok=False)], drop_invalid=True)
    False
    """
    counted = {result.total for result in results if result.layout_ok or not drop_invalid}
    return len(counted) > 1


def fill_with_signal(first: Drawn, draw: Callable[[int], Drawn], wanted: int, group_size: int, max_draws: int,
                     drop_invalid: bool = False) -> tuple[Drawn, Drawn, dict]:
    """Draw until `wanted` groups carry a signal or `max_draws` draws are made (the first counts).
    `draw(d)` samples and scores the step's d-th extra draw (d = 1, 2, ...).
    -> (the groups to train on: the first `wanted` with a signal, everything drawn, what happened)"""
    everything, kept = first, []
    draws = 1
    while True:
        kept = [i for i in range(len(everything.problems))
                if has_signal(everything.results[i * group_size: (i + 1) * group_size], drop_invalid)]
        if len(kept) >= wanted or draws >= max_draws:
            break
        everything = everything + draw(draws)
        draws += 1
    trained = kept[:wanted]
    sampled = len(everything.problems)
    return everything.groups(trained, group_size), everything, {
        "draws": draws,  # sampler calls this step (1 = the step's own prompts were enough)
        "groups_sampled": sampled,
        "groups_trained": len(trained),  # < wanted only when the cap on draws was reached
        "groups_dropped": sampled - len(kept),  # one reward for the whole group
        "groups_unused": len(kept) - len(trained),  # with a signal, beyond the wanted number
    }
