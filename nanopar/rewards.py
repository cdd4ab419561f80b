"""Rewards for parallel thinking: the built-in rewards, and scoring a rollout with a weighted spec.

A reward scores one rollout: `fn(text, trace, problem) -> float` (`text`: the response with its
tags, `response_text`; `trace`: its reading; `problem`: the `data.Problem` it answers). Built-ins
(docs/recipes.md gives values and sources): accuracy, format, parallel (correct, with a block the
released format check passes: Parallel-R1 stage 1 as released), parallel-strict (correct in a
valid parallel trace: its write-up's reading), accuracy_parallel_bonus (Parallel-R1's released
reward for its alternating schedule's parallel steps), accuracy_times_parallel, valid_parallel,
answered, npr_format (NPR stage 1). What "valid" means is format.py's. A spec is a weighted sum,
"accuracy:1,format:0.2"; `score` returns the total, each component and the `Grade`, grading the
answer once (`graded`, `is_correct`) and counting a failure, never hiding it. `as_trl_reward`
wraps a reward for TRL's GRPOTrainer.
The registry (`@register`, `load_reward_file`, `parse_reward_spec`: reward_registry.py) and the
schedules (`Constant`, `Alternating`, `TwoPhase`, `schedule_from_string`: reward_schedules.py)
are importable from here too, as `nanopar.rewards.register` and so on.
Not here: PAPO's drop itself (grpo.py; `RewardResult.layout_ok` says what it keeps), length or
diversity rewards, learned reward models.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from . import NanoparError
from .data import Problem
from .format import check_format, check_parallel, check_released_format, check_structured, check_well_formed
from .grading import Grade, grade
from .reward_registry import (  # noqa: F401  (re-exported: nanopar.rewards.register is the documented name)
    REWARDS, SCHEDULE_WORDS, RewardFn, get_reward, load_reward_file, parse_reward_spec, register)
from .reward_schedules import Alternating, Constant, RewardSchedule, TwoPhase, schedule_from_string  # noqa: F401
from .tags import PARALLEL_R1, TagIds, TagSchema
from .trace import Trace, parse_ids, parse_trace


def response_text(rollout, tokenizer, eos_ids: list[int]) -> str:
    """The text a reward reads of a sampled rollout: tags kept, a final EOS token dropped."""
    ids = rollout.ids[:-1] if rollout.ids and rollout.ids[-1] in eos_ids else rollout.ids
    return tokenizer.decode(ids, skip_special_tokens=False)


PARALLEL_BONUS = 0.2  # what `accuracy_parallel_bonus` adds to a correct answer with a block that passes the check

# ----------------------------------------------------------------------------- grading, shared

_SCOPE: ContextVar[dict | None] = ContextVar("nanopar_grades", default=None)  # set while scoring


@contextmanager
def grading_scope():
    """Share grades within one scoring call: inside, `graded` computes each grade once.

    Yields the cache {(text, gold): Grade}; it is dropped on exit, so nothing is global.
    """
    token = _SCOPE.set({})
    try:
        yield _SCOPE.get()
    finally:
        _SCOPE.reset(token)


def graded(text: str, problem: Problem) -> Grade:
    """`grading.grade(text, problem)`, computed once per `score` call and shared by its rewards."""
    cache = _SCOPE.get()
    if cache is None:
        return grade(text, problem)
    key = (text, problem.answer)
    if key not in cache:
        cache[key] = grade(text, problem)
    return cache[key]


def is_correct(text: str, problem: Problem) -> bool:
    """Whether the final answer of `text` is right (graded once per `score` call)."""
    return graded(text, problem).correct


# ----------------------------------------------------------------------------- built-in rewards


@register("accuracy")
def accuracy(text: str, trace: Trace, problem: Problem) -> float:
    """+1 for a correct final answer, -1 otherwise (wrong, missing or ungradable)."""
    return 1.0 if is_correct(text, problem) else -1.0


@register("format")
def format_reward(text: str, trace: Trace, problem: Problem) -> float:
    """+1 if the format rules of the trace's schema accept the text (Parallel-R1's Algorithm 1, or
    NPR's rules; a text without tags passes), else -1."""
    return 1.0 if check_format(text, trace.schema).ok else -1.0


