"""Tests of nanopar.toy: the Countdown-style task, its checker, the teacher, the tokenizer and config.

Fast (a few seconds): 600 traces of each kind, every one format-checked, graded, re-derived step
by step and round-tripped through the tokenizer.
"""

import collections
import hashlib
import itertools
import json
import math
import random
import re
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanopar.curriculum import TrainConfig
from nanopar.data import Problem
from nanopar.format import check_format, check_parallel
from nanopar.model import ModelSettings, load_model
from nanopar.tags import NPR, PARALLEL_R1, TagIds, add_tag_tokens
from nanopar.toy import (
    FINAL,
    LEVELS,
    PARALLEL_PATHS,
    TEACHER_MIXES,
    TRACE_KINDS,
    VERIFICATION_SHARE,
    attempt_count,
    check_countdown,
    eval_expression,
    extract_toy_answer,
    grade_countdown,
    heldout,
    is_heldout,
    make_problems,
    npr_trace,
    parallel_trace,
    routes,
    sequential_trace,
    teacher_traces,
    toy_model_config,
    toy_tokenizer,
)
from nanopar.trace import parse_ids, parse_trace, trace_stats

N = 600  # traces of each kind
STEP = re.compile(r"^(\d+)([-+*])(\d+)=(\d+)$")
# Token bounds (mean, max) the teacher keeps, with room above the lengths docs/toy.md gives
BOUNDS = {"easy-sequential": (70, 130), "hard-sequential": (80, 130), "easy-parallel": (115, 165),
          "easy-npr": (135, 195), "exploration": (105, 160), "verification": (130, 165),
          "npr-exploration": (130, 185), "npr-verification": (145, 195), "correction": (135, 170),
          "npr-correction": (140, 175)}
DEFAULTS = TrainConfig()  # the toy's sampler budgets: max_new_tokens, max_path_tokens, max_blocks
MAX_PATH_TOKENS = DEFAULTS.max_path_tokens  # 48: a step (label, attempt or check, </step>) must fit
# sha256 of json.dumps(teacher_traces(name), sort_keys=True) in Parallel-R1's tags: the base model of
# the default run is trained on "toy:sequential" and must not move by accident (git log says when
# and why they last moved on purpose).
PARALLEL_R1_TRACES = {
    "toy:sequential": "987bf03d27784d43512207405f770cb0d45c271ddef0ff4a5fd96f678be968b7",
    "toy:instruct": "a1283362bee0904c28e1cf3424c563ad000df407088df7ae7c94aa22a6c70153",
    "toy:parallel": "ebac06e343a3ba4488a357c5ddefeb31e7378f98e23c82dde3b128f5f33d0dfc",
    "toy:checked": "9a993de495c00e9b5c45c8baf31686ada302348f2319ab62f1f735948be9cc61",
    "toy:committed": "915688d502dc486335580cac46560d51cfe8ceb211c5c82bbf1693398151d4b7",
    "toy:parallel-committed": "1280a73f1e8c40750858f72f73dd9d285e81dc75a970446c3239e63172299742",
    "toy:parallel-committed-half": "feb8f74041983815751502d45989af1b520cb0f504830ddd71a4368d8c70c2d5",
}


def known_problem():
    """numbers 5 9 8 target 12, answer (9+8)-5, written out (not drawn: independent of the generator)."""
    return Problem("t", "numbers 5 9 8 target 12", "(9+8)-5", "toy-easy",
                   {"numbers": [5, 9, 8], "target": 12, "level": "easy", "checker": "countdown",
                    "steps": ["9+8=17", "17-5=12"]})


def key(problem):
    return tuple(sorted(problem.extra["numbers"])), problem.extra["target"]


@pytest.fixture(scope="module")
def problems():
    return {level: make_problems(level, N, seed=1) for level in LEVELS}


@pytest.fixture(scope="module")
def traces(problems):
    rng = random.Random(0)
    return {
        "easy-sequential": [(p, sequential_trace(p, rng)) for p in problems["easy"]],
        "hard-sequential": [(p, sequential_trace(p, rng)) for p in problems["hard"]],
        "easy-parallel": [(p, parallel_trace(p, rng)) for p in problems["easy"]],
    }


@pytest.fixture(scope="module")
def npr_traces(problems):
    rng = random.Random(0)
    return [(p, npr_trace(p, rng)) for p in problems["easy"]]


@pytest.fixture(scope="module")
def kinds(problems):
    """(problem, sequential trace, parallel trace) for each kind in each schema ("exploration",
    "npr-verification", ...), the two traces written from the same generator state."""
    out = {}
    for name, write in (("", parallel_trace), ("npr-", npr_trace)):
        for kind in TRACE_KINDS:
            rows = []
            for i, p in enumerate(problems["easy"]):
                rows.append((p, sequential_trace(p, random.Random(i)), write(p, random.Random(i), kind=kind)))
            out[name + kind] = rows
    return out


@pytest.fixture(scope="module")
def npr_tokenizer():
    tokenizer = toy_tokenizer()
    add_tag_tokens(tokenizer, None, NPR)
    return tokenizer


@pytest.fixture(scope="module")
def held():
    return {level: heldout(level) for level in LEVELS}


