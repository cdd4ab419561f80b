"""The toy world: a Countdown-style task, its exact checker, a programmatic teacher, a tokenizer
and a ~0.8M-parameter Qwen3, so the whole curriculum runs on a laptop CPU in minutes.

Reach a target from a few numbers with + - *, each number used exactly once:

    question  "numbers 3 7 12 target 33"          answer  "(7*3)+12"

easy: 3 numbers (the GSM8K analogue), hard: 4 (the DAPO analogue); numbers 1..9, every
intermediate result a positive integer <= 100. Trying several routes side by side genuinely
helps: about 11% of an easy problem's legal routes reach its target, 4% of a hard one's. The
teacher writes sequential traces (attempts one a line) and, for easy problems, parallel ones in
the tags of either schema: Parallel-R1's (blocks of 3 paths, a summary each) or NPR's (rounds of
a guideline of 2 or 3 plans, a step per plan, a takeaway), of two kinds: *exploration* (blocks of
routes side by side open the trace, as many as a sequential trace makes attempts) and
*verification* (sequential attempts, then one block of checks of the answer); see "the teacher"
below for all of them, with lengths.

The general modules reach this file only through two registry entries: `SOURCE`
(data.SOURCES["toy"]: problems "toy:easy", traces "toy:parallel", the model "toy:model") and
`grade_countdown` (grading.CHECKERS["countdown"]). Left out: division in routes and answers (they
stay in the integers; only a verification path's backward check divides, exactly), unary minus,
larger numbers (1..15 and <= 150: ~3x more facts for the model to learn).
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from . import NanoparError
from .data import Problem, Source
from .grading import FINAL_ANSWER_LINE, Grade
from .tags import MAX_PATHS, NPR, PARALLEL_R1, TagSchema, add_tag_tokens
from .tiny import tiny_qwen_config, word_tokenizer


@dataclass(frozen=True)
class Level:
    count: int  # how many numbers
    attempts: int  # K of the sequential teacher: the correct route sits at a random attempt 1..K
    low: int = 1  # smallest number
    high: int = 9  # largest number
    bound: int = 100  # every intermediate result lies in 1..bound
    heldout_tenths: int = 1  # share of the level's problems held out of training, in tenths (`is_heldout`)
    heldout_problems: int = 150  # size of the fixed held-out set ("toy:<level>:heldout"; evaluations take its first N)


# easy holds out 3 tenths: its world has only 1,865 distinct problems (577 held out), and a
# held-out accuracy near 50% needs ~550 of them for a standard error <= 1.5 points (measured:
# 1.52 at 500); hard's 20,142 need 1 tenth
LEVELS = {"easy": Level(count=3, attempts=4, heldout_tenths=3, heldout_problems=560),
          "hard": Level(count=4, attempts=3, heldout_problems=560)}
PARALLEL_PATHS = 3  # K of the parallel teacher: paths per block (the sampler should fork as many); NPR: the most plans
HELDOUT_SEED = 1_000_000_007  # the held-out generator's seed (the split itself is by checksum)
FINAL = "Final Answer:"


# --------------------------------------------------------------------------- the task


@dataclass(frozen=True)
class Route:
    steps: tuple[str, ...]  # ("7*3=21", "21+12=33"): larger operand first, so each route has one text
    value: int  # the value of the last step
    expression: str  # the same route as one expression: "(7*3)+12"


def routes(numbers, bound: int = 100) -> list[Route]:
    """Every legal route over `numbers` (intermediates in 1..bound), without duplicates: <= 27 for
    3 numbers (on average ~11% of them reach a problem's target), ~280 for 4 (~4%).

    >>> [r.steps for r in routes([2, 3])]
    [('3+2=5',), ('3-2=1',), ('3*2=6',)]
    >>> all_routes = routes([3, 7, 12])  # 3 pairs x 3 ops x 3 ops, less 5 over 100 (252 three times, 105, 120)
    >>> len(all_routes), [(r.steps, r.expression) for r in all_routes if r.value == 33]
    (22, [(('7*3=21', '21+12=33'), '(7*3)+12')])
    """
    states = [(tuple((n, str(n)) for n in sorted(numbers)), ())]  # (pool of (value, expression), steps)
    for _ in range(len(numbers) - 1):  # each step replaces two items of the pool by one
        states = [(after, steps + (step,)) for pool, steps in states for step, after in _moves(pool, bound)]
    found = {steps: Route(steps, pool[0][0], pool[0][1][1:-1]) for pool, steps in reversed(states)}
    return list(reversed(found.values()))  # the first of duplicates (from repeated numbers), in order


def _moves(pool: tuple[tuple[int, str], ...], bound: int):
    """Every legal step on a pool of (value, expression): (step text, the pool after it)."""
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            (a, ea), (b, eb) = sorted((pool[i], pool[j]), key=lambda item: -item[0])  # a >= b
            rest = pool[:i] + pool[i + 1:j] + pool[j + 1:]
            for op, value in (("+", a + b), ("-", a - b), ("*", a * b)):
                if 0 < value <= bound:
                    yield f"{a}{op}{b}={value}", rest + ((value, f"({ea}{op}{eb})"),)


def random_route(numbers, bound: int, rng: random.Random) -> Route:
    """A random legal route, built step by step (each step uniform over the legal steps); a walk
    that gets stuck (say at 100 and 100) starts again. Needs one legal route (all "+" is, here)."""
    pool, steps = tuple((n, str(n)) for n in numbers), ()
    while len(pool) > 1:
        moves = list(_moves(pool, bound))
        if not moves:
            pool, steps = tuple((n, str(n)) for n in numbers), ()
            continue
        step, pool = rng.choice(moves)
        steps += (step,)
    return Route(steps, pool[0][0], pool[0][1][1:-1])


def is_heldout(numbers, target: int, tenths: int) -> bool:
    """The split: held out when crc32("sorted numbers>target") mod 10 is below `tenths` (the
    level's `heldout_tenths`: about that many tenths of its problems), so `make_problems`
    (training, any seed; repeats allowed) and `heldout` (fixed seed, distinct problems) never
    share a problem, whatever seeds are used."""
    return zlib.crc32(f"{sorted(numbers)}>{target}".encode()) % 10 < tenths


def make_problems(level: str, n: int, seed: int, split: str = "train") -> list[Problem]:
    """`n` problems of a level ("easy" | "hard") from `seed`; the same seed gives the same list.

    Numbers are uniform in the level's range, shown in the order drawn; the target is the value of
    a `random_route`, whose expression is the answer. Training problems may repeat.

    >>> p = make_problems("easy", 1, seed=0)[0]
    >>> p.question, p.answer, p.extra["steps"]
    ('numbers 7 7 1 target 49', '7*(7*1)', ['7*1=7', '7*7=49'])
    """
    spec = LEVELS[level]
    rng, problems = random.Random(seed), []
    while len(problems) < n:
        numbers = [rng.randint(spec.low, spec.high) for _ in range(spec.count)]
        route = random_route(numbers, spec.bound, rng)
        if is_heldout(numbers, route.value, spec.heldout_tenths) != (split == "heldout"):
            continue
        problems.append(Problem(
            id=f"toy-{level}:{seed}:{len(problems)}",
            question=f"numbers {' '.join(map(str, numbers))} target {route.value}",
            answer=route.expression,
            source=f"toy-{level}",
            extra={"numbers": numbers, "target": route.value, "level": level, "checker": "countdown",
                   "steps": list(route.steps)},  # the answer as steps: the teacher's attempt that checks out
        ))
    return problems


def heldout(level: str, n: int = 0) -> list[Problem]:
    """The fixed held-out split of a level: `n` distinct problems no training seed can produce
    (0 = the level's `heldout_problems`); a smaller `n` gives the first `n` of a larger one."""
    return list(_heldout(level, n or LEVELS[level].heldout_problems))


@functools.lru_cache(maxsize=8)
def _heldout(level: str, n: int) -> tuple[Problem, ...]:
    """Computed once per process. Draws grow until `n` are distinct (easy repeats often); a longer
    draw starts with the shorter one, so the result does not depend on how many draws it took."""
    for draws in (4 * n, 16 * n, 64 * n, 256 * n):
        seen, kept = set(), []
        for p in make_problems(level, draws, HELDOUT_SEED, split="heldout"):
            key = (tuple(sorted(p.extra["numbers"])), p.extra["target"])
            if key not in seen:
                seen.add(key)
                p.id = f"toy-{level}-heldout:{len(kept)}"
                kept.append(p)
        if len(kept) >= n:
            return tuple(kept[:n])
    raise ValueError(f"only {len(kept)} distinct held-out {level} problems were drawn, not {n}")


# --------------------------------------------------------------------------- checking


_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*()]))")  # a number or an operator/parenthesis
MAX_ANSWER_CHARS = 200  # longer answers are wrong (and keep the parser's recursion shallow)


