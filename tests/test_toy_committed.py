"""The committed teacher (nanopar/toy/committed.py), each rule checked against the problem's routes
enumerated here (task.routes), not against the teacher's own helpers: a chain that stays with an
approach after a miss, a block whose paths are different approaches, each approach opened by its
route closest to the target, and the same attempts and budgets for both."""

from __future__ import annotations

import functools
import math
import random
import statistics

import pytest
from test_toy import DEFAULTS, blocks_of, budget_needed, replay

from nanopar.format import check_format, check_parallel
from nanopar.tags import NPR, PARALLEL_R1, TagIds
from nanopar.toy import FINAL, LEVELS, grade_countdown, make_problems, routes, teacher_traces, toy_tokenizer
from nanopar.toy.committed import (LOCAL_TRIES, WRONG_APPROACHES, committed_chain, committed_parallel_trace,
                                   committed_sequential_trace)


@functools.lru_cache(maxsize=None)
def routes_by_move(numbers: tuple[int, ...]) -> dict[str, list]:
    """Every legal route of `numbers` (task.routes), by its first move."""
    found: dict[str, list] = {}
    for r in routes(list(numbers)):
        found.setdefault(r.steps[0].partition("=")[0], []).append(r)
    return found


def closest(problem, move: str) -> set[str]:
    """The attempt texts' routes ("a+b=c,...") of `move` closest to the target, enumerated here."""
    target = problem.extra["target"]
    mine = routes_by_move(tuple(problem.extra["numbers"]))[move]
    best = min(abs(r.value - target) for r in mine)
    return {",".join(r.steps) for r in mine if abs(r.value - target) == best}


def reaches(problem, move: str) -> bool:
    return any(r.value == problem.extra["target"] for r in routes_by_move(tuple(problem.extra["numbers"]))[move])


def move_of(attempt: str) -> str:
    return attempt.partition("=")[0]


@pytest.fixture(scope="module")
def problems():
    return {level: make_problems(level, 300, seed=11) for level in LEVELS}


def approaches_of(attempts: list[str]) -> list[tuple[str, list[str]]]:
    """Consecutive attempts grouped by their first move: [(move, [attempt, ...]), ...]."""
    groups: list[tuple[str, list[str]]] = []
    for attempt in attempts:
        if groups and groups[-1][0] == move_of(attempt):
            groups[-1][1].append(attempt)
        else:
            groups.append((move_of(attempt), [attempt]))
    return groups


def test_the_chain_stays_with_an_approach_after_a_miss_then_takes_the_right_one(problems):
    """Each approach opens with its route closest to the target; a wrong one (none of its routes
    reaches the target) is varied LOCAL_TRIES more times before the chain leaves it, never to
    come back; the right approach's closest route reaches the target and ends the chain."""
    given_up, tries = [], []
    for level, ps in problems.items():
        for p in ps:
            trace = committed_sequential_trace(p, random.Random(p.id))
            *attempts, final = trace.split("\n")
            assert grade_countdown(trace, p).correct and final.startswith(FINAL + " "), trace
            for a in attempts:
                replay(a, p.extra["numbers"], p.extra["target"], LEVELS[level].bound)
            assert len(set(attempts)) == len(attempts), trace
            groups = approaches_of(attempts)
            assert len({move for move, _ in groups}) == len(groups), trace  # no approach taken twice
            for i, (move, lines) in enumerate(groups):
                assert lines[0].split("vs")[0] in closest(p, move), trace
                if i < len(groups) - 1:
                    assert not reaches(p, move) and all(line.endswith("no") for line in lines), trace
                    assert len(lines) - 1 in LOCAL_TRIES or len(lines) == len(routes_by_move(tuple(p.extra["numbers"]))[move]), trace
                    tries.append(len(lines) - 1)
                else:
                    assert lines == lines[:1] and reaches(p, move) and "yes so" in lines[0], trace
            given_up.append((level, len(groups) - 1))
    for level, most in WRONG_APPROACHES.items():
        assert {n for lv, n in given_up if lv == level} == set(range(most + 1)), given_up
    assert set(tries) == set(LOCAL_TRIES)