@pytest.fixture(scope="module")
def tokenizer():
    return toy_tokenizer()


# --------------------------------------------------------------------------- the task


def test_generators_are_seeded(held):
    for level in LEVELS:
        assert make_problems(level, 50, seed=3) == make_problems(level, 50, seed=3)
        assert [p.question for p in make_problems(level, 50, seed=3)] != [p.question for p in make_problems(level, 50, seed=4)]
        assert heldout(level) == held[level]
    assert make_problems("easy", 3, seed=7)[:2] == make_problems("easy", 2, seed=7)  # a prefix of a longer draw


def test_heldout_is_fixed_distinct_and_disjoint_from_training(held):
    for level in LEVELS:
        split, n, tenths = held[level], LEVELS[level].heldout_problems, LEVELS[level].heldout_tenths
        assert len(split) == n == 560 and len({key(p) for p in split}) == n
        assert len({p.id for p in split}) == n and all(p.id.startswith(f"toy-{level}-heldout:") for p in split)
        assert all(is_heldout(*key(p), tenths) for p in split)
        assert heldout(level, 150) == split[:150]  # a shorter evaluation takes the first problems
        train = [p for seed in range(4) for p in make_problems(level, 1000, seed)]
        assert not {key(p) for p in train} & {key(p) for p in split}
        assert not any(is_heldout(*key(p), tenths) for p in train)
        assert len({key(p) for p in train}) > 1000  # not tiny: easy ~1,100 distinct in 4,000 draws, hard more
    # the split's shares by checksum, counted over the whole easy world (every route's target)
    easy = {(tuple(sorted(ns)), r.value) for ns in itertools.combinations_with_replacement(range(1, 10), 3)
            for r in routes(ns)}
    share = sum(is_heldout(ns, t, LEVELS["easy"].heldout_tenths) for ns, t in easy) / len(easy)
    assert 1800 < len(easy) < 2000 and abs(share - 0.3) < 0.03


def test_problems_are_well_formed_and_solvable(problems):
    for level, spec in LEVELS.items():
        for p in problems[level]:
            numbers, target = p.extra["numbers"], p.extra["target"]
            assert p.extra["level"] == level and p.extra["checker"] == "countdown" and p.source == f"toy-{level}"
            assert p.question == f"numbers {' '.join(map(str, numbers))} target {target}"
            assert len(numbers) == spec.count and all(spec.low <= n <= spec.high for n in numbers)
            assert 1 <= target <= spec.bound
            assert check_countdown(p.answer, p)
            assert replay(",".join(p.extra["steps"]) + f"vs{target}yes so {p.answer}", numbers, target, spec.bound) == target
    assert len({p.id for p in problems["easy"]}) == N


def test_routes_enumerate_every_legal_route():
    assert len(routes([3, 7, 12])) == 22  # 3 pairs x 3 ops x 3 ops, less 5 over 100 (252 three times, 105, 120)
    assert len(routes([3, 7, 12], bound=150)) == 24  # only the three products 252 are over 150
    assert {r.value for r in routes([2, 2])} == {4}  # 2-2 = 0 is not positive; 2+2, 2*2 are one text each
    assert [r.steps for r in routes([2, 2])] == [("2+2=4",), ("2*2=4",)]
    easy, hard = (make_problems(level, 100, seed=9) for level in LEVELS)
    solving = [sum(r.value == p.extra["target"] for r in routes(p.extra["numbers"])) / len(routes(p.extra["numbers"]))
               for p in easy + hard]
    assert statistics.mean(solving) < 0.2  # a random route rarely checks out: trying several helps


# --------------------------------------------------------------------------- checking


def test_checker_accepts_correct_and_rejects_wrong_answers():
    p = known_problem()
    for right in ["(9+8)-5", "9+8-5", " 8 + 9 - 5 ", "((9)+(8))-5"]:
        assert check_countdown(right, p), right
    wrong = {
        "a number used twice": "(9+8)-5+5-5",
        "a missing number": "9+8",
        "a number not given": "(9+8)-5+1-1",
        "a wrong value": "9+8+5",
        "garbage": "twelve",
        "an equation": "9+8-5=12",
        "unary minus": "-5+9+8",
        "division": "(9+8)-5/1",
        "a leading zero": "(9+8)-05",
        "unclosed": "((9+8)-5",
        "too many closers": "(9+8))-5",
        "an empty answer": "",
        "too long": "(" * 150 + "9+8-5" + ")" * 150,
    }
    for why, answer in wrong.items():
        assert not check_countdown(answer, p), why
    assert not check_countdown(None, p)
    with pytest.raises(ValueError):
        eval_expression("9+8-")


def test_extract_toy_answer():
    assert extract_toy_answer("x\nFinal Answer: 1+2\ny\nFinal Answer:  (3*4)+5 \n") == "(3*4)+5"
    assert extract_toy_answer("Final Answer:") is None
    assert extract_toy_answer("3+4=7vs7yes") is None
    assert extract_toy_answer(None) is None


# --------------------------------------------------------------------------- the teacher


