"""The toy world: a Countdown-style task, its exact checker, a programmatic teacher, a tokenizer
and a ~0.8M-parameter Qwen3, so the whole curriculum runs on a laptop CPU in minutes.

Reach a target from a few numbers with + - *, each number used exactly once:

    question  "numbers 3 7 12 target 33"          answer  "(7*3)+12"

easy: 3 numbers (the GSM8K analogue), hard: 4 (the DAPO analogue); numbers 1..9, every
intermediate result a positive integer <= 100. Trying several routes side by side genuinely
helps: about 11% of an easy problem's legal routes reach its target, 4% of a hard one's. The
teacher writes sequential traces (attempts one a line) and, for easy problems, parallel ones in
the tags of either schema: Parallel-R1's (one block of 3 paths, a summary) or NPR's (a guideline
of 2 or 3 plans, a step per plan, a takeaway); see "the teacher" below for all three, with lengths.

The general modules reach this file only through two registry entries: `SOURCE`
(data.SOURCES["toy"]: problems "toy:easy", traces "toy:parallel", the model "toy:model") and
`grade_countdown` (grading.CHECKERS["countdown"]). Left out: division (routes stay in the
integers), unary minus, larger numbers (1..15 and <= 150: ~3x more facts for the model to learn).
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


LEVELS = {"easy": Level(count=3, attempts=4), "hard": Level(count=4, attempts=3)}
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


def is_heldout(numbers, target: int) -> bool:
    """The split: held out when crc32("sorted numbers>target") is 0 mod 10 (about 10% of problems),
    so `make_problems` (training, any seed; repeats allowed) and `heldout` (fixed seed, distinct
    problems) never share a problem, whatever seeds are used."""
    return zlib.crc32(f"{sorted(numbers)}>{target}".encode()) % 10 == 0


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
        if is_heldout(numbers, route.value) != (split == "heldout"):
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


def heldout(level: str, n: int = 150) -> list[Problem]:
    """The fixed held-out split of a level: `n` distinct problems no training seed can produce."""
    return list(_heldout(level, n))


@functools.lru_cache(maxsize=8)
def _heldout(level: str, n: int) -> tuple[Problem, ...]:
    """Computed once per process. Draws grow until `n` are distinct (easy repeats often); a longer
    draw starts with the shorter one, so the result does not depend on how many draws it took."""
    for draws in (4 * n, 16 * n, 64 * n):
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
# one path of three was where a third of the cold-started model's answers went wrong):
#
#     sequential  12-7=5,5*3=15vs33no              parallel (easy only)  <Parallel><Path>12-7=5,5*3=15vs33no</Path>
#                 7*3=21,21+12=33vs33yes so (7*3)+12     <Path>7*3=21,21+12=33vs33yes so (7*3)+12</Path>...</Parallel>
#                 Final Answer: (7*3)+12                 <Summary>(7*3)+12</Summary>
#                                                        Final Answer: (7*3)+12
#
# NPR's round (`npr_trace`, easy only) is the same attempts in its tags: each plan names its route
# by the first move ("1:7*3", a few tokens; the plans' first moves differ, so no two plans are one
# strategy), step i is "i:" and the attempt of plan i's route, the takeaway the expression:
#
#     <guideline><plan>1:8+7</plan><plan>2:8*7</plan></guideline><step>1:8+7=15,15+8=23vs64no</step>
#     <step>2:8*7=56,56+8=64vs64yes so (8*7)+8</step><takeaway>(8*7)+8</takeaway>
#     Final Answer: (8*7)+8
#
# The label follows the tag with no space: the sampler forces the ids of "1:" after <step> and the
# model continues from there. The teacher writes 2 or 3 plans, each half the time (K = 3 at most):
# under NPR the model chooses how many branches to fork, so its cold start must show more than one
# count (one fixed count would be Parallel-R1's K again), and RL can then shift the mix towards what
# pays (3 plans try one more route, 2 are ~27 tokens shorter). The count is drawn, not
# tied to the problem: nothing the model can read in an easy question says how hard it is.
#
# Lengths in `toy_tokenizer` tokens (600 traces each; NPR with its tags added): easy sequential
# mean ~60 / max ~93, hard sequential ~73 / ~106, easy parallel ~84 / ~93, easy NPR ~97 / ~117
# (2 plans ~83 / ~88, 3 plans ~110 / ~117; over all 20,000 "toy:easy" problems the same, max 117);
# tests/test_toy.py holds them <= 130, and a step (label, attempt, </step>) <= 48.
# Traces carry no EOS: the trainer appends `tokenizer.eos_token`. The toy prompt is the question
# alone (`prompts.build_prompt(problem, tokenizer, instructions="")` gives "question\n").


def attempt_text(route: Route, target: int) -> str:
    """One attempt, its comparison with the target written out, and the expression when it
    checks out: "7*3=21,21+12=33vs33yes so (7*3)+12" or "12-7=5,5*3=15vs33no"."""
    verdict = f"yes so {route.expression}" if route.value == target else "no"
    return f"{','.join(route.steps)}vs{target}{verdict}"


def first_move(route: Route) -> str:
    """The first step of a route without its result: "7*3" for ("7*3=21", "21+12=33")."""
    return route.steps[0].partition("=")[0]


def _pick_routes(problem: Problem, rng: random.Random, k: int, distinct=lambda route: route.steps
                 ) -> tuple[list[Route], Route]:
    """K routes at most: the problem's own route (the one that checks out) at a random place, the
    others random legal routes that miss the target (fewer if they are hard to find), no two of
    them alike by `distinct` (the steps; NPR's teacher: the first move)."""
    numbers, target = problem.extra["numbers"], problem.extra["target"]
    right = Route(tuple(problem.extra["steps"]), target, problem.answer)
    wrong: dict = {}
    for _ in range(50 * k):  # a random walk is ~10 us, so this is cheap even for 4 numbers
        if len(wrong) == k - 1:
            break
        route = random_route(numbers, LEVELS[problem.extra["level"]].bound, rng)
        if route.value != target and distinct(route) != distinct(right):  # by steps: the first test implies the second
            wrong.setdefault(distinct(route), route)
    chosen = list(wrong.values())
    chosen.insert(rng.randrange(len(chosen) + 1), right)
    return chosen, right


def sequential_trace(problem: Problem, rng: random.Random, attempts: int | None = None) -> str:
    """Attempts one per line until the one that checks out (at a random attempt 1..K), then the answer.

    K = `attempts`, or the level's default (easy 4, hard 3).
    """
    chosen, right = _pick_routes(problem, rng, attempts or LEVELS[problem.extra["level"]].attempts)
    tried = chosen[: chosen.index(right) + 1]  # stop at the attempt that checks out
    lines = [attempt_text(r, problem.extra["target"]) for r in tried]
    return "\n".join(lines) + f"\n{FINAL} {right.expression}"


def parallel_trace(problem: Problem, rng: random.Random, paths: int = PARALLEL_PATHS,
                   schema: TagSchema = PARALLEL_R1) -> str:
    """One parallel block of K paths (one route each, the right one at a random place), a summary
    that keeps the path that checks out, then the answer. Easy problems only, as in the paper.
    A schema of Parallel-R1's shape (a schema with plans: `npr_trace`).
    """
    _check_parallel_problem(problem)
    if schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has plans: write its traces with npr_trace")
    t = schema
    chosen, right = _pick_routes(problem, rng, paths)
    target = problem.extra["target"]
    block = "".join(f"{t.path_open}{t.label(k)}{attempt_text(r, target)}{t.path_close}" for k, r in enumerate(chosen))
    summary = f"{t.summary_open}{right.expression}{t.summary_close}"
    return f"{t.block_open}{block}{t.block_close}{summary}\n{FINAL} {right.expression}"


def npr_trace(problem: Problem, rng: random.Random, paths: int = PARALLEL_PATHS, schema: TagSchema = NPR) -> str:
    """One NPR round, then the answer: a guideline of 2..K plans (K = `paths`, each count equally
    likely), plan i "i:" and the first move of its route (the right route at a random place, the
    others random routes that miss, their first moves all different); step i "i:" and the attempt of
    plan i's route; a takeaway with the expression of the route that checks out. Easy problems only.
    Fewer plans when the problem has too few other first moves that miss (never seen below 2).
    """
    _check_parallel_problem(problem)
    if not schema.planned:
        raise ValueError(f"the tag schema {schema.name!r} has no plans: write its traces with parallel_trace")
    if not 2 <= paths <= MAX_PATHS:
        raise ValueError(f"an NPR round of the teacher has 2..{MAX_PATHS} plans, not at most {paths}")
    t = schema
    chosen, right = _pick_routes(problem, rng, rng.randint(2, paths), distinct=first_move)
    target = problem.extra["target"]
    plans = "".join(f"{t.plan_open}{t.label(k)}{first_move(r)}{t.plan_close}" for k, r in enumerate(chosen))
    steps = "".join(f"{t.path_open}{t.label(k)}{attempt_text(r, target)}{t.path_close}" for k, r in enumerate(chosen))
    takeaway = f"{t.summary_open}{right.expression}{t.summary_close}"
    return f"{t.block_open}{plans}{t.plans_close}{steps}{takeaway}\n{FINAL} {right.expression}"


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
