"""A distill stage: sample a model's responses to problems and keep the traces worth training on.

Parallel-R1's cold start asks a strong model (--teacher) to write parallel traces zero-shot and
keeps those that pass the format check; NPR's rejection sampling asks the format-RL model itself.
Per problem, the first of `tries` responses that is correct and passes the recipe's filter is
kept; `KEEP` names the filters, each a judge of format.py:
  parallel    a valid parallel trace (`check_parallel`): exactly when the `parallel` reward pays +1
              (Parallel-R1's cold start keeps what passes its format check with a block in it);
  structured  a strictly formatted trace with one block or more (`check_structured`; under NPR a
              round of one plan too): NPR's rejection filter, its format score >= 0.
Not here: which model writes them, which filter a recipe uses, where they are saved (runner.py).
"""

from __future__ import annotations

from typing import Callable

from . import NanoparError, distributed
from .data import Problem
from .format import check_structured
from .policy import Policy
from .rewards import is_correct, response_text, score
from .sampler import SamplerSettings, sample
from .trace import Trace

KEEP = {  # filter name -> what it keeps, in words (`keeps` is the predicate)
    "parallel": "correct, valid parallel trace",
    "structured": "correct trace in the schema's format",
}


def keeps(keep: str, text: str, trace: Trace, problem: Problem) -> bool:
    """Whether the filter `keep` keeps a response (`text`, read as `trace`) to `problem`."""
    if keep == "parallel":
        return score("parallel", text, trace, problem).total > 0  # correct and a valid parallel trace
    if keep == "structured":
        return check_structured(text, trace.schema).ok and is_correct(text, problem)
    raise NanoparError(f"unknown distill filter {keep!r}: use one of {', '.join(KEEP)}")


def keep_traces(model, tokenizer, policy: Policy, problems: list[Problem], prompt_of: Callable[[Problem], list[int]],
                settings_of: Callable[[int], SamplerSettings], eos: list[int], tries: int, chunk: int,
                done: Callable[[int, int], None] | None = None, keep: str = "parallel") -> list[dict]:
    """Sample `tries` responses per problem, `chunk` problems per sampler call (call i starting at
    problem `start` uses `settings_of(start)`), and keep per problem the first response the filter
    `keep` (a `KEEP` name) keeps, as an SFT record (id, question, answer, response).
    `done(problems seen, kept)` after each call, for a progress bar. Under torchrun the calls are
    dealt round-robin to the processes and the kept records gathered in call order on every one."""
    if keep not in KEEP:
        raise NanoparError(f"unknown distill filter {keep!r}: use one of {', '.join(KEEP)}")
    mine = []  # the kept records of each call this process makes: under torchrun every N-th, else all
    for start in distributed.share(list(range(0, len(problems), chunk))):
        batch = problems[start : start + chunk]
        rollouts = sample(model, [prompt_of(p) for p in batch], policy, settings_of(start), eos, tries)
        kept = []
        for k, problem in enumerate(batch):
            for rollout in rollouts[k * tries : (k + 1) * tries]:
                text = response_text(rollout, tokenizer, eos)
                if keeps(keep, text, rollout.trace, problem):
                    kept.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                                 "response": text})
                    break
        mine.append(kept)
        if done is not None:
            done(start + len(batch), sum(map(len, mine)))
    return [record for call in distributed.unshare(mine, "the gather of the kept traces") for record in call]