def replay(attempt: str, numbers: list[int], target: int, bound: int) -> int:
    """Check one attempt "a+b=c,...vsTno" or "...vsTyes so EXPR" step by step; return its value.
    EXPR must be the same route as the steps: it uses the numbers once each and has their value."""
    body, verdict, expression = re.fullmatch(r"(.*)vs(\d+)(?:(no)|yes so (.+))", attempt).group(1, 3, 4)
    verdict = "no" if verdict else "yes"
    if expression is not None:
        value, used = eval_expression(expression)
        assert value == target and sorted(used) == sorted(numbers), attempt
    pool = sorted(numbers)
    for step in body.split(","):
        a, op, b, value = STEP.match(step).groups()
        a, b, value = int(a), int(b), int(value)
        assert a >= b and value == {"+": a + b, "-": a - b, "*": a * b}[op] and 1 <= value <= bound, step
        pool.remove(a)
        pool.remove(b)  # each operand must be in the pool: a number or an earlier result
        pool.append(value)
    assert len(pool) == 1 and verdict == ("yes" if value == target else "no"), attempt
    assert attempt.split("vs")[1].startswith(str(target))
    return value


def test_sequential_traces_pass_format_and_grade_correct(traces):
    for kind in ("easy-sequential", "hard-sequential"):
        attempts_seen = set()
        for p, trace in traces[kind]:
            level = LEVELS[p.extra["level"]]
            assert check_format(trace).ok and "<" not in trace, trace
            assert check_countdown(extract_toy_answer(trace), p), trace
            *attempts, final = trace.split("\n")
            assert final.startswith(FINAL + " ") and 1 <= len(attempts) <= level.attempts
            for i, attempt in enumerate(attempts):
                last = i == len(attempts) - 1
                assert attempt.endswith(f"yes so {p.answer}" if last else "no"), trace
                replay(attempt, p.extra["numbers"], p.extra["target"], level.bound)
            assert len(set(attempts)) == len(attempts)
            attempts_seen.add(len(attempts))
        assert attempts_seen == set(range(1, LEVELS[kind.split("-")[0]].attempts + 1))  # every position occurs


def blocks_of(trace: str, schema) -> list[tuple[list[str] | None, list[str], str]]:
    """(plans, branches, summary) of each block, read with regular expressions (not nanopar.trace);
    an NPR step's label is checked against its place and cut off, as is a plan's."""
    t, e = schema, re.escape
    inside = lambda open_, close, text: re.findall(f"{e(open_)}(.*?){e(close)}", text)  # noqa: E731
    if not t.planned:
        found = re.findall(f"{e(t.block_open)}(.*?){e(t.block_close)}{e(t.summary_open)}(.*?){e(t.summary_close)}", trace)
        return [(None, inside(t.path_open, t.path_close, body), summary) for body, summary in found]
    found = re.findall(f"{e(t.block_open)}(.*?){e(t.plans_close)}(.*?){e(t.summary_open)}(.*?){e(t.summary_close)}", trace)
    rounds = []
    for plans, steps, takeaway in found:
        plans, steps = inside(t.plan_open, t.plan_close, plans), inside(t.path_open, t.path_close, steps)
        assert len(plans) == len(steps), trace
        for k, text in enumerate(plans + steps):
            assert text.startswith(f"{k % len(plans) + 1}:"), trace  # plan i and step i open with "i:"
        rounds.append(([p.partition(":")[2] for p in plans], [s.partition(":")[2] for s in steps], takeaway))
    return rounds


EQUATION = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")


def true_equation(text: str) -> tuple[int, str, int, int]:
    """(x, op, y, v) of "x op y=v", asserting it holds ("/" exactly: x = y * v)."""
    x, op, y, v = EQUATION.fullmatch(text).groups()
    x, y, v = int(x), int(y), int(v)
    assert (x == y * v) if op == "/" else v == {"+": x + y, "-": x - y, "*": x * y}[op], text
    return x, op, y, v


def verify_redo(text: str, p: Problem, steps: list[str]) -> bool:
    """The route of `steps` recomputed, every equation true, operands from the pool and the same as
    the step's (an operation that commutes has them in the other order), and compared with the
    target: the verdict is whether the value reached is the target. Returns the verdict."""
    body, target, verdict = re.fullmatch(r"(.*)vs(\d+)(yes|no)", text).groups()
    pool = list(p.extra["numbers"])
    for equation, step in zip(body.split(","), steps, strict=True):
        x, op, y, v = true_equation(equation)
        a, step_op, b = re.match(r"(\d+)([-+*])(\d+)=", step).groups()
        assert op == step_op and sorted((x, y)) == sorted((int(a), int(b))), (text, step)
        assert op != "/" and (equation != step if op in "+*" and x != y else True), (text, step)
        pool.remove(x)
        pool.remove(y)
        pool.append(v)
    assert len(pool) == 1 and int(target) == p.extra["target"], text
    assert verdict == ("yes" if pool[0] == p.extra["target"] else "no"), text
    return verdict == "yes"


def verify_uses(text: str, p: Problem, expression: str) -> bool:
    """The numbers of `expression`, sorted, against the problem's, sorted: the verdict is whether
    they are equal. Returns the verdict."""
    used, given, verdict = re.fullmatch(r"([\d,]+)vs([\d,]+)(yes|no)", text).groups()
    assert used == ",".join(map(str, sorted(eval_expression(expression)[1]))) and given == ",".join(map(str, sorted(p.extra["numbers"])))
    assert verdict == ("yes" if used == given else "no"), text
    return verdict == "yes"


