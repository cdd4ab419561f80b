"""Evaluation: sample a benchmark, grade every response, and the papers' metrics over the records.

    records = evaluate(model, tokenizer, load_problems("aime24"), Policy.for_tokenizer(tokenizer), SamplerSettings(...), 16)
    summarize(records)["accuracy"]                      # Mean@16 (Parallel-R1), avg@8 (NPR) ...
    summarize(records, k=4)["pass_at_k"]                # unbiased pass@4 from 16 samples a problem

A *record* is one (problem, sample) as a JSON-ready dict: the problem (to grade it again), prompt
and response, its grade under the strict reading (as training grades) and the flexible one
(`#### N`, the last number; None where a checker grades), its structure
(`rollouts.response_structure`) and the rollout less what only training needs. Everything after
`evaluate` reads records only, so a saved samples.jsonl is summarised or re-scored without the
model: `summarize` (mean@k under both readings, unbiased pass@k, format-valid rate, parse
failures, the structure metrics of a GRPO step), `paired_difference` (two summaries of the same
problems), `rescore` (any reward spec on saved responses, on the trace the sampler read). This is what a training run's held-out
evaluation needs (heldout.py, results.py).
Not here: decode speed, NPR's speedup and a re-scored reward's distribution (eval_report.py, what
only eval.py reports); the command line, tables and files (eval.py); LLM judges, majority voting
(maj@k), confidence intervals.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable

from . import NanoparError, distributed
from .data import Problem
from .format import check_format
from .grading import grade, has_flexible_reading
from .metrics import structure_metrics
from .policy import Policy
from .prompts import build_prompt, stop_ids
from .rewards import RewardResult, parse_reward_spec, response_text, score
from .sampler import SamplerSettings, sample
from .rollouts import response_structure, rollout_record
from .tags import PARALLEL_R1, schema_named
from .trace import Trace, parse_tagged_ids, parse_trace
from .variance import split


def evaluate(
    model,
    tokenizer,
    problems: list[Problem],
    policy: Policy,  # tags, mode, temperature, vocabulary (Policy.for_tokenizer(tokenizer, ...))
    settings: SamplerSettings,  # budgets and draw knobs
    samples: int = 1,  # k: responses per problem
    instructions: str = "",  # put before each question (prompts.INSTRUCTIONS)
    chat: bool = True,  # wrap prompts in the tokenizer's chat template when it has one
    batch_size: int = 32,  # problems per sampler call (lanes: batch_size x samples x paths at most)
    progress: Callable[[int], None] | None = None,  # called after each call with the problems done so far
) -> list[dict]:
    """Sample `samples` responses to every problem and grade them: one record per (problem, sample),
    problem-major. Sampler call b is seeded with `settings.seed + b` (None stays None). Under
    torchrun the calls are dealt round-robin to the processes and their records gathered on every
    one in call order: the same records as one process makes (each call samples the same problems
    with the same seed), every process must call it.

    A rich progress bar plugs in as `progress=lambda done: bar.update(task, completed=done)`.
    """
    if samples < 1 or batch_size < 1:
        raise NanoparError(f"samples and batch size must be >= 1, got {samples} and {batch_size}")
    settings.check()
    eos = stop_ids(model, tokenizer)
    calls = list(enumerate(range(0, len(problems), batch_size)))  # (call b, its first problem)
    mine = []  # the records of each call this process makes: under torchrun every N-th, else all
    for batch, start in distributed.share(calls):
        chunk = problems[start : start + batch_size]
        prompts = [build_prompt(p, tokenizer, instructions, chat=chat) for p in chunk]
        rollouts = sample(model, prompts, policy, call_settings(settings, batch), eos, samples)
        # prompt-major: sample i % samples of problem i // samples
        mine.append([sample_record(rollout, chunk[i // samples], i % samples, tokenizer, eos) | {"batch": batch}
                     for i, rollout in enumerate(rollouts)])
        if progress is not None:
            progress(start + len(chunk))
    return [record for call in distributed.unshare(mine, "the gather of the evaluation's records") for record in call]


def sample_record(rollout, problem: Problem, sample_index: int, tokenizer, eos_ids: list[int]) -> dict:
    """One rollout of one problem as a JSON-ready record: problem, response, grade, structure."""
    text = response_text(rollout, tokenizer, eos_ids)
    result = score("accuracy", text, rollout.trace, problem)
    flexible = None  # a checker (the toy's) reads its own format, one way: no flexible reading
    if has_flexible_reading(problem):  # the flexible reading is the strict one wherever that finds an answer
        flexible = result.grade if result.grade.extracted is not None else grade(text, problem, flexible=True)
    rollout_fields = {k: v for k, v in rollout_record(rollout, tokenizer).items() if k not in TRAINING_ONLY}
    return {
        "id": problem.id,
        "source": problem.source,
        "sample": sample_index,
        "prompt": rollout_fields.pop("prompt"),
        "response": text,
        "answer": problem.answer,  # gold, as the data set gives it
        "extracted": result.grade.extracted,  # the strict reading (what rewards grade)
        "correct": result.grade.correct,
        "parse_error": result.grade.error,
        "read_as": result.grade.how,  # "boxed", "final answer" (None: none found, or a checker's)
        "flexible_extracted": None if flexible is None else flexible.extracted,  # all four None: not applicable
        "flexible_correct": None if flexible is None else flexible.correct,
        "flexible_error": None if flexible is None else flexible.error,
        "flexible_read_as": None if flexible is None else flexible.how,  # also "####", "last number"
        "schema": rollout.trace.schema.name,  # the tag schema the response was read with
        "format_ok": check_format(text, rollout.trace.schema).ok,  # the schema's rules (the `format` reward); a valid parallel trace: has_parallel
        **response_structure(rollout),  # blocks, paths, positions (token offsets), lengths, finish
        "question": problem.question,  # with answer and extra: the Problem again, for re-scoring
        "extra": problem.extra,
        **rollout_fields,  # ids, structure, stats (finish again: the same)
    }


TRAINING_ONLY = ("prompt_ids", "text", "sampled", "logprobs")  # rollout_record fields left out of a record


def call_settings(settings: SamplerSettings, batch: int) -> SamplerSettings:
    """The settings of sampler call `batch`: seeded `settings.seed + batch` (None stays None)."""
    return dataclasses.replace(settings, seed=None if settings.seed is None else settings.seed + batch)


# ----------------------------------------------------------------------------- metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k), computed as
    the product 1 - prod_{i=n-c+1}^{n} (1 - k / i), which stays exact-ish for large n.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4), pass_at_k(4, 3, 2)
    (0.25, 0.5, 0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise NanoparError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(records: list[dict], k: int | None = None) -> dict:
    """The metrics of one benchmark's records. `k` of pass@k defaults to the samples per problem.

    accuracy is mean@k: the mean over problems of (correct samples / samples), under the strict
    reading (what rewards use); `accuracy_flexible` is the same under the flexible reading.
    `accuracy_se` is its standard error with problems as the unit (the k samples of a problem are
    not independent): the standard deviation of the per-problem accuracies over sqrt(problems)
    (None for one problem); with k = 1 it is the binomial sqrt(p (1 - p) / (n - 1)).
    `per_problem` keeps each problem's accuracy ("source/id" -> correct / samples), so two
    evaluations of the same problems can be compared pair by pair (`paired_difference`).
    `accuracy_between` / `accuracy_within` split the variance of one response's grade into the
    spread of the problems' rates and the variance around its own rate (`variance.split`; None
    for one sample a problem): what more samples a problem would buy.
    `parallel_ratio_se` is the parallel ratio's standard error, problems as the unit likewise.
    `answers_found` / `answers_found_flexible` are the shares of responses in which each reading
    found an answer, `parse_failures` / `parse_failures_flexible` those it could not grade (no
    answer, or math-verify could not read it): a model that fails at the format, not at the maths,
    shows a flexible accuracy above the strict one. The flexible numbers are None unless every
    record has a flexible grading (a checker's problems have none; so do records saved before it).
    The structure numbers are `metrics.structure_metrics`, as a GRPO step reports them.
    """
    if not records:
        raise NanoparError("no records to summarize")
    correct: dict[tuple, list[bool]] = defaultdict(list)
    flexible: dict[tuple, list[bool]] = defaultdict(list)
    parallel: dict[tuple, list[bool]] = defaultdict(list)
    for r in records:
        correct[(r["source"], r["id"])].append(r["correct"])
        flexible[(r["source"], r["id"])].append(r.get("flexible_correct"))
        parallel[(r["source"], r["id"])].append(r["has_parallel"])
    both = all(r.get("flexible_correct") is not None for r in records)
    fewest = min(map(len, correct.values()))
    k = fewest if k is None else k
    if not 1 <= k <= fewest:
        raise NanoparError(f"pass@{k} needs 1 <= k <= the samples of every problem (fewest: {fewest})")
    return {
        "problems": len(correct),
        "samples": len(records),
        "k": k,
        "accuracy": statistics.fmean(sum(c) / len(c) for c in correct.values()),
        "accuracy_se": _standard_error([sum(c) / len(c) for c in correct.values()]),
        "per_problem": {f"{source}/{id_}": sum(c) / len(c) for (source, id_), c in correct.items()},
        **_split_of_accuracy(list(correct.values())),
        "accuracy_flexible": statistics.fmean(sum(c) / len(c) for c in flexible.values()) if both else None,
        "answers_found": _share_set(records, "extracted"),
        "answers_found_flexible": _share_set(records, "flexible_extracted") if both else None,
        "pass_at_k": statistics.fmean(pass_at_k(len(c), sum(c), k) for c in correct.values()),
        "format_valid": statistics.fmean(r["format_ok"] for r in records),
        "parse_failures": statistics.fmean(r["parse_error"] is not None for r in records),
        "parse_failures_flexible": _share_set(records, "flexible_error") if both else None,
        **structure_metrics(records),
        "parallel_ratio_se": _standard_error([sum(p) / len(p) for p in parallel.values()]),
    }


def paired_difference(before: dict, after: dict) -> tuple[float, float] | None:
    """(after - before, its standard error) in accuracy, two `summarize` results of the same
    problems compared problem by problem: the mean and standard error of the per-problem
    differences over the problems both hold. A problem hard for one model is mostly hard for the
    other, so this error is smaller than sqrt(se_before^2 + se_after^2), which treats the two as
    independent samples. None without `per_problem` (results saved before it was kept) or with
    fewer than two shared problems.

    >>> paired_difference({"per_problem": {"a": 0.0, "b": 0.5, "c": 1.0}},
    ...                   {"per_problem": {"a": 0.5, "b": 0.5, "c": 1.0, "d": 0.0}})  # differences 0.5, 0, 0
    (0.16666666666666666, 0.16666666666666666)
    """
    a, b = before.get("per_problem"), after.get("per_problem")
    shared = sorted(set(a) & set(b)) if a is not None and b is not None else []
    if len(shared) < 2:
        return None
    differences = [b[key] - a[key] for key in shared]
    return statistics.fmean(differences), _standard_error(differences)


def _split_of_accuracy(outcomes: list[list[bool]]) -> dict:
    """accuracy's variance between problems and within a problem (`variance.split`: None for one
    sample a problem, or problems sampled unequally, as a merged file may hold)."""
    parts = split(outcomes) if len(set(map(len, outcomes))) == 1 else None
    return {"accuracy_between": parts and parts["between"], "accuracy_within": parts and parts["within"]}


def _standard_error(values: list[float]) -> float | None:
    """The standard error of the mean of `values` (sample standard deviation / sqrt(n)).

    >>> round(_standard_error([1, 0, 0, 0]), 4)  # standard deviation 0.5, over sqrt(4)
    0.25
    """
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _share_set(records: list[dict], key: str) -> float | None:
    """The share of records whose `key` is set (not None); None when some record has no `key` (saved
    before it was recorded: an unknown is not counted as a no)."""
    if any(key not in r for r in records):
        return None
    return statistics.fmean(r[key] is not None for r in records)


# ----------------------------------------------------------------------------- re-scoring


def problem_of(record: dict, where: str = "record") -> Problem:
    """The Problem a record answers (id, question, gold answer, source, extra), to grade it again."""
    missing = [f for f in ("id", "answer", "response") if f not in record]
    if missing:
        raise NanoparError(f"{where}: no {', '.join(missing)} field (an eval.py samples.jsonl record has them)")
    return Problem(str(record["id"]), record.get("question", ""), record["answer"], record.get("source", ""),
                   record.get("extra", {}))


def rescore(records: list[dict], spec: str, where: str = "record") -> list[RewardResult]:
    """`rewards.score(spec, ...)` on every saved response, its trace as `record_trace` reads it:
    what GRPO paid for it, where the record keeps its token ids. `where` names the file in errors
    ("<where>:<line>")."""
    parse_reward_spec(spec)  # an unknown reward fails before any grading
    results = []
    for number, record in enumerate(records, 1):
        problem = problem_of(record, f"{where}:{number}")
        results.append(score(spec, record["response"], record_trace(record, f"{where}:{number}"), problem))
    return results


def record_trace(record: dict, where: str = "record") -> Trace:
    """The trace a reward reads of a saved response. A record that keeps its token ids and the tags'
    ids (`rollouts.rollout_record`) gives the sampler's own reading, the one training hands the
    reward: offsets in tokens, and a tag written as pieces of text is text. Any other (a record
    saved before, a trace written elsewhere) is read from its text: offsets in characters, so a
    reward that reads lengths or positions differs (`read_from_text` counts them)."""
    schema = schema_named(record.get("schema", PARALLEL_R1.name))
    if read_from_text(record):
        return parse_trace(record["response"], schema)
    try:
        return parse_tagged_ids(record["ids"], record["tag_ids"], schema)
    except NanoparError as error:
        raise NanoparError(f"{where}: {error}") from None


def read_from_text(record: dict) -> bool:
    """Whether `record_trace` reads the record's trace from its text (it keeps no token ids)."""
    return not ("ids" in record and "tag_ids" in record)