def test_an_exploring_block_holds_different_approaches_each_at_its_closest_route(problems):
    """From the same generator state, the block trace makes at least the chain's attempts (a block
    never tries fewer routes) in ceil(attempts / 3) blocks of 3, every path another approach opened
    by its closest route; only the right approach reaches the target, in the last block."""
    covered = {"chain": [], "block": []}
    for level, ps in problems.items():
        for p in ps:
            chain = committed_chain(p, random.Random(p.id))
            trace = committed_parallel_trace(p, random.Random(p.id), kind="exploration")
            assert check_format(trace).ok and grade_countdown(trace, p).correct, trace
            blocks = blocks_of(trace, PARALLEL_R1)
            assert check_parallel(trace).ok == bool(blocks), trace
            wrong = {m for m in routes_by_move(tuple(p.extra["numbers"])) if not reaches(p, m)}
            if not wrong:  # every approach reaches the target: nothing to explore; easy verifies, hard is the chain
                alone = committed_parallel_trace(p, random.Random(p.id), kind="verification") if level == "easy" else \
                    committed_sequential_trace(p, random.Random(p.id))
                assert len(chain) == 1 and trace == alone, trace
                continue
            paths = [path for _, branches, _ in blocks for path in branches]
            moves = [move_of(path) for path in paths]
            assert len(set(moves)) == len(moves), trace
            if len(wrong) + 1 >= 3 * math.ceil(len(chain) / 3):  # enough wrong approaches for every block
                assert [len(b) for _, b, _ in blocks] == [3] * math.ceil(len(chain) / 3), (len(chain), trace)
            for i, (_, branches, summary) in enumerate(blocks):
                last = i == len(blocks) - 1
                hits = [b for b in branches if "yes so" in b]
                assert len(hits) == last and summary == (hits[0].split("yes so ")[1] if last else "no"), trace
                for b in branches:
                    replay(b, p.extra["numbers"], p.extra["target"], LEVELS[level].bound)
                    assert b.split("vs")[0] in closest(p, move_of(b)), trace
            covered["chain"].append(len({move_of(r.steps[0]) for r in chain}))  # the chain's approaches, each one stretch
            covered["block"].append(len(paths))
    # what the two teachers differ in: approaches covered, per trace, for the same attempts drawn
    assert statistics.mean(covered["block"]) > 1.5 * statistics.mean(covered["chain"]), {
        k: statistics.mean(v) for k, v in covered.items()}


def test_a_verifying_trace_is_the_chain_then_a_block_of_checks(problems):
    for p in problems["easy"][:100]:
        chain = committed_sequential_trace(p, random.Random(p.id))
        trace = committed_parallel_trace(p, random.Random(p.id), kind="verification")
        *attempts, answer = chain.split("\n")
        lines = trace.split("\n")
        assert lines[:len(attempts)] == attempts and lines[-1] == answer, trace
        ((_, checks, summary),) = blocks_of(lines[len(attempts)], PARALLEL_R1)
        assert len(checks) == 3 and all(c.endswith("yes") for c in checks) and summary == answer.split(" ", 2)[2]


def test_the_committed_mixes_fit_the_budgets_and_refuse_what_they_cannot_write(problems):
    tk = toy_tokenizer()
    tags = TagIds.from_tokenizer(tk, PARALLEL_R1)
    for name, shares in (("toy:committed", {"easy": 0.5, "hard": 0.5}), ("toy:parallel-committed", {"easy": 0.75, "hard": 0.25}),
                         ("toy:parallel-committed-half", {"easy": 0.5, "hard": 0.5})):
        records = teacher_traces(name, n=800)
        assert {level: sum(r["id"].startswith(f"toy-{level}") for r in records) / len(records) for level in shares} == shares
        for r in records:
            ids = tk.encode(r["response"], add_special_tokens=False)
            starts = [i for i, token in enumerate(ids) if token == tags.path_open]
            assert all(ids.index(tags.path_close, at) - at <= DEFAULTS.max_path_tokens for at in starts), r["response"]
            assert ids.count(tags.block_open) <= DEFAULTS.max_blocks and max(budget_needed(ids, tags)) <= DEFAULTS.max_new_tokens
    p = problems["hard"][0]
    with pytest.raises(ValueError, match="rounds"):
        committed_parallel_trace(p, random.Random(0), schema=NPR)
    with pytest.raises(ValueError, match="easy problems only"):
        committed_parallel_trace(p, random.Random(0), kind="verification")
    with pytest.raises(ValueError, match="unknown committed trace kind"):
        committed_parallel_trace(p, random.Random(0), kind="correction")