def verify_back(text: str, p: Problem) -> bool:
    """From the target back to a number: each equation true, an inverse (- + /) of the value reached
    so far with a number of the problem, each number used once, and the one number left is written
    after "vs"; the verdict is whether the value reached is that number. Returns the verdict."""
    body, left, verdict = re.fullmatch(r"(.*)vs(\d+)(yes|no)", text).groups()
    value, pool = p.extra["target"], list(p.extra["numbers"])
    for equation in body.split(","):
        x, op, y, v = true_equation(equation)
        assert op in "-+/" and value in (x, y), text
        pool.remove(y if x == value else x)
        value = v
    assert pool == [int(left)], text
    assert verdict == ("yes" if value == int(left) else "no"), text
    return verdict == "yes"


def holds(step: str) -> bool:
    """Whether the step "a op b=v" is true."""
    a, op, b, value = STEP.match(step).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(value)


def verify_check(name: str, text: str, p: Problem, steps: list[str], expression: str) -> bool:
    """The check `name` of the route written as `steps` with answer `expression`: its verdict."""
    return {"redo": lambda: verify_redo(text, p, steps), "uses": lambda: verify_uses(text, p, expression),
            "back": lambda: verify_back(text, p)}[name]()


CHECK_NAMES = ["redo", "uses", "back"]  # a Parallel-R1 verification block's paths, in order


def test_parallel_traces_of_each_kind_are_valid_and_correct(kinds):
    for name, rows in kinds.items():
        if name.endswith("correction"):  # its last block says "no": test_correction_...
            continue
        schema = NPR if name.startswith("npr") else PARALLEL_R1
        other = PARALLEL_R1 if schema is NPR else NPR
        for p, _, trace in rows:
            assert check_format(trace, schema).ok and check_parallel(trace, schema).ok, trace
            assert grade_countdown(trace, p).correct, trace
            assert not any(tag in trace for tag in other.all() if tag not in schema.all()), trace
            assert trace.endswith(f"{schema.summary_close}\n{FINAL} {p.answer}"), trace
            read = parse_trace(trace, schema)
            blocks = blocks_of(trace, schema)
            assert read.error is None and len(read.blocks) == len(blocks) == trace.count(schema.block_open) >= 1
            assert all(b.valid for b in read.blocks) and blocks[-1][2] == p.answer, trace


def test_exploration_makes_at_least_the_sequential_attempts_on_a_shorter_critical_path(kinds, tokenizer):
    """From the same generator state, an exploration trace opens blocks of routes until they hold as
    many attempts as the sequential trace makes (counted from its lines); only the last checks out."""
    tags = TagIds.from_tokenizer(tokenizer)
    for name in ("exploration", "npr-exploration"):
        schema = NPR if name.startswith("npr") else PARALLEL_R1
        counts, places, critical, sequential, short = set(), set(), [], [], []
        for p, seq, trace in kinds[name]:
            attempts = seq.count("\n")  # the sequential trace: attempts one a line, then the answer
            blocks = blocks_of(trace, schema)
            sizes = [len(branches) for _, branches, _ in blocks]
            assert trace.startswith(schema.block_open) and min(sizes) >= 2, trace
            if schema is PARALLEL_R1:
                expected = [PARALLEL_PATHS] * math.ceil(attempts / PARALLEL_PATHS)
            else:  # the first round 2..K plans, a later one what is still wanted (at least 2)
                expected = sizes[:1]
                while sum(expected) < attempts:
                    expected.append(max(2, attempts - sum(expected)))
            misses = [r for r in routes(p.extra["numbers"]) if r.value != p.extra["target"]]  # independently
            if len(misses) < sum(expected) - 1:  # too few routes miss (6 6 6, 9 9 9): fewer paths, never < 2
                short.append(p.question)
                continue
            assert sizes == expected and sum(sizes) >= attempts > sum(sizes[:-1]), (attempts, trace)  # as many as needed, not a block more
            assert 2 <= sizes[0] <= PARALLEL_PATHS, trace
            routes_seen = []
            for i, (plans, branches, summary) in enumerate(blocks):
                last = i == len(blocks) - 1
                verdicts = ["yes so " in b for b in branches]
                assert verdicts.count(True) == last and summary == (p.answer if last else "no"), trace
                for b in branches:
                    replay(b, p.extra["numbers"], p.extra["target"], LEVELS["easy"].bound)
                    routes_seen.append(b.split("vs")[0])
                if plans is not None:  # a plan names its route by its first move, all different in a round
                    assert all(re.fullmatch(r"\d[-+*]\d", m) and b.startswith(f"{m}=") for m, b in zip(plans, branches))
                    assert len(set(plans)) == len(plans), trace
                if last:
                    places.add((len(branches), verdicts.index(True)))
            assert len(set(routes_seen)) == len(routes_seen), trace  # never the same route twice
            counts.add((attempts, len(blocks)))
            if schema is PARALLEL_R1:
                stats = trace_stats(parse_ids(tokenizer.encode(trace, add_special_tokens=False), tags))
                critical.append(stats.critical_path)
                sequential.append(len(tokenizer.encode(seq, add_special_tokens=False)))
        assert len(short) <= 3, short  # 30 of 20,000 problems lack the misses (6 6 6, 9 9 9)
        assert {a for a, _ in counts} == {1, 2, 3, 4} and {b for _, b in counts} == {1, 2}, counts
        assert places == ({(3, i) for i in range(3)} if schema is PARALLEL_R1 else {(k, i) for k in (2, 3) for i in range(k)})
        if critical:  # measured: ~53 tokens on the critical path against ~60 of the sequential trace
            assert statistics.mean(critical) < statistics.mean(sequential) - 4, (statistics.mean(critical), statistics.mean(sequential))


