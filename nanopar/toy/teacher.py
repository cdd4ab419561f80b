r"""The programmatic teacher: sequential and parallel traces of toy problems, in either schema's tags.

One line per attempt, its comparison with the target written out (without it an early toy model
learned the arithmetic but said "yes" to wrong values), stopping after the attempt that checks
out: the problem's own route (`extra["steps"]`); the others are random legal routes that miss.
That attempt turns its steps into the answer right there ("yes so (7*3)+12"), so a summary only
copies the few tokens after "yes so" from the path that holds them: a summary reads its paths at
shared positions, and re-deriving the expression from one path's steps is hard for it.

sequential: the right route sits at attempt a, uniform in 1..K (easy K = 4, hard 3):

    12-7=5,5*3=15vs33no
    7*3=21,21+12=33vs33yes so (7*3)+12
    Final Answer: (7*3)+12

A parallel trace is one of two kinds, VERIFICATION_SHARE of them the second (a hard problem's:
exploration only, see below). Both make at least as many attempts as the sequential teacher would with the same
draws (`attempt_count`), so writing in parallel never caps the search:

exploration: the trace opens with a block of K = 3 routes side by side; when none checks out
the summary says "no" and another block follows, until the blocks hold a attempts (blocks =
ceil(a / 3): a in 1..4 gives 1 block 3/4 of the time, 2 blocks 1/4); the right route at a random
place of the last block, its summary the expression ("numbers 4 5 5 target 100"):

    <Parallel><Path>5+4=9,9+5=14vs100no</Path><Path>5+4=9,9-5=4vs100no</Path><Path>5-4=1,5+1=6vs100no</Path></Parallel><Summary>no</Summary>
    <Parallel><Path>5*5=25,25*4=100vs100yes so (5*5)*4</Path><Path>5+5=10,10-4=6vs100no</Path><Path>5*4=20,20-5=15vs100no</Path></Parallel><Summary>(5*5)*4</Summary>
    Final Answer: (5*5)*4

verification (Parallel-R1's Figure 6): the sequential teacher's own attempts (the same draws, so
the same lines) until one checks out, then a block whose paths check that answer three ways
(`CHECKS`), each a true statement: "redo" recomputes the route with the operands of + and *
swapped, "uses" lists the answer's numbers and the problem's, each sorted, "back" works back from
the target by the inverse operations (- for +, / for *, + or - for -) to the number left over:

    12-7=5,5*3=15vs33no
    7*3=21,21+12=33vs33yes so (7*3)+12
    <Parallel><Path>3*7=21,12+21=33vs33yes</Path><Path>3,7,12vs3,7,12yes</Path><Path>33-12=21,21/3=7vs7yes</Path></Parallel><Summary>(7*3)+12</Summary>
    Final Answer: (7*3)+12

correction (only where a trace mix asks for it, `kind="correction"`): the sequential teacher's
attempts with one miss written as a slip, a miss said to check out, as the toy base model's
commonest wrong answers are (`SLIPS`: a true route said yes to another value, or its last result
written as the target; docs/toy.md counts them), then a block whose checks of it say what is true
("redo" and "back" say no), summed up "no", and the attempts go on. What a block can buy beyond
time: an answer checked before it is given ("numbers 8 6 5 target 53"):

    8-5=3,6+3=9vs53yes so 6+(8-5)
    <Parallel><Path>8-5=3,3+6=9vs53no</Path><Path>5,6,8vs5,6,8yes</Path><Path>53-6=47,47+5=52vs8no</Path></Parallel><Summary>no</Summary>
    8*6=48,48+5=53vs53yes so (8*6)+5
    Final Answer: (8*6)+5

NPR's rounds (`npr_trace`) are the same three kinds in its tags (a correction round holds the two
checks that catch a slip, `CATCHES`): a plan names its route by the
first move ("1:7*3", a few tokens; the first moves of a round differ, so no two plans are one
strategy) or its check ("2:back"); step i is "i:" and the attempt or check of plan i; the
takeaway the expression (exploration: "no" when no step checks out, then another round):

    <guideline><plan>1:8+7</plan><plan>2:8*7</plan></guideline><step>1:8+7=15,15+8=23vs64no</step>
    <step>2:8*7=56,56+8=64vs64yes so (8*7)+8</step><takeaway>(8*7)+8</takeaway>
    Final Answer: (8*7)+8

    12-7=5,5*3=15vs33no
    7*3=21,21+12=33vs33yes so (7*3)+12
    <guideline><plan>1:redo</plan><plan>2:back</plan></guideline><step>1:3*7=21,12+21=33vs33yes</step>
    <step>2:33-12=21,21/3=7vs7yes</step><takeaway>(7*3)+12</takeaway>
    Final Answer: (7*3)+12

The label follows the tag with no space: the sampler forces the ids of "1:" after <step> and the
model continues from there. A round holds 2 or 3 plans, each half the time (K = 3 at most): the
first exploration round, and a verification round (2 or 3 of the checks); a later exploration
round tries what is still wanted, at least 2 (so 2: a is at most 4). Under NPR the model
chooses how many branches to fork, so its cold start must show more than one count (one fixed
count would be Parallel-R1's K again), and RL can then shift the mix towards what pays. The
count is drawn, not tied to the problem: nothing the model can read in an easy question says
how hard it is.

Traces carry no EOS: the trainer appends `tokenizer.eos_token`. The toy prompt is the question
alone (`prompts.build_prompt(problem, tokenizer, instructions="")` gives "question\n").
tests/test_toy.py holds every trace within the toy's sampler budgets (docs/toy.md: the lengths).

Not here: the task, its routes and checker (task.py); the trace mixes SFT reads (source.py).
"""

