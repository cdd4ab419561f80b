"""A distill stage: sample a model's responses to problems and keep the traces worth training on.

Parallel-R1's cold start asks a strong model (--teacher) to write parallel traces zero-shot and
keeps those that pass the format check; NPR's rejection sampling asks the format-RL model itself.
Both keep, per problem, the first of `tries` responses that is correct *and* a valid parallel
trace in the run's schema: exactly when the `parallel` reward pays +1 (rewards.py, so the
predicate lives in one place). Not here: which model writes them, where they are saved (runner.py).
"""

from __future__ import annotations

from typing import Callable

from .data import Problem
from .policy import Policy
from .rewards import response_text, score
from .sampler import SamplerSettings, sample


def keep_traces(model, tokenizer, policy: Policy, problems: list[Problem], prompt_of: Callable[[Problem], list[int]],
                settings_of: Callable[[int], SamplerSettings], eos: list[int], tries: int, chunk: int,
                done: Callable[[int, int], None] | None = None) -> list[dict]:
    """Sample `tries` responses per problem, `chunk` problems per sampler call (call i starting at
    problem `start` uses `settings_of(start)`), and keep one correct, valid parallel trace per
    problem as an SFT record (id, question, answer, response). `done(problems seen, kept)` after
    each call, for a progress bar."""
    kept = []
    for start in range(0, len(problems), chunk):
        batch = problems[start : start + chunk]
        rollouts = sample(model, [prompt_of(p) for p in batch], policy, settings_of(start), eos, tries)
        for k, problem in enumerate(batch):
            for rollout in rollouts[k * tries : (k + 1) * tries]:
                text = response_text(rollout, tokenizer, eos)
                if score("parallel", text, rollout.trace, problem).total > 0:  # correct and a valid parallel trace
                    kept.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                                 "response": text})
                    break
        if done is not None:
            done(start + len(batch), len(kept))
    return kept