def test_verification_repeats_the_sequential_attempts_then_checks_the_answer(kinds):
    """Parallel-R1's Figure 6: the sequential trace's attempts (the same lines, from the same
    generator state), then one block whose paths check the answer: each check a true statement."""
    for name in ("verification", "npr-verification"):
        schema = NPR if name.startswith("npr") else PARALLEL_R1
        checks = collections.Counter()
        for p, seq, trace in kinds[name]:
            lines = seq.split("\n")[:-1]  # the attempts, the last one checks out
            assert trace.split("\n")[: len(lines) + 1] == lines + [trace.split("\n")[len(lines)]], trace
            assert trace.split("\n")[len(lines)].startswith(schema.block_open), trace
            (block,) = blocks_of(trace, schema)
            plans, branches, summary = block
            names = CHECK_NAMES if plans is None else plans
            assert summary == p.answer and len(names) == len(branches), trace
            assert names == [n for n in CHECK_NAMES if n in names] and 2 <= len(names) <= 3, trace  # in order, no repeat
            for check, branch in zip(names, branches):
                assert verify_check(check, branch, p, p.extra["steps"], p.answer), (check, branch)  # each says yes
            checks.update(names)
        if schema is NPR:  # 2 or 3 checks, each check in about 5/6 of the rounds
            assert all(0.7 < checks[n] / len(kinds[name]) < 0.95 for n in CHECK_NAMES), checks


def test_correction_catches_a_slip_with_a_block_that_says_no_then_tries_on(problems):
    """A correction trace is the sequential trace of the same generator state with one miss (or,
    with none, nothing) replaced by a slip and a block of checks of it: the slip is a miss said to
    check out (its steps true and its value another, or its last step's result written as the
    target), the block's redo and back say "no", uses "yes" (the numbers are the problem's), the
    summary "no"; then the trace goes on to the right answer. Both slips occur; a problem with no
    slip route explores instead (rare)."""
    for schema, write in ((PARALLEL_R1, parallel_trace), (NPR, npr_trace)):
        slips, explored = collections.Counter(), 0
        for level in LEVELS:
            for i, p in enumerate(problems[level][:300]):
                seq = sequential_trace(p, random.Random(i)).split("\n")
                trace = write(p, random.Random(i), kind="correction")
                assert check_format(trace, schema).ok and check_parallel(trace, schema).ok, trace
                assert grade_countdown(trace, p).correct and trace.endswith(seq[-1]), trace
                if trace.startswith(schema.block_open):
                    explored += 1
                    continue
                lines = trace.split("\n")
                (at,) = [k for k, line in enumerate(lines) if line.startswith(schema.block_open)]
                rest, attempts = lines[: at - 1] + lines[at + 1:-1], seq[:-1]
                assert rest in [attempts[:j] + attempts[j + 1:] for j in range(len(attempts) - 1)] or (
                    len(attempts) == 1 and rest == attempts), trace
                body, target, expression = re.fullmatch(r"(.*)vs(\d+)yes so (.+)", lines[at - 1]).groups()
                value, used = eval_expression(expression)
                assert value != p.extra["target"] == int(target) and sorted(used) == sorted(p.extra["numbers"]), trace
                steps = body.split(",")
                true_steps = [s for s in steps if holds(s)]
                if true_steps == steps:
                    slips["verdict"] += 1
                else:  # only the last step is false, and it claims the target
                    assert true_steps == steps[:-1] and steps[-1].endswith(f"={target}"), trace
                    slips["arithmetic"] += 1
                ((plans, branches, summary),) = blocks_of(trace, schema)
                names = CHECK_NAMES if plans is None else plans
                verdicts = {name: verify_check(name, branch, p, steps, expression) for name, branch in zip(names, branches)}
                assert summary == "no" and not verdicts.get("redo") and not verdicts.get("back"), trace
                assert verdicts.get("uses", True) and False in verdicts.values(), trace
        assert explored < 15 and all(250 < slips[kind] < 330 for kind in ("verdict", "arithmetic")), (slips, explored)