def evaluate(expression: str) -> tuple[int, list[int]]:
    """(value, numbers used) of an expression of integers, + - * and parentheses; ValueError if malformed.

    A small recursive-descent parser (never `eval`): usual precedence, no unary minus.

    >>> evaluate("(3*7)+12"), evaluate("12+3*7"), evaluate("2-3")
    ((33, [3, 7, 12]), (33, [12, 3, 7]), (-1, [2, 3]))
    """
    if len(expression) > MAX_ANSWER_CHARS:
        raise ValueError(f"longer than {MAX_ANSWER_CHARS} characters")
    tokens, at = [], 0
    while at < len(expression.rstrip()):
        match = _TOKEN.match(expression, at)
        if not match:
            raise ValueError(f"unexpected {expression[at:].strip()[:10]!r}")
        if match.group(1) and match.group(1) != str(int(match.group(1))):
            raise ValueError(f"number with a leading zero: {match.group(1)}")
        tokens.append(match.group(1) or match.group(2))
        at = match.end()
    used: list[int] = []
    value, at = _sum(tokens, 0, used)
    if at != len(tokens):
        raise ValueError(f"unexpected {tokens[at]!r}" if at < len(tokens) else "empty")
    return value, used


def _sum(tokens, at, used):  # sum := product (("+" | "-") product)*
    value, at = _product(tokens, at, used)
    while at < len(tokens) and tokens[at] in "+-":
        right, next_at = _product(tokens, at + 1, used)
        value, at = (value + right if tokens[at] == "+" else value - right), next_at
    return value, at


