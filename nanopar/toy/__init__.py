"""The toy world: a Countdown-style task, its exact checker, a programmatic teacher, a tokenizer
and a ~0.8M-parameter Qwen3, so the whole curriculum runs on a laptop CPU in minutes.

    task.py     reach a target from a few numbers with + - *: levels, routes, seeded problems, the
                held-out split, `eval_expression` and the exact checker (`grade_countdown`)
    teacher.py  sequential and parallel traces (exploration or verification), in either schema's tags
    committed.py  a second teacher: a chain that commits to an approach, blocks of different approaches
    source.py   the tokenizer, the model, problems and trace mixes by name: `SOURCE`

The general modules reach the toy only through two registry entries, data.SOURCES["toy"] (SOURCE)
and grading.CHECKERS["countdown"] (grade_countdown), and never import this package.
Not here: the general sampler, trainer and rewards the toy exercises (they work on any model).
"""

from .source import (
    MODEL_NAME,
    SOURCE,
    TEACHER_MIXES,
    WORDS,
    teacher_traces,
    toy_model,
    toy_model_config,
    toy_problems,
    toy_tokenizer,
)
from .task import (
    FINAL,
    LEVELS,
    Level,
    Route,
    check_countdown,
    eval_expression,
    extract_toy_answer,
    grade_countdown,
    heldout,
    is_heldout,
    make_problems,
    random_route,
    routes,
)
from .teacher import (
    CHECKS,
    PARALLEL_PATHS,
    SLIPS,
    TRACE_KINDS,
    VERIFICATION_SHARE,
    attempt_count,
    attempt_text,
    first_move,
    npr_trace,
    parallel_trace,
    sequential_trace,
)

__all__ = [
    "CHECKS", "FINAL", "LEVELS", "MODEL_NAME", "PARALLEL_PATHS", "SLIPS", "SOURCE", "TEACHER_MIXES",
    "TRACE_KINDS", "VERIFICATION_SHARE", "WORDS", "Level", "Route", "attempt_count", "attempt_text",
    "check_countdown", "eval_expression", "extract_toy_answer", "first_move", "grade_countdown", "heldout",
    "is_heldout", "make_problems", "npr_trace", "parallel_trace", "random_route", "routes", "sequential_trace",
    "teacher_traces", "toy_model", "toy_model_config", "toy_problems", "toy_tokenizer",
]