@register("parallel")
def parallel(text: str, trace: Trace, problem: Problem) -> float:
    """Parallel-R1's stage-1 reward as released (`compute_score` in
    verl/verl/utils/reward_score/math_dapo_accuracy_times_parallel.py): +1 for a correct answer
    whose text holds a block opener and passes the released format check
    (`format.check_released_format`, under NPR's tags NPR's rules), else -1. It reads the text, not
    the sampler's reading, so it pays a nested path, a summary left open or a tag written as text;
    the write-up's stricter reading is `parallel-strict`, the default run's stage-1 reward
    (docs/recipes.md, Simplifications).

    >>> right, block = Problem("p", "q", "4"), "<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s"
    >>> [f(block + " Final Answer: 4", parse_trace(block + " Final Answer: 4"), right) for f in (parallel, parallel_strict)]
    [1.0, -1.0]
    """
    schema = trace.schema
    if not is_correct(text, problem) or schema.block_open not in text:
        return -1.0
    return 1.0 if (check_format(text, schema) if schema.planned else check_released_format(text)).ok else -1.0


@register("parallel-strict")
def parallel_strict(text: str, trace: Trace, problem: Problem) -> float:
    """Parallel-R1 stage 1 as its write-up gives it: +1 only for a correct answer in a valid
    parallel trace (`format.check_parallel`, on the sampler's reading), else -1.
    The default of rl-easy (`TrainConfig.easy_reward`); the released code's looser reading is `parallel`."""
    return 1.0 if is_correct(text, problem) and check_parallel(trace).ok else -1.0


@register("accuracy_parallel_bonus")
def accuracy_parallel_bonus(text: str, trace: Trace, problem: Problem) -> float:
    """Parallel-R1's released reward on its alternating schedule's parallel steps
    (`reward_func_acc_and_parallel` in verl/verl/utils/reward_score/math_dapo_acc_parallel_interved.py):
      correct, no <Parallel> in the text                               1.0
      correct, one <Parallel> or more, the format check passes         1.0 + PARALLEL_BONUS = 1.2
      otherwise: wrong, or correct with a block the check fails       -1.0
    As the released code does, it reads the text (tags kept), not `trace`: it counts the block
    openers in it and asks the released format check (`format.check_released_format`, looser than
    Algorithm 1 in four places), so a correct answer whose block the check fails earns less
    than one without a block. Under NPR's tags the check is NPR's rules (`format.check_format`):
    the released check knows only Parallel-R1's. Departure: the answer is graded by nanopar's
    grader (`is_correct`), not the released one's last 300 characters.

    >>> right, block = Problem("p", "q", "4"), "<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary>"
    >>> [accuracy_parallel_bonus(t, parse_trace(t), right) for t in (block + "Final Answer: 4", "Final Answer: 4",
    ...  "<Parallel><Path>a</Path></Parallel><Summary>s</Summary>Final Answer: 4", block + "Final Answer: 5")]
    [1.2, 1.0, -1.0, -1.0]
    """
    if not is_correct(text, problem):
        return -1.0
    schema = trace.schema
    if text.count(schema.block_open) == 0:
        return 1.0
    passes = check_format(text, schema) if schema.planned else check_released_format(text)
    return 1.0 + PARALLEL_BONUS if passes.ok else -1.0


@register("accuracy_times_parallel")
def accuracy_times_parallel(text: str, trace: Trace, problem: Problem) -> float:
    """accuracy x [a valid parallel trace]: +1 correct in one, -1 wrong in one, 0 without one."""
    if not check_parallel(trace).ok:
        return 0.0
    return 1.0 if is_correct(text, problem) else -1.0