def _product(tokens, at, used):  # product := atom ("*" atom)*
    value, at = _atom(tokens, at, used)
    while at < len(tokens) and tokens[at] == "*":
        right, at = _atom(tokens, at + 1, used)
        value *= right
    return value, at


def _atom(tokens, at, used):  # atom := number | "(" sum ")"
    if at >= len(tokens):
        raise ValueError("ends too early")
    if tokens[at] == "(":
        value, at = _sum(tokens, at + 1, used)
        if at >= len(tokens) or tokens[at] != ")":
            raise ValueError("unclosed (")
        return value, at + 1
    if not tokens[at].isdigit():
        raise ValueError(f"unexpected {tokens[at]!r}")
    used.append(int(tokens[at]))
    return int(tokens[at]), at + 1


def extract_toy_answer(text: str | None) -> str | None:
    """The rest of the line (up to a tag) after the last "Final Answer:", stripped; None when absent
    or empty. The line is found by `grading.FINAL_ANSWER_LINE` (any case, spaces around the colon),
    but not cleaned up as math answers are: "(7*3)+12." is a wrong answer.

    >>> extract_toy_answer("7*3=21,21+12=33vs33yes\\nFinal Answer: (7*3)+12")
    '(7*3)+12'
    >>> extract_toy_answer("<Path>Final Answer: (7*3)+12</Path>")
    '(7*3)+12'
    """
    found = FINAL_ANSWER_LINE.findall(text or "")
    return (found[-1].strip() or None) if found else None


def check_countdown(answer_text: str | None, problem: Problem) -> bool:
    """True when the answer uses each of the problem's numbers exactly once and equals its target.

    A malformed expression is simply wrong (call `evaluate` to see why). Only the numbers and the
    value are checked: the answer's intermediates are not held to the generator's bound.

    >>> p = Problem("t", "numbers 3 7 12 target 33", "(7*3)+12", extra={"numbers": [3, 7, 12], "target": 33})
    >>> check_countdown("12+7*3", p), check_countdown("3*7+12+3", p), check_countdown("3*7+12)", p)
    (True, False, False)
    """
    if answer_text is None:
        return False
    try:
        value, used = evaluate(answer_text)
    except ValueError:
        return False
    return value == problem.extra["target"] and sorted(used) == sorted(problem.extra["numbers"])


def grade_countdown(response_text: str, problem: Problem) -> Grade:
    """The "countdown" checker of `grading.CHECKERS`: the Final Answer line, checked exactly."""
    extracted = extract_toy_answer(response_text)
    if extracted is None:
        return Grade(False, None, "no answer found")
    return Grade(check_countdown(extracted, problem), extracted)


