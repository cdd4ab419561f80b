"""A distill stage: sample a model's responses to problems and keep the traces worth training on.

Parallel-R1's cold start asks a strong model (--teacher) to write parallel traces zero-shot and
keeps those that pass the format check; NPR's rejection sampling asks the format-RL model itself.
Per problem, the first of `tries` responses that is correct and passes the recipe's filter is
kept; `KEEP` names the filters, each a judge of format.py:
  parallel    a valid parallel trace (`check_parallel`): exactly when the `parallel-strict` reward pays +1
              (Parallel-R1's cold start keeps what passes its format check with a block in it);
  structured  a strictly formatted trace with one block or more (`check_structured`; under NPR a
              round of one plan too): NPR's rejection filter, its format score >= 0.
A response the sampler's budgets shaped is never kept, whatever the filter says (`budget_cuts`):
a path closed by an inserted close tag at `max_path_tokens`, a block tag banned after
`max_blocks` blocks, a plan banned at NPR's cap, a response ended by `max_new_tokens`. Those
budgets bound what a policy under training may write; a teacher's trace is data, and a cut one
would teach the student to stop a path mid-attempt where the teacher did not (the only budget
NPR's rejection sampling gives its engine is the response's, in
npr-beta/sampling/rejection_sampling.py). Such tries are counted (`Distilled`), and the next try
of the problem may still be kept.
`nothing_kept` is the error of a stage that kept none. Not here: which model writes them, which filter a
recipe uses, where they are saved (runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from . import NanoparError, distributed
from .data import Problem
from .format import check_structured
from .policy import Policy
from .rewards import is_correct, response_text, score
from .sampler import Rollout, SamplerSettings, sample
from .trace import Trace

KEEP = {  # filter name -> what it keeps, in words (`keeps` is the predicate)
    "parallel": "correct, valid parallel trace",
    "structured": "correct trace in the schema's format",
}


def keeps(keep: str, text: str, trace: Trace, problem: Problem) -> bool:
    """Whether the filter `keep` keeps a response (`text`, read as `trace`) to `problem`."""
    if keep == "parallel":
        return score("parallel-strict", text, trace, problem).total > 0  # correct and a valid parallel trace
    if keep == "structured":
        return check_structured(text, trace.schema).ok and is_correct(text, problem)
    raise NanoparError(f"unknown distill filter {keep!r}: use one of {', '.join(KEEP)}")


BUDGET_CUTS = {  # budget_cuts' names -> what the sampler did to the response, in words
    "path": "a path closed at --max-path-tokens",
    "blocks": "the block tag banned after --max-blocks blocks",
    "plans": "a plan banned at the plan cap (--paths)",
    "length": "ended by --max-new-tokens",
}


def budget_cuts(rollout: Rollout, settings: SamplerSettings) -> list[str]:
    """The sampler budgets (`BUDGET_CUTS` names) that shaped `rollout`, drawn with `settings`; [] for a
    response the model wrote freely. Read from what the sampler reports: an inserted close tag
    (`cut_paths`; structured: an EOS inside a path too); `max_blocks` blocks opened (every draw after
    the last one had the block tag banned: a kept trace always draws its answer after it); a
    guideline of `paths` plans under a schema with plans (the draw after the last plan had <plan>
    banned); the response budget spent (`finish` "length")."""
    cuts = []
    if rollout.stats.cut_paths:
        cuts.append("path")
    if rollout.stats.forks >= settings.max_blocks:
        cuts.append("blocks")
    if rollout.trace.schema.planned and any(len(b.plans) >= settings.paths for b in rollout.trace.blocks):
        cuts.append("plans")
    if rollout.finish == "length":
        cuts.append("length")
    return cuts


@dataclass
class Distilled:
    records: list[dict]  # the kept traces, one per problem at most: id, question, answer, response
    dropped: int  # tries the filter kept that a budget cut (`budget_cuts`), not kept
    cuts: dict[str, int]  # per BUDGET_CUTS name, the dropped tries it cut (a try may count under two)


def keep_traces(model, tokenizer, policy: Policy, problems: list[Problem], prompts: list[list[int]],
                settings: SamplerSettings, eos: list[int], tries: int, chunk: int, keep: str = "parallel",
                done: Callable[[int, int], None] | None = None) -> Distilled:
    """Sample `tries` responses per problem (its prompt ids: `prompts`), `chunk` problems per
    sampler call (the call starting at problem `start` seeded with `settings.seed + start`, unless None), and
    keep per problem the first response the filter `keep` (a `KEEP` name) keeps and no budget cut
    (`budget_cuts`), as an SFT record (id, question, answer, response). `done(problems seen, kept)`
    after each call, for a progress bar. Under torchrun the calls are dealt round-robin to the
    processes and the kept records gathered in call order on every one, with the dropped tries."""
    if keep not in KEEP:
        raise NanoparError(f"unknown distill filter {keep!r}: use one of {', '.join(KEEP)}")
    mine = []  # (kept records, dropped tries, their cuts) of each call this process makes: under torchrun every N-th, else all
    for start in distributed.share(list(range(0, len(problems), chunk))):
        batch = problems[start : start + chunk]
        seeded = replace(settings, seed=None if settings.seed is None else settings.seed + start)
        rollouts = sample(model, prompts[start : start + chunk], policy, seeded, eos, tries)
        kept, dropped, cut = [], 0, dict.fromkeys(BUDGET_CUTS, 0)
        for k, problem in enumerate(batch):
            for rollout in rollouts[k * tries : (k + 1) * tries]:
                text = response_text(rollout, tokenizer, eos)
                if not keeps(keep, text, rollout.trace, problem):
                    continue
                cuts = budget_cuts(rollout, settings)
                dropped += bool(cuts)
                for name in cuts:
                    cut[name] += 1
                if not cuts:
                    kept.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                                 "response": text})
                    break
        mine.append((kept, dropped, cut))
        if done is not None:
            done(start + len(batch), sum(len(records) for records, _, _ in mine))
    calls = distributed.unshare(mine, "the gather of the kept traces")
    return Distilled([record for records, _, _ in calls for record in records], sum(n for _, n, _ in calls),
                     {name: sum(cut[name] for _, _, cut in calls) for name in BUDGET_CUTS})


def nothing_kept(stage, problems: int, recipe: str) -> str:
    """The one-line error of a distill stage that kept no trace of `problems` problems: what to do
    instead under the run's recipe."""
    fix = ("give ready traces with --sft-data" if recipe == "parallel-r1" else
           "NPR distils its own traces, so it needs a model that follows its format some of the time "
           "(an instruct model prompted with it): raise --distill-tries or --rl-easy-steps (format RL), "
           "or run --recipe parallel-r1, whose cold start reads --sft-data")
    return f"{stage.name}: no {KEEP[stage.keep]} in {problems} problems; the model cannot write them yet: {fix}"