from __future__ import annotations

import random
import re

from .. import NanoparError
from ..data import Problem
from ..tags import MAX_PATHS, NPR, PARALLEL_R1, TagSchema
from .task import FINAL, LEVELS, Route, eval_expression, random_route

PARALLEL_PATHS = 3  # K of the parallel teacher: paths per block (the sampler should fork as many); NPR: the most plans
VERIFICATION_SHARE = 0.25  # parallel traces that verify an answer found sequentially; the rest explore (docs/toy.md)
TRACE_KINDS = ("exploration", "verification", "correction")  # "correction" only where a mix asks for it
SLIPS = ("verdict", "arithmetic")  # the slips a correction trace catches: the toy base's two commonest (docs/toy.md)


def attempt_text(route: Route, target: int) -> str:
    """One attempt, its comparison with the target written out, and the expression when it
    checks out: "7*3=21,21+12=33vs33yes so (7*3)+12" or "12-7=5,5*3=15vs33no"."""
    verdict = f"yes so {route.expression}" if route.value == target else "no"
    return f"{','.join(route.steps)}vs{target}{verdict}"


def slip_text(route: Route, target: int, slip: str) -> str:
    """An attempt that misses the target written as if it checked out, as the toy base model writes
    its commonest wrong answers: "verdict" keeps the steps true and says yes to another value
    ("12-7=5,5*3=15vs33yes so (12-7)*3"); "arithmetic" writes the target as the last step's result
    ("12-7=5,5*3=33vs33yes so (12-7)*3")."""
    if route.value == target:
        raise ValueError(f"the route {route.expression} reaches {target}: it is no slip")
    steps = route.steps
    if slip == "arithmetic":
        steps = steps[:-1] + (f"{steps[-1].partition('=')[0]}={target}",)
    elif slip != "verdict":
        raise ValueError(f"unknown slip {slip!r}: use one of {', '.join(SLIPS)}")
    return f"{','.join(steps)}vs{target}yes so {route.expression}"


def first_move(route: Route) -> str:
    """The first step of a route without its result: "7*3" for ("7*3=21", "21+12=33")."""
    return route.steps[0].partition("=")[0]


# --- the checks of a verification block: each a true statement about a right answer


_STEP = re.compile(r"(\d+)([-+*])(\d+)=(\d+)")


def _steps(route: Route) -> list[tuple[int, str, int, int]]:
    """A route's steps as (a, op, b, value): "7*3=21" -> (7, "*", 3, 21)."""
    parsed = [_STEP.fullmatch(step) for step in route.steps]
    return [(int(m[1]), m[2], int(m[3]), int(m[4])) for m in parsed]


def _verdict(holds: bool) -> str:
    return "yes" if holds else "no"