# --------------------------------------------------------------------------- the teacher
#
# One line per attempt, its comparison with the target written out (without it the feasibility
# study's model learned the arithmetic but said "yes" to wrong values), stopping after the attempt
# that checks out: the problem's own route (`extra["steps"]`); the others are random legal routes
# that miss. That attempt turns its steps into the answer right there ("yes so (7*3)+12"), so a
# summary only copies the few tokens after "yes so" from the path that holds them (measured: a
# summary reads its paths at shared positions, and re-deriving the expression from the steps of
# one path of three was where a third of the cold-started model's answers went wrong).
#
# sequential: the right route sits at attempt a, uniform in 1..K (easy K = 4, hard 3):
#
#     12-7=5,5*3=15vs33no
#     7*3=21,21+12=33vs33yes so (7*3)+12
#     Final Answer: (7*3)+12
#
# A parallel trace (easy only, as in the paper) is one of two kinds, VERIFICATION_SHARE of them
# the second. Both make at least as many attempts as the sequential teacher would with the same
# draws (`attempt_count`), so writing in parallel never caps the search:
#
# exploration: the trace opens with a block of K = 3 routes side by side; when none checks out
# the summary says "no" and another block follows, until the blocks hold a attempts (blocks =
# ceil(a / 3): a in 1..4 gives 1 block 3/4 of the time, 2 blocks 1/4); the right route at a random
# place of the last block, its summary the expression ("numbers 4 5 5 target 100"):
#
#     <Parallel><Path>5+4=9,9+5=14vs100no</Path><Path>5+4=9,9-5=4vs100no</Path><Path>5-4=1,5+1=6vs100no</Path></Parallel><Summary>no</Summary>
#     <Parallel><Path>5*5=25,25*4=100vs100yes so (5*5)*4</Path><Path>5+5=10,10-4=6vs100no</Path><Path>5*4=20,20-5=15vs100no</Path></Parallel><Summary>(5*5)*4</Summary>
#     Final Answer: (5*5)*4
#
# verification (Parallel-R1's Figure 6): the sequential teacher's own attempts (the same draws, so
# the same lines) until one checks out, then a block whose paths check that answer three ways
# (`CHECKS`), each a true statement: "redo" recomputes the route with the operands of + and *
# swapped, "uses" lists the answer's numbers and the problem's, each sorted, "back" works back from
# the target by the inverse operations (- for +, / for *, + or - for -) to the number left over:
#
#     12-7=5,5*3=15vs33no
#     7*3=21,21+12=33vs33yes so (7*3)+12
#     <Parallel><Path>3*7=21,12+21=33vs33yes</Path><Path>3,7,12vs3,7,12yes</Path><Path>33-12=21,21/3=7vs7yes</Path></Parallel><Summary>(7*3)+12</Summary>
#     Final Answer: (7*3)+12
#
# NPR's rounds (`npr_trace`) are the same two kinds in its tags: a plan names its route by the
# first move ("1:7*3", a few tokens; the first moves of a round differ, so no two plans are one
# strategy) or its check ("2:back"); step i is "i:" and the attempt or check of plan i; the
# takeaway the expression (exploration: "no" when no step checks out, then another round):
#
#     <guideline><plan>1:8+7</plan><plan>2:8*7</plan></guideline><step>1:8+7=15,15+8=23vs64no</step>
#     <step>2:8*7=56,56+8=64vs64yes so (8*7)+8</step><takeaway>(8*7)+8</takeaway>
#     Final Answer: (8*7)+8
#
#     12-7=5,5*3=15vs33no
#     7*3=21,21+12=33vs33yes so (7*3)+12
#     <guideline><plan>1:redo</plan><plan>2:back</plan></guideline><step>1:3*7=21,12+21=33vs33yes</step>
#     <step>2:33-12=21,21/3=7vs7yes</step><takeaway>(7*3)+12</takeaway>
#     Final Answer: (7*3)+12
#
# The label follows the tag with no space: the sampler forces the ids of "1:" after <step> and the
# model continues from there. A round holds 2 or 3 plans, each half the time (K = 3 at most): the
# first exploration round, and a verification round (2 or 3 of the checks); a later exploration
# round tries what is still wanted, at least 2 (so 2: a is at most 4). Under NPR the model
# chooses how many branches to fork, so its cold start must show more than one count (one fixed
# count would be Parallel-R1's K again), and RL can then shift the mix towards what pays. The
# count is drawn, not tied to the problem: nothing the model can read in an easy question says
# how hard it is.
#
# Lengths in `toy_tokenizer` tokens (the 600 traces of tests/test_toy.py each; NPR with its tags
# added), mean / max: easy sequential ~60 / 93, hard sequential ~74 / 106; Parallel-R1 exploration
# ~100 / 155 (critical path ~53: shorter than the sequential trace of the same draws, ~60, with at
# least as many attempts), verification ~123 / 163, the two mixed ~102 / 158; NPR exploration
# ~121 / 179, verification ~139 / 188, mixed ~125 / 188 (its plans and labels cost ~7 tokens a
# branch: its critical path, ~82, is longer than the sequential trace's). The budget a trace
# needs is its sampled tokens and EOS (structured sampling inserts <Path> and </Parallel><Summary>,
# NPR's <step> "i:" and <takeaway>); over the ~6,800 parallel traces of "toy:parallel" and
# "toy:instruct": Parallel-R1 <= 154 structured, <= 159 causal, NPR's <= 178 / 188, so the toy's
# max_new_tokens of 224 (defaults.TOY_SAMPLING, shared by the three scripts) holds them all.
# tests/test_toy.py holds them to these, and a branch to <= 48 tokens (max_path_tokens).
# Traces carry no EOS: the trainer appends `tokenizer.eos_token`. The toy prompt is the question
# alone (`prompts.build_prompt(problem, tokenizer, instructions="")` gives "question\n").