def test_the_kinds_mix_and_where_their_blocks_open():
    """VERIFICATION_SHARE of 2,000 traces verify (their block opens after the attempts); the rest
    explore (their first block opens the trace)."""
    problems_ = make_problems("easy", 2000, seed=5)
    for schema, write in ((PARALLEL_R1, parallel_trace), (NPR, npr_trace)):
        rng, positions = random.Random(1), {"exploration": [], "verification": []}
        for p in problems_:
            trace = write(p, rng, schema=schema)
            kind = "exploration" if trace.startswith(schema.block_open) else "verification"
            stats = trace_stats(parse_trace(trace, schema))
            positions[kind].append(stats.relative_positions)
        share = len(positions["verification"]) / len(problems_)
        assert abs(share - VERIFICATION_SHARE) < 0.035, share  # 3 standard deviations at 2,000
        assert all(found[0] == 0 and len(found) <= 2 for found in positions["exploration"])
        assert all(len(found) == 1 and found[0] > 0.1 for found in positions["verification"])
        mean = statistics.mean(found[0] for found in positions["verification"])
        assert 0.15 < mean < 0.35, mean  # measured ~0.26 (Parallel-R1), ~0.22 (NPR)


def test_a_hard_parallel_trace_explores_and_cannot_verify(problems):
    """A hard problem's trace: blocks of 3 four-number attempts, the last holding the right route
    and summed up by its expression (checked by the toy's own checker), never a verification."""
    rng = random.Random(0)
    for p in problems["hard"][:200]:
        trace = parallel_trace(p, rng)
        blocks = re.findall(r"<Parallel>(.*?)</Parallel><Summary>(.*?)</Summary>", trace)
        assert blocks and check_parallel(trace).ok, trace
        for k, (body, summary) in enumerate(blocks):
            attempts = re.findall(r"<Path>(.*?)</Path>", body)
            assert len(attempts) == PARALLEL_PATHS and all(len(a.split("vs")[0].split(",")) == 3 for a in attempts)
            found = [a.split(" so ")[1] for a in attempts if "yes so " in a]
            assert found == ([summary] if k == len(blocks) - 1 else []) and (found or summary == "no"), trace
        assert check_countdown(blocks[-1][1], p) and trace.endswith(f"{FINAL} {blocks[-1][1]}"), trace
    with pytest.raises(ValueError, match="verifies easy problems only"):
        parallel_trace(problems["hard"][0], random.Random(0), kind="verification")
    with pytest.raises(ValueError, match="unknown parallel trace kind"):
        parallel_trace(problems["easy"][0], random.Random(0), kind="both")


def test_exploration_on_a_problem_with_too_few_routes():
    """9 9 9 -> 9 has 3 routes that miss (`routes`, independently): when the sequential teacher tries
    all 3 first, Parallel-R1's second block would hold the right route alone, so it replaces a miss
    of the first (one block of 3, one attempt fewer than the sequential trace); NPR's rounds of 2
    and 2 fit."""
    p = Problem("t", "numbers 9 9 9 target 9", "(9+9)-9", "toy-easy",
                {"numbers": [9, 9, 9], "target": 9, "level": "easy", "checker": "countdown", "steps": ["9+9=18", "18-9=9"]})
    assert len([r for r in routes([9, 9, 9]) if r.value != 9]) == 3
    seed = next(s for s in range(100) if attempt_count(p, random.Random(s)) == 4)
    for schema, write in ((PARALLEL_R1, parallel_trace), (NPR, npr_trace)):
        trace = write(p, random.Random(seed), schema=schema, kind="exploration")
        blocks = blocks_of(trace, schema)
        assert [len(branches) for _, branches, _ in blocks] == ([3] if schema is PARALLEL_R1 else [2, 2]), trace
        assert blocks[-1][2] == p.answer and grade_countdown(trace, p).correct and check_parallel(trace, schema).ok, trace


def test_teacher_is_seeded(problems):
    p = problems["easy"][0]
    assert sequential_trace(p, random.Random(5)) == sequential_trace(p, random.Random(5))
    assert parallel_trace(p, random.Random(5)) == parallel_trace(p, random.Random(5))
    assert npr_trace(p, random.Random(5)) == npr_trace(p, random.Random(5))


def test_npr_traces_follow_npr_rules_and_grade_correct(npr_traces):
    counts = []
    for p, trace in npr_traces:
        assert check_format(trace, NPR).ok and check_parallel(trace, NPR).ok, trace
        assert not any(tag in trace for tag in PARALLEL_R1.all()), trace
        assert grade_countdown(trace, p).correct, trace
        assert trace.endswith(f"{NPR.summary_close}\n{FINAL} {p.answer}")
        rounds = blocks_of(trace, NPR)
        assert rounds[-1][2] == p.answer and all(takeaway == "no" for _, _, takeaway in rounds[:-1]), trace
        counts.append(len(rounds[0][0]))
    assert set(counts) == {2, 3} and 0.4 < counts.count(2) / len(counts) < 0.6, counts.count(2)  # equally likely: 0.48 here