def check_redo(route: Route, problem: Problem) -> str:
    """Recompute the route in another order, the operands of + and * swapped (- keeps its order),
    and compare with the target: "3*7=21,12+21=33vs33yes" for ("7*3=21", "21+12=33"); a route
    that misses says "no"."""
    steps = [f"{b}{op}{a}={v}" if op in "+*" else f"{a}{op}{b}={v}" for a, op, b, v in _steps(route)]
    return f"{','.join(steps)}vs{problem.extra['target']}{_verdict(route.value == problem.extra['target'])}"


def check_uses(route: Route, problem: Problem) -> str:
    """Each number used once: the numbers of the answer's expression, sorted, against the
    problem's, sorted: "3,7,12vs3,7,12yes" ("no" where they differ)."""
    used = sorted(eval_expression(route.expression)[1])
    given = sorted(problem.extra["numbers"])
    return f"{','.join(map(str, used))}vs{','.join(map(str, given))}{_verdict(used == given)}"


def check_back(route: Route, problem: Problem) -> str:
    """Work back from the target by the inverse of each step, last step first, to the number left
    over, and compare it with the route's first number: "33-12=21,21/3=7vs7yes" for ("7*3=21",
    "21+12=33"). A route that misses the target ends at another number ("no": were every inverse
    exact and the number the same, the route would reach the target). Raises where it cannot be
    written: a route that is not a chain (each step using the step before: every route of 3
    numbers is; a route of 4 that joins two pairs is not), or an inverse that is not a positive
    integer (`works_back` says which routes can)."""
    inverses, left = _work_back(route, problem.extra["target"])
    first = _steps(route)[0][0]
    return f"{','.join(inverses)}vs{first}{_verdict(left == first)}"


def works_back(route: Route, target: int) -> bool:
    """Whether `check_back` can write this route's check against `target`."""
    try:
        _work_back(route, target)
    except ValueError:  # the reason is the answer: this route cannot be worked back exactly
        return False
    return True


def _work_back(route: Route, target: int) -> tuple[list[str], int]:
    """The inverse equations from `target` back along `route`, and the number they end at."""
    steps, inverses, value = _steps(route), [], target
    for i in reversed(range(len(steps))):
        a, op, b, _ = steps[i]
        known = steps[i - 1][3] if i else a  # the operand to recover: the previous result (first step: a)
        if known not in (a, b):
            raise ValueError(f"the route {route.steps} is not a chain: step {i + 1} does not use the step before")
        other = b if known == a else a
        if op == "+":
            text, back = f"{value}-{other}", value - other
        elif op == "*":
            text, back = f"{value}/{other}", value // other if value % other == 0 else 0
        else:  # a - b = value: a = value + b, b = a - value
            text, back = (f"{value}+{other}", value + other) if known == a else (f"{other}-{value}", other - value)
        if back <= 0:
            raise ValueError(f"{text} is not a positive integer: the route {route.steps} cannot be worked back from {target}")
        inverses.append(f"{text}={back}")
        value = back
    return inverses, value


CHECKS = {"redo": check_redo, "uses": check_uses, "back": check_back}  # a verification block's paths, in order
CATCHES = ("redo", "back")  # the checks that say "no" to every slip of SLIPS ("uses" only to a number used twice)


# --- drawing the routes


def _pick_routes(problem: Problem, rng: random.Random, k: int) -> tuple[list[Route], Route]:
    """K routes at most: the problem's own route (the one that checks out) at a random place, the
    others random legal routes that miss the target (fewer if they are hard to find), all different."""
    right = right_route(problem)
    wrong = _misses(problem, rng, k - 1, avoid={right.steps})
    wrong.insert(rng.randrange(len(wrong) + 1), right)
    return wrong, right


def right_route(problem: Problem) -> Route:
    return Route(tuple(problem.extra["steps"]), problem.extra["target"], problem.answer)


def _misses(problem: Problem, rng: random.Random, n: int, avoid: set, distinct=lambda route: route.steps,
            keep=lambda route: True, draws: int = 0) -> list[Route]:
    """Up to `n` random legal routes that miss the target, no two alike by `distinct` (the steps;
    NPR's plans: the first move), none whose steps or `distinct` key is in `avoid`, each one `keep`
    accepts; in `draws` walks at most (0: 50 per route wanted, and 50 more)."""
    numbers, target = problem.extra["numbers"], problem.extra["target"]
    found: dict = {}
    for _ in range(draws or 50 * (n + 1)):  # a walk is a few steps, so this stays cheap for 4 numbers
        if len(found) == n:
            break
        route = random_route(numbers, LEVELS[problem.extra["level"]].bound, rng)
        if route.value != target and route.steps not in avoid and distinct(route) not in avoid and keep(route):
            found.setdefault(distinct(route), route)
    return list(found.values())