VERIFICATION_SHARE = 0.25  # parallel traces that verify an answer found sequentially; the rest explore.
#   The cold start shows both uses of a block (Parallel-R1 saw the block's relative position drift
#   from ~0.4 to ~0.8 during RL, exploration -> verification), mostly the first. At half each the
#   default run's cold start lost 7 points of easy accuracy (12% -> 5%); in its samples the
#   verifying traces were right less often (8% of 74) than the exploring ones (11% of 97), and they
#   hold less parallel text (acceleration 1.37 against 1.59 for the teacher's own traces).
TRACE_KINDS = ("exploration", "verification")


def attempt_text(route: Route, target: int) -> str:
    """One attempt, its comparison with the target written out, and the expression when it
    checks out: "7*3=21,21+12=33vs33yes so (7*3)+12" or "12-7=5,5*3=15vs33no"."""
    verdict = f"yes so {route.expression}" if route.value == target else "no"
    return f"{','.join(route.steps)}vs{target}{verdict}"


def first_move(route: Route) -> str:
    """The first step of a route without its result: "7*3" for ("7*3=21", "21+12=33")."""
    return route.steps[0].partition("=")[0]


# --- the checks of a verification block: each a true statement about a right answer


_STEP = re.compile(r"(\d+)([-+*])(\d+)=(\d+)")


def _steps(route: Route) -> list[tuple[int, str, int, int]]:
    """A route's steps as (a, op, b, value): "7*3=21" -> (7, "*", 3, 21)."""
    parsed = [_STEP.fullmatch(step) for step in route.steps]
    return [(int(m[1]), m[2], int(m[3]), int(m[4])) for m in parsed]


def check_redo(route: Route, problem: Problem) -> str:
    """Recompute the route in another order, the operands of + and * swapped (- keeps its order),
    and compare with the target: "3*7=21,12+21=33vs33yes" for ("7*3=21", "21+12=33")."""
    steps = [f"{b}{op}{a}={v}" if op in "+*" else f"{a}{op}{b}={v}" for a, op, b, v in _steps(route)]
    return f"{','.join(steps)}vs{problem.extra['target']}yes"


def check_uses(route: Route, problem: Problem) -> str:
    """Each number used once: the numbers of the answer's expression, sorted, against the
    problem's, sorted: "3,7,12vs3,7,12yes"."""
    used = sorted(evaluate(route.expression)[1])
    given = sorted(problem.extra["numbers"])
    if used != given:
        raise ValueError(f"the answer {route.expression} does not use the numbers {given} once each")
    return f"{','.join(map(str, used))}vs{','.join(map(str, given))}yes"


def check_back(route: Route, problem: Problem) -> str:
    """Work back from the target by the inverse of each step, last step first, to the number left
    over: "33-12=21,21/3=7vs7yes" for ("7*3=21", "21+12=33"). Needs a chain (each step uses the
    previous result: every route of 3 numbers); a route of 4 that joins two pairs raises."""
    steps, inverses = _steps(route), []
    for i in reversed(range(len(steps))):
        a, op, b, value = steps[i]
        known = steps[i - 1][3] if i else a  # the operand to recover: the previous result (first step: a)
        if known not in (a, b):
            raise ValueError(f"the route {route.steps} is not a chain: step {i + 1} does not use the step before")
        other = b if known == a else a
        if op == "+":
            inverses.append(f"{value}-{other}={known}")
        elif op == "*":
            inverses.append(f"{value}/{other}={known}")
        else:  # a - b = value: a = value + b, b = a - value
            inverses.append(f"{value}+{other}={known}" if known == a else f"{other}-{value}={known}")
    return f"{','.join(inverses)}vs{steps[0][0]}yes"


CHECKS = {"redo": check_redo, "uses": check_uses, "back": check_back}  # a verification block's paths, in order


# --- drawing the routes


def _pick_routes(problem: Problem, rng: random.Random, k: int) -> tuple[list[Route], Route]:
    """K routes at most: the problem's own route (the one that checks out) at a random place, the
    others random legal routes that miss the target (fewer if they are hard to find), all different."""
    right = _right_route(problem)
    wrong = _misses(problem, rng, k - 1, avoid={right.steps})
    wrong.insert(rng.randrange(len(wrong) + 1), right)
    return wrong, right


def _right_route(problem: Problem) -> Route:
    return Route(tuple(problem.extra["steps"]), problem.extra["target"], problem.answer)


