"""The toy task: reach a target from a few numbers with + - *, each number used exactly once.

    question  "numbers 3 7 12 target 33"          answer  "(7*3)+12"

Levels: easy, 3 numbers (the GSM8K analogue), hard, 4 (the DAPO analogue); numbers 1..9, every
intermediate result a positive integer <= 100. Trying several routes helps, side by side or in a
row: about 11% of an easy problem's legal routes reach its target, 4% of a hard one's. Here: the
routes, seeded problems and the fixed held-out split (by checksum), `eval_expression` (a small
parser, never `eval`) and the exact checker (`grade_countdown`, grading.CHECKERS["countdown"]).

Not here: the teacher's traces (teacher.py), the tokenizer, model and named data (source.py);
division (routes stay in the integers), unary minus, larger numbers (1..15 and <= 150: ~3x more
facts for the model to learn).
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from dataclasses import dataclass

from ..data import Problem
from ..grading import FINAL_ANSWER_LINE, Grade

@dataclass(frozen=True)
class Level:
    count: int  # how many numbers
    attempts: int  # K of the sequential teacher: the correct route sits at a random attempt 1..K
    low: int = 1  # smallest number
    high: int = 9  # largest number
    bound: int = 100  # every intermediate result lies in 1..bound
    heldout_tenths: int = 1  # share of the level's problems held out of training, in tenths (`is_heldout`)
    heldout_problems: int = 150  # size of the fixed held-out set ("toy:<level>:heldout"; evaluations take its first N)


# easy holds out 3 tenths: its world has only 1,865 distinct problems, and its held-out set needs
# ~550 of them for a small enough standard error (docs/toy.md); hard's 20,142 need 1 tenth
LEVELS = {"easy": Level(count=3, attempts=4, heldout_tenths=3, heldout_problems=560),
          "hard": Level(count=4, attempts=3, heldout_problems=560)}
HELDOUT_SEED = 1_000_000_007  # the held-out generator's seed (the split itself is by checksum)
FINAL = "Final Answer:"  # what opens the answer line of every trace (graded by `grading.FINAL_ANSWER_LINE`)


# --------------------------------------------------------------------------- routes and problems


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


def eval_expression(expression: str) -> tuple[int, list[int]]:
    """(value, numbers used) of an expression of integers, + - * and parentheses; ValueError if malformed.

    A small recursive-descent parser (never `eval`): usual precedence, no unary minus.

    >>> eval_expression("(3*7)+12"), eval_expression("12+3*7"), eval_expression("2-3")
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

    A malformed expression is simply wrong (call `eval_expression` to see why). Only the numbers and
    the value are checked: the answer's intermediates are not held to the generator's bound.

    >>> p = Problem("t", "numbers 3 7 12 target 33", "(7*3)+12", extra={"numbers": [3, 7, 12], "target": 33})
    >>> check_countdown("12+7*3", p), check_countdown("3*7+12+3", p), check_countdown("3*7+12)", p)
    (True, False, False)
    """
    if answer_text is None:
        return False
    try:
        value, used = eval_expression(answer_text)
    except ValueError:
        return False
    return value == problem.extra["target"] and sorted(used) == sorted(problem.extra["numbers"])


def grade_countdown(response_text: str, problem: Problem) -> Grade:
    """The "countdown" checker of `grading.CHECKERS`: the Final Answer line, checked exactly."""
    extracted = extract_toy_answer(response_text)
    if extracted is None:
        return Grade(False, None, "no answer found")
    return Grade(check_countdown(extracted, problem), extracted)