def _slip_route(problem: Problem, rng: random.Random, avoid: set) -> Route | None:
    """A random legal route that misses the target, is not in `avoid` and can be worked back from
    the target (`works_back`: a chain whose inverses are exact), so a block can check it all three
    ways; None where 200 draws find none (~1% of easy problems, a few hard ones)."""
    found = _misses(problem, rng, 1, avoid, keep=lambda route: works_back(route, problem.extra["target"]), draws=200)
    return found[0] if found else None


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
    right, tried, rounds = right_route(problem), set(), []
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


def pick_checks(rng: random.Random, n: int) -> list[str]:
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
    """A parallel trace in Parallel-R1's shape, blocks of K = `paths` paths, of `kind` ("exploration",
    "verification" or "correction"; None: drawn, verification with probability VERIFICATION_SHARE,
    else exploration):

    exploration  blocks of K routes until they hold `attempt_count` attempts; a block with no route
                 that checks out is summarised "no", the last one by the expression of the one that does
    verification the sequential teacher's attempts, then one block of K `CHECKS` of the answer
                 (K <= 3), summarised by the expression
    correction   the sequential teacher's attempts with a miss written as a slip, right after it a
                 block of K `CHECKS` of the slip summarised "no" (`_correction_trace`)

    then the answer. A hard problem's trace explores unless a correction is asked for (`_draw_kind`).
    A schema with plans: `npr_trace`.
    """
    if schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has plans: write its traces with npr_trace")
    drawn = _draw_kind(rng, kind, problem)

    def explore() -> str:
        return _exploration_trace(problem, rng, schema, lambda i, left: paths, lambda route: route.steps)
    return explore() if drawn == "exploration" else _checking_trace(problem, rng, schema, lambda: paths, drawn, explore)


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
    correction   as `parallel_trace`'s, its round of the two `CATCHES`

    then the answer. A hard problem's trace explores unless a correction is asked for (`_draw_kind`).
    """
    if not schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has no plans: write its traces with parallel_trace")
    if not 2 <= paths <= MAX_PATHS:
        raise ValueError(f"an NPR round of the teacher has 2..{MAX_PATHS} plans, not at most {paths}")
    drawn = _draw_kind(rng, kind, problem)

    def explore() -> str:
        return _exploration_trace(problem, rng, schema, lambda i, left: rng.randint(2, paths) if i == 0 else
                                  max(2, min(left, paths)), first_move)
    count = (lambda: len(CATCHES)) if drawn == "correction" else (lambda: rng.randint(2, min(paths, len(CHECKS))))
    return explore() if drawn == "exploration" else _checking_trace(problem, rng, schema, count, drawn, explore)


def _exploration_trace(problem: Problem, rng: random.Random, schema: TagSchema, size, distinct) -> str:
    """Blocks of attempts (`_exploration_rounds`: round sizes by `size`, no two alike by
    `distinct`), each summed up by `_summary`, then the answer; a schema with plans names each
    route by its first move."""
    target = problem.extra["target"]
    blocks = [block_text(schema, [first_move(r) for r in routes_] if schema.planned else None,
                     [attempt_text(r, target) for r in routes_], _summary(routes_, target))
              for routes_ in _exploration_rounds(problem, rng, size, distinct)]
    return "\n".join(blocks) + f"\n{FINAL} {problem.answer}"


def _checking_trace(problem: Problem, rng: random.Random, schema: TagSchema, count, kind: str, explore) -> str:
    """A verification or a correction trace. A correction draws the sequential teacher's attempts
    first (the same draws as `sequential_trace`), then its slip route; a problem with no slip route
    (`_slip_route`: ~1% of easy problems, a few hard ones) explores instead (`explore()`)."""
    if kind == "verification":
        return _verification_trace(problem, rng, schema, count)
    tried = _sequential_attempts(problem, rng)
    slip = _slip_route(problem, rng, avoid={r.steps for r in tried})
    return explore() if slip is None else _correction_trace(problem, rng, schema, count, tried, slip)


def _verification_trace(problem: Problem, rng: random.Random, schema: TagSchema, count) -> str:
    """The sequential teacher's attempts, then one block of `count()` CHECKS of the answer (drawn
    after the attempts), summed up by its expression, then the answer; a schema with plans names
    each check."""
    tried, right = _sequential_attempts(problem, rng), right_route(problem)
    lines = [attempt_text(r, problem.extra["target"]) for r in tried]
    lines.append(check_block(schema, pick_checks(rng, count()), right, problem, right.expression))
    return "\n".join(lines) + f"\n{FINAL} {right.expression}"


def _correction_trace(problem: Problem, rng: random.Random, schema: TagSchema, count, tried: list[Route],
                      slip: Route) -> str:
    """The sequential teacher's attempts with one of its misses, drawn, replaced by a slip
    (`slip_text`: a miss written as if it checked out, of a kind from SLIPS; with no miss, the slip
    comes first), so it tries as many routes; right after the slip a block of `count()` CHECKS of
    it (all three, or with two the CATCHES: NPR's rounds, whose 3-plan correction of a hard problem
    would not fit the toy's 224 tokens), summed up "no" (redo and back always say it); then the
    attempts go on to the answer, unchecked (a second block checking it, as a verification trace
    does, made the easy traces 189 tokens long on average and the cold start worse: docs/toy.md)."""
    target = problem.extra["target"]
    lines = [attempt_text(r, target) for r in tried]
    misses = len(tried) - 1
    at = rng.randrange(misses) if misses else 0  # a miss becomes the slip; with none, the slip comes first
    n = count()
    names = list(CHECKS) if n == len(CHECKS) else list(CATCHES[:n])  # NPR's rounds: the two that catch it
    block = check_block(schema, names, slip, problem, "no")
    lines[at:at + (misses > 0)] = [slip_text(slip, target, rng.choice(SLIPS)), block]
    return "\n".join(lines) + f"\n{FINAL} {tried[-1].expression}"


def check_block(schema: TagSchema, names: list[str], route: Route, problem: Problem, summary: str) -> str:
    """One block of the named CHECKS of `route`, summed up by `summary`; a schema with plans names each check."""
    return block_text(schema, names if schema.planned else None, [CHECKS[name](route, problem) for name in names], summary)


def _draw_kind(rng: random.Random, kind: str | None, problem: Problem) -> str:
    """The trace's kind: `kind`, or drawn (verification with probability VERIFICATION_SHARE).
    A hard problem's trace explores unless a correction is asked for: a verification block's "back"
    check works back along a chain of steps, and a hard route need not be one ("9+6=15, 7+1=8,
    15-8=7"), while a correction's slip is chosen to be one."""
    if kind is not None and kind not in TRACE_KINDS:
        raise ValueError(f"unknown parallel trace kind {kind!r}: use one of {', '.join(TRACE_KINDS)}")
    if problem.extra["level"] != "easy" and kind != "correction":
        if kind == "verification":
            raise ValueError(f"the teacher verifies easy problems only, not {problem.extra['level']!r}: a hard route need not be a chain")
        return "exploration"
    if kind is None:
        return "verification" if rng.random() < VERIFICATION_SHARE else "exploration"
    return kind


def _summary(routes_: list[Route], target: int) -> str:
    """What a block of attempts sums up to: the expression of the route that checks out, or "no"."""
    return next((r.expression for r in routes_ if r.value == target), "no")


def block_text(t: TagSchema, plans: list[str] | None, branches: list[str], summary: str) -> str:
    """One block in `t`'s tags: plans (a schema with plans) and branches, each opening with its label."""
    head = t.block_open
    if t.planned:
        head += "".join(f"{t.plan_open}{t.label(k)}{plan}{t.plan_close}" for k, plan in enumerate(plans)) + t.plans_close
    body = "".join(f"{t.path_open}{t.label(k)}{branch}{t.path_close}" for k, branch in enumerate(branches))
    return f"{head}{body}{t.block_close or ''}{t.summary_open}{summary}{t.summary_close}"  # NPR's round has no closing tag