def _misses(problem: Problem, rng: random.Random, n: int, avoid: set, distinct=lambda route: route.steps
            ) -> list[Route]:
    """Up to `n` random legal routes that miss the target, no two alike by `distinct` (the steps;
    NPR's plans: the first move) and none whose steps or `distinct` key is in `avoid`."""
    numbers, target = problem.extra["numbers"], problem.extra["target"]
    found: dict = {}
    for _ in range(50 * (n + 1)):  # a random walk is ~10 us, so this is cheap even for 4 numbers
        if len(found) == n:
            break
        route = random_route(numbers, LEVELS[problem.extra["level"]].bound, rng)
        if route.value != target and route.steps not in avoid and distinct(route) not in avoid:
            found.setdefault(distinct(route), route)
    return list(found.values())


def _sequential_attempts(problem: Problem, rng: random.Random, attempts: int | None = None) -> list[Route]:
    """The sequential teacher's attempts: missing routes, then the right one at attempt 1..K."""
    chosen, right = _pick_routes(problem, rng, attempts or LEVELS[problem.extra["level"]].attempts)
    return chosen[: chosen.index(right) + 1]


def attempt_count(problem: Problem, rng: random.Random) -> int:
    """How many attempts the sequential teacher makes with these draws (it draws them, so a parallel
    trace written after this from the same generator state makes at least as many)."""
    return len(_sequential_attempts(problem, rng))


def _exploration_rounds(problem: Problem, rng: random.Random, size, distinct) -> list[list[Route]]:
    """Rounds of routes until they hold `attempt_count` attempts, round sizes drawn by
    `size(round, attempts still wanted)`:
    the right route at a random place of the last one, the others random routes that miss, no
    route twice in the trace, no two in a round alike by `distinct`. Where the misses run out
    (three numbers alike: 25 of the 20,150 easy problems), a last round short of 2 is dropped and
    the right route replaces a miss of the round before, one alike by `distinct` if there is one;
    an earlier round short of 2 raises (never seen)."""
    wanted, sizes = attempt_count(problem, rng), []
    while sum(sizes) < wanted:
        sizes.append(size(len(sizes), wanted - sum(sizes)))
    right, tried, rounds = _right_route(problem), set(), []
    for i, n in enumerate(sizes):
        last = i == len(sizes) - 1
        avoid = tried | {right.steps} | ({distinct(right)} if last else set())
        routes_ = _misses(problem, rng, n - last, avoid, distinct)
        if last and len(routes_) == 0 and rounds:  # no miss left to go with the right route
            before = rounds[-1]
            alike = [k for k, r in enumerate(before) if distinct(r) == distinct(right)]
            before[alike[0] if alike else rng.randrange(len(before))] = right
            break
        if last:
            routes_.insert(rng.randrange(len(routes_) + 1), right)
        if len(routes_) < 2:
            raise NanoparError(f"{problem.question}: too few other routes for a block of {n} (found {len(routes_)})")
        tried |= {r.steps for r in routes_}
        rounds.append(routes_)
    return rounds


def _pick_checks(rng: random.Random, n: int) -> list[str]:
    """`n` of the CHECKS' names, in CHECKS order."""
    if not 2 <= n <= len(CHECKS):
        raise ValueError(f"a verification block does 2..{len(CHECKS)} checks, not {n}")
    chosen = set(rng.sample(list(CHECKS), n))
    return [name for name in CHECKS if name in chosen]


# --- the traces


def sequential_trace(problem: Problem, rng: random.Random, attempts: int | None = None) -> str:
    """Attempts one per line until the one that checks out (at a random attempt 1..K), then the answer.

    K = `attempts`, or the level's default (easy 4, hard 3).
    """
    tried = _sequential_attempts(problem, rng, attempts)
    lines = [attempt_text(r, problem.extra["target"]) for r in tried]
    return "\n".join(lines) + f"\n{FINAL} {tried[-1].expression}"


def parallel_trace(problem: Problem, rng: random.Random, paths: int = PARALLEL_PATHS,
                   schema: TagSchema = PARALLEL_R1, kind: str | None = None) -> str:
    """A parallel trace in Parallel-R1's shape, blocks of K = `paths` paths, of `kind` ("exploration"
    or "verification"; None: drawn, verification with probability VERIFICATION_SHARE):

    exploration  blocks of K routes until they hold `attempt_count` attempts; a block with no route
                 that checks out is summarised "no", the last one by the expression of the one that does
    verification the sequential teacher's attempts, then one block of K `CHECKS` of the answer
                 (K <= 3), summarised by the expression

    then the answer. Easy problems only, as in the paper. A schema with plans: `npr_trace`.
    """
    _check_parallel_problem(problem)
    if schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has plans: write its traces with npr_trace")
    if _draw_kind(rng, kind) == "exploration":
        return _exploration_trace(problem, rng, schema, lambda i, left: paths, lambda route: route.steps)
    return _verification_trace(problem, rng, schema, lambda: paths)