# What a model too small to solve the problems can still earn (the real-weights CPU run on SmolLM2,
# docs/real-checkpoint.md): its format, right or wrong. "valid_parallel:0.5,answered:0.5" gives
# -1, 0 or +1 for neither, one or both.
@register("valid_parallel")
def valid_parallel(text: str, trace: Trace, problem: Problem) -> float:
    """+1 for a valid parallel trace (`format.check_parallel`), right or wrong, else -1."""
    return 1.0 if check_parallel(trace).ok else -1.0


@register("answered")
def answered(text: str, trace: Trace, problem: Problem) -> float:
    """+1 when the strict reading finds a final answer (right or wrong), else -1.

    >>> [answered(t, parse_trace(t), Problem("p", "q", "4")) for t in ("Final Answer: 5", "so it is 4")]
    [1.0, -1.0]
    """
    return 1.0 if graded(text, problem).extracted is not None else -1.0


@register("npr_format")
def npr_format(text: str, trace: Trace, problem: Problem) -> float:
    """NPR stage 1 (NPR-Zero): format and correctness, a correct answer in NPR's format first.

    Two sources disagree. NPR's write-up rewards format-following RL for format and correctness.
    Its released NPR-Zero reward (`compute_score` in npr-zero's `math_dapo.py`) is accuracy only,
    +1 / -1 (-2 for an empty response): the format score is computed by a function it never calls,
    and the lines that would add it are commented out. nanopar follows the write-up. The format is
    NPR's own check (`format.check_structured`: one round or more, a round of one plan too, every
    rule kept), so a correct answer in one-plan rounds scores as a parallel one: NPR's check
    accepts it, and the model chooses its branch count. In the trace's schema, highest first:
      follows the format (`format.check_structured`), correct     +1
      well formed but not in the format (no tag, or a text rule
      broken), correct (`format.check_well_formed`)                 0
      either of those, wrong                                       -1
      structural problems (stray tags, bad blocks, truncated)      -1 for one, 0.25 less for
                                                                   each further one, floor -2
    A correct answer outside the format earns more than a wrong one (it is still an answer), less
    than one in the format (so the stage teaches the format).

    >>> right = Problem("p", "q", "4")
    >>> [npr_format(t, parse_trace(t), right) for t in ("<Parallel><Path>2+2</Path><Path>4</Path></Parallel>"
    ...  "<Summary>4</Summary>Final Answer: 4", "Final Answer: 4", "Final Answer: 5")]
    [1.0, 0.0, -1.0]
    >>> worse = "</Path></Path><Parallel><Path>x"  # two strays, an invalid block, truncated
    >>> npr_format(worse, parse_trace(worse), right)
    -1.75
    """
    correct = is_correct(text, problem)
    if check_structured(text, trace.schema):
        return 1.0 if correct else -1.0
    if check_well_formed(trace):  # no structural problem, but not in the format
        return 0.0 if correct else -1.0
    problems = len(trace.stray) + sum(not b.well_formed for b in trace.blocks) + int(trace.truncated)
    return -min(2.0, 1.0 + 0.25 * (max(problems, 1) - 1))


BUILT_IN = frozenset(REWARDS)  # the rewards above; a stage that names only these reads no --reward-file


def names_user_rewards(text: str) -> bool:
    """Whether a reward flag (a spec or a schedule) names a reward that is not built in, as one a
    --reward-file registers: read from the text alone, so a saved run's flag is judged without its file.

    >>> names_user_rewards("accuracy:1,format:0.2"), names_user_rewards("two-phase:100"), names_user_rewards("accuracy,mine:2")
    (False, False, True)
    """
    words = {word.strip() for part in text.split(",") for word in part.split(":")} - {""}
    return any(word not in BUILT_IN | SCHEDULE_WORDS and not _is_number(word) for word in words)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------- scoring


@dataclass
class RewardResult:
    total: float  # sum of weight * component
    components: dict[str, float]  # reward name -> its value, before weighting
    grade: Grade  # the answer's grade (shared by all components); grade.error counts failures
    layout_ok: bool  # the layout can lay the reading out (format.check_well_formed): PAPO's drop keeps only these