def test_npr_teacher_verifies_easy_problems_only_and_asks_for_a_schema_with_plans(problems):
    easy, rng = problems["easy"][0], random.Random(0)
    assert check_parallel(npr_trace(problems["hard"][0], rng), NPR).ok  # a hard problem's round explores
    with pytest.raises(ValueError, match="verifies easy problems only"):
        npr_trace(problems["hard"][0], rng, kind="verification")
    with pytest.raises(ValueError, match="has no plans"):
        npr_trace(easy, rng, schema=PARALLEL_R1)
    with pytest.raises(ValueError, match="has plans"):
        parallel_trace(easy, rng, schema=NPR)
    with pytest.raises(ValueError, match="2..8 plans"):
        npr_trace(easy, rng, paths=1)
    assert all(len(plans) == 2 for p in problems["easy"][:50] for plans, _, _ in blocks_of(npr_trace(p, rng, paths=2), NPR))


def test_npr_tokens_put_each_step_label_right_after_its_tag(npr_traces, npr_tokenizer):
    """What the sampler forces at a branch's start (<step>, then the ids of "i:") is exactly how
    the teacher's traces tokenize, and the id reading (the layout's, the sampler's) is valid."""
    tag_ids = TagIds.from_tokenizer(npr_tokenizer, NPR)
    assert len(npr_tokenizer) <= toy_model_config().vocab_size  # the toy model needs no new rows for NPR's tags
    for p, trace in npr_traces:
        ids = npr_tokenizer.encode(trace, add_special_tokens=False)
        assert npr_tokenizer.decode(ids) == trace and npr_tokenizer.unk_token_id not in ids
        starts, round_start = [], 0  # (offset of <step>, its place in its round)
        for i, token in enumerate(ids):
            round_start = i if token == tag_ids.block_open else round_start
            if token == tag_ids.path_open:
                starts.append((i, ids[round_start:i].count(tag_ids.path_open)))
        for at, k in starts:
            label = list(tag_ids.labels[k])
            assert ids[at + 1: at + 1 + len(label)] == label, trace
            close = ids.index(tag_ids.path_close, at)
            assert close - at <= MAX_PATH_TOKENS, trace  # label, attempt and </step> fit a path's budget
        assert check_parallel(parse_ids(ids, tag_ids)).ok, trace


def test_teacher_traces_in_npr_tags_have_the_mix_shares():
    for name, shares in (("toy:instruct", {"easy": 0.1, "hard": 0.05}), ("toy:parallel", {"easy": 0.75, "hard": 0.1}),
                         ("toy:checked", {"easy": 0.7, "hard": 0.15})):
        records = teacher_traces(name, NPR)
        assert len(records) == 4000
        npr = [r for r in records if NPR.block_open in r["response"]]
        for level, share in shares.items():
            assert sum(r["id"].startswith(f"toy-{level}") for r in npr) == round(4000 * share), (name, level)
        assert len(npr) == round(4000 * sum(shares.values())), name
        assert all(check_format(r["response"], NPR).ok and check_parallel(r["response"], NPR).ok for r in npr), name
        assert all("<" not in r["response"] and check_format(r["response"], NPR).ok  # sequential: no tags at all
                   for r in records if NPR.block_open not in r["response"]), name
        instructed = [r for r in records if r.get("instructions") == "parallel"]
        # an instruct base: prompted "in parallel", it answers in NPR's tags (and only then)
        assert instructed == (npr if name == "toy:instruct" else [])
        assert not any(tag in r["response"] for r in records for tag in PARALLEL_R1.all()), name
    assert teacher_traces("toy:sequential", NPR) == teacher_traces("toy:sequential")  # no parallel part: no change


def test_parallel_r1_teacher_traces_are_pinned():
    """The Parallel-R1 traces of every mix are byte for byte the pinned ones; generated once per
    process, each call gets records of its own to change."""
    digest = lambda records: hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()
    for name in TEACHER_MIXES:
        records = teacher_traces(name)
        assert digest(records) == PARALLEL_R1_TRACES[name], name
        records[0]["response"], records[1] = "changed", {}
        assert digest(teacher_traces(name, PARALLEL_R1)) == PARALLEL_R1_TRACES[name], name


# --------------------------------------------------------------------------- tokenizer and model


def test_tokenizer_round_trips_every_trace_and_tags_are_single_tokens(traces, tokenizer, tmp_path):
    tag_ids = TagIds.from_tokenizer(tokenizer)  # raises unless each tag is one token
    assert len(set(tag_ids.all())) == 6
    assert len(tokenizer.encode(FINAL, add_special_tokens=False)) == 1
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer) and TagIds.from_tokenizer(loaded) == tag_ids
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    for kind, pairs in traces.items():
        for p, trace in pairs:
            text = f"{p.question}\n{trace}"  # the toy prompt, then the response
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids
            assert tokenizer.decode(ids) == text, kind
            assert loaded.encode(text, add_special_tokens=False) == ids
            assert loaded.decode(ids) == text
    odd = "Any ASCII:  two  spaces,\ttab\n\nand ~!@#$%^&*_ {}[]|\\;'\"<>?/`"
    assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd


def test_tokenizer_ids_are_pinned(tokenizer):
    """The ids a trained toy checkpoint depends on: EOS, the words, the characters, tab, newline, tags."""
    pinned = {"<|endoftext|>": 0, "<unk>": 1, FINAL: 2, "numbers": 3, " so ": 8, " ": 9, "0": 25, "~": 103,
              "\t": 104, "\n": 105, "<Parallel>": 106, "</Summary>": 111}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in pinned} == pinned and len(tokenizer) == 112
    text = "numbers 3 target 33\nyes so 3\tFinal Answer: 3<Path>"
    ids = [3, 9, 28, 9, 4, 9, 28, 28, 105, 5, 8, 28, 104, 2, 9, 28, 108]
    assert tokenizer.encode(text, add_special_tokens=False) == ids and tokenizer.decode(ids) == text
    assert tokenizer.clean_up_tokenization_spaces is False