def npr_trace(problem: Problem, rng: random.Random, paths: int = PARALLEL_PATHS, schema: TagSchema = NPR,
              kind: str | None = None) -> str:
    """A parallel trace in NPR's rounds of 2..K plans (K = `paths`), of `kind` (as `parallel_trace`;
    None: drawn):

    exploration  rounds until they hold `attempt_count` attempts, the first of 2..K plans (each
                 count equally likely), a later one of what is still wanted (at least 2); plan i
                 "i:" and the first move of its route (the first moves of a round all different),
                 step i "i:" and its attempt; the takeaway "no", or in the last round the
                 expression of the route that checks out
    verification the sequential teacher's attempts, then one round of 2..min(K, 3) `CHECKS`: plan i
                 "i:" and the check's name, step i "i:" and the check; the takeaway the expression

    then the answer. Easy problems only.
    """
    _check_parallel_problem(problem)
    if not schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has no plans: write its traces with parallel_trace")
    if not 2 <= paths <= MAX_PATHS:
        raise ValueError(f"an NPR round of the teacher has 2..{MAX_PATHS} plans, not at most {paths}")
    if _draw_kind(rng, kind) == "exploration":
        return _exploration_trace(problem, rng, schema, lambda i, left: rng.randint(2, paths) if i == 0 else
                                  max(2, min(left, paths)), first_move)
    return _verification_trace(problem, rng, schema, lambda: rng.randint(2, min(paths, len(CHECKS))))


def _exploration_trace(problem: Problem, rng: random.Random, schema: TagSchema, size, distinct) -> str:
    """Blocks of attempts (`_exploration_rounds`: round sizes by `size`, no two alike by
    `distinct`), each summed up by `_summary`, then the answer; a schema with plans names each
    route by its first move."""
    target = problem.extra["target"]
    blocks = [_block(schema, [first_move(r) for r in routes_] if schema.planned else None,
                     [attempt_text(r, target) for r in routes_], _summary(routes_, target))
              for routes_ in _exploration_rounds(problem, rng, size, distinct)]
    return "\n".join(blocks) + f"\n{FINAL} {problem.answer}"


def _verification_trace(problem: Problem, rng: random.Random, schema: TagSchema, count) -> str:
    """The sequential teacher's attempts, then one block of `count()` CHECKS of the answer (drawn
    after the attempts), summed up by its expression, then the answer; a schema with plans names
    each check."""
    tried, right = _sequential_attempts(problem, rng), _right_route(problem)
    names = _pick_checks(rng, count())
    block = _block(schema, names if schema.planned else None, [CHECKS[name](right, problem) for name in names],
                   right.expression)
    lines = [attempt_text(r, problem.extra["target"]) for r in tried] + [block]
    return "\n".join(lines) + f"\n{FINAL} {right.expression}"


def _draw_kind(rng: random.Random, kind: str | None) -> str:
    if kind is None:
        return "verification" if rng.random() < VERIFICATION_SHARE else "exploration"
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown parallel trace kind {kind!r}: use one of {', '.join(TRACE_KINDS)}")
    return kind


def _summary(routes_: list[Route], target: int) -> str:
    """What a block of attempts sums up to: the expression of the route that checks out, or "no"."""
    return next((r.expression for r in routes_ if r.value == target), "no")


def _block(t: TagSchema, plans: list[str] | None, branches: list[str], summary: str) -> str:
    """One block in `t`'s tags: plans (a schema with plans) and branches, each opening with its label."""
    head = t.block_open
    if t.planned:
        head += "".join(f"{t.plan_open}{t.label(k)}{plan}{t.plan_close}" for k, plan in enumerate(plans)) + t.plans_close
    body = "".join(f"{t.path_open}{t.label(k)}{branch}{t.path_close}" for k, branch in enumerate(branches))
    return f"{head}{body}{t.block_close or ''}{t.summary_open}{summary}{t.summary_close}"  # NPR's round has no closing tag


def _check_parallel_problem(problem: Problem) -> None:
    if problem.extra["level"] != "easy":
        raise ValueError(f"the teacher writes parallel traces for easy problems only, not {problem.extra['level']!r}")


# --------------------------------------------------------------------------- tokenizer and model


WORDS = [FINAL, "numbers", "target", "yes", "no", "vs", " so "]  # whole tokens; everything else is a character


def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer (`tiny.word_tokenizer`): the task's words, then one token per
    printable ASCII character, tab and newline, so any ASCII text round-trips exactly (spaces
    included); the six tags are single (special) tokens, added last. EOS is also the pad token, as
    in `tiny.char_tokenizer` and base Qwen: nanopar never infers a loss mask from padding, every
    batch carries an explicit mask.
    """
    tokenizer = word_tokenizer(WORDS, whitespace="\t\n", clean_up_tokenization_spaces=False)
    add_tag_tokens(tokenizer)
    return tokenizer


def toy_model_config(tokenizer=None, hidden_size: int = 128, num_layers: int = 4):
    """The toy model's Qwen3 config: ~0.8M parameters (hidden 128, 4 layers, 4 heads / 2 KV heads,
    MLP 384), vocabulary = the tokenizer's size rounded up to 64 (128 for `toy_tokenizer()`)."""
    tokenizer = tokenizer or toy_tokenizer()
    config = tiny_qwen_config("qwen3", vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=hidden_size,
                              num_layers=num_layers, num_heads=4, num_kv_heads=2,
                              intermediate_size=3 * hidden_size, max_positions=1024)
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    return config


