"""The reward registry: a reward's name -> its function, a user's file of rewards, weighted specs.

`@register("name")` makes a reward selectable by name; `load_reward_file` imports a user's file of
them (train.py and eval.py's --reward-file); `parse_reward_spec` reads "accuracy:1,format:0.2"
into {name: weight}, every name known. Import these through `nanopar.rewards`, which registers the
built-in rewards before any spec names them.
Not here: the rewards themselves and scoring a rollout (rewards.py), which spec a step uses
(reward_schedules.py).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Callable

from . import NanoparError
from .data import Problem
from .trace import Trace

RewardFn = Callable[[str, Trace, Problem], float]  # fn(text, trace, problem) -> reward

REWARDS: dict[str, RewardFn] = {}
SCHEDULE_WORDS = {"constant", "alternating", "alternating-strict", "two-phase", "two-phase-strict"}  # no reward's name
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_FROM_FILE: dict[str, list[str]] = {}  # a loaded reward file (resolved path) -> the names it registered


def register(name: str, replace: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make a reward function selectable by `name` in specs and schedules."""
    if not _NAME.match(name) or name in SCHEDULE_WORDS:
        raise NanoparError(f"reward name {name!r} must be letters, digits, _ or - and not one of {sorted(SCHEDULE_WORDS)}")

    def add(fn: RewardFn) -> RewardFn:
        if name in REWARDS and not replace:
            raise NanoparError(f"reward {name!r} is already registered; use @register({name!r}, replace=True)")
        REWARDS[name] = fn
        return fn

    return add


def load_reward_file(path: str) -> list[str]:
    """Import a user's Python file so its `@register` rewards exist; return the names it added.
    Loading the same file again (a second command in one process) replaces its own rewards."""
    if not Path(path).is_file():
        raise NanoparError(f"reward file not found: {path}")
    key = str(Path(path).resolve())
    for name in _FROM_FILE.pop(key, []):
        REWARDS.pop(name, None)
    before = set(REWARDS)
    spec = importlib.util.spec_from_file_location(f"nanopar_user_rewards_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a bug in the user's file raises here, with its own traceback
    _FROM_FILE[key] = sorted(set(REWARDS) - before)
    return _FROM_FILE[key]


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`.

    >>> from nanopar import rewards  # registers the built-ins
    >>> get_reward("acuracy")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    nanopar.NanoparError: unknown reward 'acuracy'; known: accuracy, accuracy_parallel_bonus, ...
    """
    if name not in REWARDS:
        raise NanoparError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}")
    return REWARDS[name]


def parse_reward_spec(spec: str | dict[str, float]) -> dict[str, float]:
    """A weighted spec: "accuracy:1,format:0.2" -> {name: weight}; a bare name weighs 1.

    >>> from nanopar import rewards  # registers the built-ins
    >>> parse_reward_spec("accuracy:1, format:0.2"), parse_reward_spec("parallel")
    ({'accuracy': 1.0, 'format': 0.2}, {'parallel': 1.0})
    >>> parse_reward_spec("accuracy:high")
    Traceback (most recent call last):
    ...
    nanopar.NanoparError: reward spec 'accuracy:high': weight 'high' of 'accuracy' is not a number
    """
    if isinstance(spec, dict):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        items = []
        for part in spec.split(","):
            name, sep, weight = part.strip().partition(":")
            if not name.strip():
                raise NanoparError(f"reward spec {spec!r}: empty entry (expected name:weight, comma separated)")
            items.append((name.strip(), weight.strip() if sep else "1"))
    weights: dict[str, float] = {}
    for name, weight in items:
        get_reward(name)  # unknown names fail here, listing the known ones
        if name in weights:
            raise NanoparError(f"reward spec {spec!r}: {name!r} appears twice")
        try:
            weights[name] = float(weight)
        except (TypeError, ValueError):
            raise NanoparError(f"reward spec {spec!r}: weight {weight!r} of {name!r} is not a number") from None
    return weights