def test_token_lengths_within_bounds(traces, npr_traces, kinds, tokenizer, npr_tokenizer):
    kind_pairs = {name: [(p, trace) for p, _, trace in rows] for name, rows in kinds.items()}
    for kind, pairs in (traces | {"easy-npr": npr_traces} | kind_pairs).items():
        encode = (npr_tokenizer if "npr" in kind else tokenizer).encode
        lengths = [len(encode(trace, add_special_tokens=False)) for _, trace in pairs]
        mean, longest = statistics.mean(lengths), max(lengths)
        print(f"{kind}: mean {mean:.1f} tokens, max {longest}, min {min(lengths)}")
        assert mean <= BOUNDS[kind][0] and longest <= BOUNDS[kind][1], kind


def budget_needed(ids: list[int], tags: TagIds) -> tuple[int, int]:
    """(causal, structured) max_new_tokens a teacher trace needs: its sampled tokens and EOS. A
    structured sampler inserts each branch's open tag (NPR: and its label "i:") and the merge
    tags (</Parallel><Summary>; NPR: <takeaway>), which the budget does not count."""
    opens = ids.count(tags.path_open)
    inserted = opens * (1 + (len(tags.labels[0]) if tags.schema.numbered else 0)) + ids.count(tags.summary_open)
    inserted += ids.count(tags.block_close) if tags.block_close is not None else 0
    return len(ids) + 1, len(ids) + 1 - inserted


def test_teacher_traces_fit_the_default_budgets(tokenizer, npr_tokenizer):
    """Every parallel trace of the cold-start and instruct mixes fits the toy's sampler budgets:
    its blocks (max_blocks), each branch (max_path_tokens), and in Parallel-R1's tags the whole
    (max_new_tokens; docs/toy.md gives the longest need of each schema)."""
    for schema, tk in ((PARALLEL_R1, tokenizer), (NPR, npr_tokenizer)):
        tags = TagIds.from_tokenizer(tk, schema)
        records = [r for name in ("toy:parallel", "toy:checked", "toy:instruct") for r in teacher_traces(name, schema)
                   if schema.block_open in r["response"]]
        needed = []
        for r in records:
            ids = tk.encode(r["response"], add_special_tokens=False)
            starts = [i for i, token in enumerate(ids) if token == tags.path_open]
            assert all(ids.index(tags.path_close, at) - at <= DEFAULTS.max_path_tokens for at in starts), r["response"]
            assert 1 <= ids.count(tags.block_open) <= DEFAULTS.max_blocks
            needed.append(budget_needed(ids, tags))
        causal, structured = (max(n[i] for n in needed) for i in (0, 1))
        over = [statistics.mean(n[i] > DEFAULTS.max_new_tokens for n in needed) for i in (0, 1)]
        print(f"{schema.name}: budget needed causal <= {causal}, structured <= {structured}; over the default: {over}")
        assert causal <= DEFAULTS.max_new_tokens and over == [0, 0], (causal, over)


def test_model_config_and_a_checkpoint_folder_that_loads_like_any_model(traces, tokenizer, tmp_path):
    config = toy_model_config(tokenizer)
    assert config.model_type == "qwen3" and config.vocab_size == 128 >= len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    assert 0.7e6 < params < 0.9e6, params
    built, built_tokenizer = load_model(ModelSettings("toy:model", device="cpu"))  # through data.SOURCES
    assert built_tokenizer.get_vocab() == tokenizer.get_vocab() and built.config._name_or_path == "toy:model"
    pairs = zip(built.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(ModelSettings(str(tmp_path), device="cpu"))
    assert TagIds.from_tokenizer(loaded_tokenizer) == TagIds.from_tokenizer(tokenizer)
    assert loaded.get_input_embeddings().weight.shape[0] == 128  # nothing added or resized
    p, trace = traces["easy-parallel"][0]
    ids = torch.tensor([tokenizer.encode(f"{p.question}\n{trace}", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model.eval()(ids).logits, atol=1e-5)


def test_rewards_grade_toy_problems_with_the_exact_checker():
    from nanopar.grading import grade
    from nanopar.rewards import score
    from nanopar.trace import parse_trace
    from nanopar.toy import make_problems, parallel_trace

    problem = known_problem()
    assert grade("Final Answer: 9+8-5", problem).correct
    assert not grade("Final Answer: 12", problem).correct  # the value alone does not use the numbers
    assert grade("no answer", problem).error == "no answer found"
    trace = parallel_trace(problem, random.Random(0))
    assert score("parallel", trace, parse_trace(trace), problem).total == 1.0
    trace = npr_trace(problem, random.Random(0))
    for reward in ("parallel", "npr_format", "format"):
        assert score(reward, trace, parse_trace(trace, NPR), problem).total == 1.0, reward