MODEL_NAME = "toy:model"  # what `model.load_model` builds through SOURCE


def toy_model(name: str = MODEL_NAME, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """(model, tokenizer): the toy model (`toy_model_config`) initialised with seed 0, eval mode."""
    if name != MODEL_NAME:
        raise NanoparError(f"unknown toy model {name!r}: use {MODEL_NAME}")
    tokenizer = toy_tokenizer()
    config = toy_model_config(tokenizer)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------- as data for the stages

TOY_TRAIN_PROBLEMS = 20_000  # problems per level behind "toy:easy" / "toy:hard" (seeded, may repeat)


def toy_problems(spec: str) -> list[Problem]:
    """Problems named "toy:easy", "toy:hard" (training) or "toy:easy:heldout", "toy:hard:heldout"."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1] not in LEVELS or (len(parts) == 3 and parts[2] != "heldout"):
        raise NanoparError(f"unknown toy data {spec!r}: use toy:easy, toy:hard, toy:easy:heldout or toy:hard:heldout")
    if len(parts) == 3:
        return heldout(parts[1])
    return list(_training_problems(parts[1], TOY_TRAIN_PROBLEMS))


@functools.lru_cache(maxsize=4)
def _training_problems(level: str, n: int) -> tuple[Problem, ...]:
    """Generated once per process (20,000 problems take ~1.5 s)."""
    return tuple(make_problems(level, n, seed={"easy": 1, "hard": 2}[level]))


INSTRUCTIONS = {"parallel": "in parallel", "plain": "", "none": ""}  # what the toy's prompts say, by name

TEACHER_MIXES = {  # trace set name -> (level, kind, share) parts
    "toy:sequential": [("easy", "sequential", 0.5), ("hard", "sequential", 0.5)],  # a base model (Parallel-R1's)
    # an instruct model (NPR's): it follows the parallel instructions some of the time, since a
    # tenth of its traces are prompted "in parallel" and written as a parallel trace, in the tags of
    # the schema asked for (easy problems only, as a strong model writes valid ones on GSM8K and
    # none on DAPO)
    "toy:instruct": [("easy", "sequential", 0.45), ("hard", "sequential", 0.45), ("easy", "instructed", 0.1)],
    # the cold start (in NPR's tags: NPR's cold start): easy parallel traces, with some hard
    # sequential ones kept in the mix so the model does not apply 3-number patterns to 4-number
    # problems (TOY-NOTES: hard accuracy fell to 0)
    "toy:parallel": [("easy", "parallel", 0.75), ("hard", "sequential", 0.25)],
}


def teacher_traces(spec: str, schema: TagSchema = PARALLEL_R1, n: int = 4000, seed: int = 3) -> list[dict]:
    """`n` teacher traces as SFT records (question, answer, response) for a name of TEACHER_MIXES;
    an "instructed" record also names its prompt's instructions ("parallel"). The parallel and
    instructed traces are written in `schema`'s tags (`npr_trace` for a schema with plans, else
    `parallel_trace`); the sequential ones have no tags and do not depend on it."""
    if spec not in TEACHER_MIXES:
        raise NanoparError(f"unknown toy traces {spec!r}: use one of {', '.join(TEACHER_MIXES)}")
    rng, records = random.Random(seed), []
    parallel = npr_trace if schema.planned else parallel_trace
    for level, kind, share in TEACHER_MIXES[spec]:
        for problem in make_problems(level, round(n * share), seed=seed * 7 + len(records)):
            response = sequential_trace(problem, rng) if kind == "sequential" else parallel(problem, rng, schema=schema)
            records.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                            "response": response} | ({"instructions": "parallel"} if kind == "instructed" else {}))
    rng.shuffle(records)
    return records


# the toy world as a data source (data.SOURCES["toy"]): "toy:easy" problems, "toy:parallel" traces, "toy:model"
SOURCE = Source(problems=toy_problems, traces=teacher_traces, model=toy_model, model_names=(MODEL_NAME,),
                instructions=INSTRUCTIONS, bases={"parallel-r1": "toy:sequential", "npr": "toy:instruct"},
                test_sets={f"toy:{level}": f"toy:{level}:heldout" for level in LEVELS})