def score(spec: str | dict[str, float], text: str, trace: Trace, problem: Problem) -> RewardResult:
    """Every reward of the spec on one rollout; the answer is graded exactly once.

    >>> t = "<Parallel><Path>2+2=4</Path><Path>4</Path></Parallel><Summary>4</Summary>Final Answer: 4"
    >>> r = score("accuracy:1,format:0.5,parallel:1", t, parse_trace(t), Problem("p", "q", "4"))
    >>> r.total, r.components, r.grade.extracted
    (2.5, {'accuracy': 1.0, 'format': 1.0, 'parallel': 1.0}, '4')
    """
    weights = parse_reward_spec(spec)
    with grading_scope():
        components = {name: float(get_reward(name)(text, trace, problem)) for name in weights}
        answer_grade = graded(text, problem)  # from the cache when a reward asked for it
    total = sum(weights[name] * value for name, value in components.items())
    # PAPO drops what cannot be trained on as a parallel trace is: NPR's released code drops a
    # rollout whose mask and positions it cannot build, or that is overlong, and keeps a
    # well-formed sequential one (the accuracy reward then judges it)
    return RewardResult(total, components, answer_grade, check_well_formed(trace).ok)


# ----------------------------------------------------------------------------- TRL adapter


def as_trl_reward(fn_or_name: str | RewardFn, tokenizer=None, answer_key: str = "answer",
                  schema: TagSchema = PARALLEL_R1):
    """A reward with TRL GRPOTrainer's signature, `f(completions, **kwargs) -> list[float]`.

    `kwargs[answer_key]` holds the gold answers (one per completion); `question` or `problem`
    columns, when present, fill `Problem.question`. With `tokenizer`, the text and trace come
    from `completion_ids` decoded with the tags kept. Traces are read in `schema`'s tags.
    Grading errors are counted in `f.grade_errors` (a Counter of error messages).

    >>> f = as_trl_reward("accuracy")
    >>> f(completions=["Final Answer: 4", "Final Answer: 5"], answer=["4", "4"]), f.__name__
    ([1.0, -1.0], 'accuracy')
    """
    if isinstance(fn_or_name, str):
        name, fn = fn_or_name, get_reward(fn_or_name)
    else:
        name, fn = getattr(fn_or_name, "__name__", "reward"), fn_or_name
    tag_ids = TagIds.from_tokenizer(tokenizer, schema) if tokenizer is not None else None

    def reward(completions, **kwargs) -> list[float]:
        if answer_key not in kwargs:
            raise NanoparError(f"TRL reward {name!r}: no {answer_key!r} column; got {sorted(kwargs)}")
        ids = kwargs.get("completion_ids", kwargs.get("completions_ids"))  # the name changed across TRL versions
        if tokenizer is not None and ids is None:
            raise NanoparError(f"TRL reward {name!r}: a tokenizer was given but TRL passed no completion_ids")
        questions = kwargs.get("question", kwargs.get("problem", [""] * len(completions)))
        values = []
        for i, completion in enumerate(completions):
            if tokenizer is not None:
                text, trace = tokenizer.decode(ids[i], skip_special_tokens=False), parse_ids(ids[i], tag_ids)
            else:
                text = _completion_text(completion)
                trace = parse_trace(text, schema)
            problem = Problem(f"trl:{i}", str(questions[i]), str(kwargs[answer_key][i]), source="trl")
            with grading_scope() as grades:
                values.append(float(fn(text, trace, problem)))
            reward.grade_errors.update(g.error for g in grades.values() if g.error)
        return values

    reward.__name__ = name  # TRL logs each reward under its function's name
    reward.grade_errors = Counter()
    return reward


def _completion_text(completion) -> str:
    """A TRL completion as text: a string, or the contents of a list of chat messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message["content"] for message in completion)
