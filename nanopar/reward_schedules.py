"""Reward schedules: which weighted reward spec a training step uses.

`Constant` (one spec every step), `Alternating` (Parallel-R1: 8 of every 10 steps accuracy, 2
`accuracy_parallel_bonus` as its code runs it; "alternating-strict" pays `parallel-strict` on those
2), `TwoPhase` (that scaffold, then accuracy), and `schedule_from_string` for a command-line flag.
A schedule's specs are checked when it is built, so every name they hold must be registered by
then: import these through `nanopar.rewards`, which registers the built-ins.
Not here: the rewards (rewards.py), the registry and specs (reward_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from . import NanoparError
from .reward_registry import parse_reward_spec


class RewardSchedule(Protocol):
    def spec(self, step: int) -> dict[str, float]:
        """The weighted reward spec to use at training step `step` (0-based)."""
        ...


@dataclass(frozen=True)
class Constant:
    """The same spec at every step."""

    weights: dict[str, float] | str = "accuracy"  # a spec: {name: weight} or "accuracy:1,format:0.2"

    def __post_init__(self):
        object.__setattr__(self, "weights", parse_reward_spec(self.weights))

    def spec(self, step: int) -> dict[str, float]:
        return dict(self.weights)


@dataclass(frozen=True)
class Alternating:
    """Parallel-R1's alternating reward: in each window, the last `parallel_steps` steps use the
    parallel spec, the others the accuracy spec (window 10, 2 parallel: steps 8, 9, 18, 19, ...).

    The defaults are its released code's (`compute_score` in
    verl/verl/utils/reward_score/math_dapo_acc_parallel_interved.py): accuracy when
    (global_step - 1) % 10 < 8, else `accuracy_parallel_bonus`. verl counts its first step as 1 and
    nanopar's `step` counts from 0, so step k is global_step k + 1: the same steps. With
    parallel_spec "parallel-strict" ("alternating-strict") the parallel steps pay only a correct answer
    in a valid parallel trace, the stricter reading of the write-up.

    >>> from nanopar import rewards  # registers the built-in rewards the specs name
    >>> s = Alternating()
    >>> [next(iter(s.spec(k))) for k in (0, 7, 8, 9, 10)]
    ['accuracy', 'accuracy', 'accuracy_parallel_bonus', 'accuracy_parallel_bonus', 'accuracy']
    """

    accuracy_spec: dict[str, float] | str = "accuracy"  # most steps: accuracy only
    parallel_spec: dict[str, float] | str = "accuracy_parallel_bonus"  # the rest: 1.2 correct in a block, 1.0 correct without
    window: int = 10  # steps per window
    parallel_steps: int = 2  # steps per window, at its end, that use `parallel_spec`

    def __post_init__(self):
        if self.window < 1 or not 0 <= self.parallel_steps <= self.window:
            raise NanoparError(
                f"alternating schedule needs window >= 1 and 0 <= parallel steps <= window, "
                f"got window={self.window}, parallel_steps={self.parallel_steps}"
            )
        object.__setattr__(self, "accuracy_spec", parse_reward_spec(self.accuracy_spec))
        object.__setattr__(self, "parallel_spec", parse_reward_spec(self.parallel_spec))

    def spec(self, step: int) -> dict[str, float]:
        in_parallel_part = step % self.window >= self.window - self.parallel_steps
        return dict(self.parallel_spec if in_parallel_part else self.accuracy_spec)


@dataclass(frozen=True)
class TwoPhase:
    """Parallel-R1's exploration scaffold: `scaffold` for steps < first_steps, then `after`
    (which counts its own steps from 0 at the switch).

    >>> from nanopar import rewards  # registers the built-in rewards the specs name
    >>> s = TwoPhase(first_steps=20)
    >>> s.spec(19), s.spec(20)
    ({'accuracy_parallel_bonus': 1.0}, {'accuracy': 1.0})
    """

    first_steps: int = 200  # steps of the scaffold phase (the paper: about 200)
    scaffold: RewardSchedule = field(default_factory=Alternating)  # phase 1
    after: RewardSchedule = field(default_factory=Constant)  # phase 2 (default: accuracy only)

    def __post_init__(self):
        if self.first_steps < 0:
            raise NanoparError(f"two-phase schedule needs first_steps >= 0, got {self.first_steps}")

    def spec(self, step: int) -> dict[str, float]:
        if step < self.first_steps:
            return self.scaffold.spec(step)
        return self.after.spec(step - self.first_steps)


def schedule_from_string(text: str) -> RewardSchedule:
    """A schedule from a command-line flag.

      "accuracy:1,format:0.2"                      Constant(that spec); also "constant:SPEC"
      "alternating[:WINDOW[:PARALLEL_STEPS]]"      Alternating as released (defaults 10, 2)
      "two-phase[:FIRST[:WINDOW[:PARALLEL_STEPS]]]" TwoPhase over it (defaults 200, 10, 2)
      "alternating-strict[...]", "two-phase-strict[...]"  the same, `parallel-strict` on the parallel steps

    >>> from nanopar import rewards  # registers the built-in rewards the specs name
    >>> schedule_from_string("two-phase-strict:100:5:1")
    TwoPhase(first_steps=100, scaffold=Alternating(accuracy_spec={'accuracy': 1.0}, parallel_spec={'parallel-strict': 1.0}, window=5, parallel_steps=1), after=Constant(weights={'accuracy': 1.0}))
    >>> schedule_from_string("alternating:ten")
    Traceback (most recent call last):
    ...
    nanopar.NanoparError: schedule 'alternating:ten': 'ten' is not a whole number (alternating[:WINDOW[:PARALLEL_STEPS]])
    """
    kind, _, rest = text.strip().partition(":")
    if kind == "constant":
        return Constant(rest)
    forms = {"alternating": "[:WINDOW[:PARALLEL_STEPS]]", "two-phase": "[:FIRST_STEPS[:WINDOW[:PARALLEL_STEPS]]]"}
    base = kind.removesuffix("-strict")
    if base not in forms:
        return Constant(text)
    numbers = []
    for part in rest.split(":") if rest else []:
        try:
            numbers.append(int(part))
        except ValueError:
            raise NanoparError(f"schedule {text!r}: {part!r} is not a whole number ({kind}{forms[base]})") from None
    if len(numbers) > (2 if base == "alternating" else 3):
        raise NanoparError(f"schedule {text!r}: too many numbers ({kind}{forms[base]})")
    parallel_spec = "parallel-strict" if kind.endswith("-strict") else "accuracy_parallel_bonus"
    if base == "alternating":
        return Alternating(parallel_spec=parallel_spec, **dict(zip(("window", "parallel_steps"), numbers)))
    first_steps = numbers[0] if numbers else 200
    return TwoPhase(first_steps, Alternating(parallel_spec=parallel_spec,
                                             **dict(zip(("window", "parallel_steps"), numbers[1:]))))
