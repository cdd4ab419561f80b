"""Grading answers: find the model's final answer, find the gold answer, judge equivalence.

  extract_answer(text)   the strict reading (what rewards use): the last `\\boxed{...}` /
                         `\\fbox{...}` or `Final Answer: ...` line (`FINAL_ANSWER_LINE`), whichever
                         comes last; answers inside <Path>s count.
  extract_answer(text, flexible=True)
                         the flexible reading (evaluation reports it beside the strict one): the
                         strict answer when there is one, else the last GSM8K-style `#### N`, else
                         the last number outside the branches (<Path>, <plan>, <step>).
  read_answer(text, flexible=...)   the same, with how it was read: `Reading(answer, how)`.
  gold_answer(problem)   GSM8K's "... #### 1,200" gives "1200"; other answers are used as they are.
  grade(text, problem)   both parsed by `math-verify` and compared with its `verify`: a `Grade`
                         (`grade(..., flexible=True)` grades the flexible reading).

Exact checkers are the plug-in point for synthetic worlds: a problem whose extra["checker"] names
one in `CHECKERS` ("countdown": the toy world's, imported on first use) is graded by it instead;
`register_checker("maze", fn)` with `fn(response_text, problem) -> Grade` adds one. Every
failure is a `Grade` with `correct=False` and a short `error`, counted by callers, never hidden.
math-verify times out with SIGALRM (main thread only): off it, pass `timeout_s=None`.
Not here: LLM judges, multiple-choice letter matching beyond what math-verify does, unit
conversion ("2 m" = "200 cm" is wrong here), answers written only in words ("three").
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from . import NanoparError
from .data import Problem, plugin_named
from .tags import SCHEMAS


@dataclass(frozen=True)
class Grade:
    correct: bool  # the extracted answer is equivalent to the gold answer
    extracted: str | None  # the model's final answer as found in the text (None: none found)
    error: str | None = None  # why grading could not decide (counted by callers); None when it did
    # how the answer was read (`Reading.how`: "boxed", "final answer", "####", "last number"; a
    # checker's grade: None); not part of equality: two grades of the same answer are equal
    how: str | None = field(default=None, compare=False)


# ----------------------------------------------------------------------------- extraction

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# the one "Final Answer:" pattern (the toy world reads its answers with it too): group 1 is the rest of the
# line up to a tag, so "Final Answer: 18</Summary>" (an answer written inside a block) gives "18"
FINAL_ANSWER_LINE = re.compile(r"final answer\s*:\s*((?:(?!</?[A-Za-z][\w-]*>)[^\n])*)", re.IGNORECASE)
# GSM8K's convention, "#### 42": the rest of the line up to a tag (flexible reading only)
_HASHES_LINE = re.compile(r"####\s*((?:(?!</?[A-Za-z][\w-]*>)[^\n])*)")
# "18 dollars", "18 US dollars": a number and words only (one run of letters per word, so no backtracking blow-up)
_NUMBER_THEN_WORDS = re.compile(r"^(-?[\d,]*\.?\d+)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*$")
_LEADING_PHRASE = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*", re.IGNORECASE)
# a number as the last-number fallback reads it: not inside a word or after a decimal point ("H2O",
# "v1.5" hold none), a minus only where it cannot be a subtraction ("5-7" ends in 7), thousands
# separators ("1,200"), decimals ("0.25", not the period of "42."), a simple fraction ("3/4")
_NUMBER = re.compile(r"(?<![\w.])(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")
# the branches of either tag schema (Parallel-R1's <Path>, NPR's <plan> and <step>), to the close
# tag or, cut off, to the end of the text: the last number is never read inside one
_BRANCH = re.compile("|".join(
    f"{re.escape(open_)}.*?(?:{re.escape(close)}|$)"
    for schema in SCHEMAS.values()
    for open_, close in ((schema.path_open, schema.path_close), (schema.plan_open, schema.plan_close))
    if open_ is not None
), re.DOTALL)


class Reading(NamedTuple):
    answer: str | None  # the final answer as found in the text (None: none found)
    how: str | None  # "boxed", "final answer" (strict); "####", "last number" (flexible only); None


def read_answer(text: str, flexible: bool = False) -> Reading:
    """The model's final answer and how it was read.

    Strict (the default, what rewards use): the last `\\boxed{}` / `\\fbox{}` or `Final Answer:`
    line, whichever comes last (a box inside the Final Answer line wins over the line; inside a
    path or not). Flexible adds two fallbacks, tried only when the strict reading finds nothing, so
    the flexible answer is the strict one whenever there is one:
      1. the last GSM8K-style `#### N` line (anywhere, like a Final Answer line), cleaned alike;
      2. the last number of the text outside the branches (`<Path>`, `<plan>`, `<step>` up to
         their close tag, or to the end when cut off): a branch is one of several attempts side
         by side, and a response cut off inside one never concluded. Summaries and the main chain
         count. Thousands separators and a `$` go ("$1,200" -> "1200"); "42." is 42; "3/4" is read
         whole; a number inside a word ("H2O") is none. LaTeX (`\\frac{3}{4}`) is not assembled:
         the fallback is for numeric answers.
    Any string is read without raising; None is read as "".

    >>> read_answer(r"Path one: \\boxed{5}. Final Answer: 7 apples")
    Reading(answer='7', how='final answer')
    >>> read_answer("She has 3 + 4 = 7 left.\\n#### 7", flexible=True)
    Reading(answer='7', how='####')
    >>> read_answer("so the answer is 42 apples.", flexible=True), read_answer("so the answer is 42 apples.")
    (Reading(answer='42', how='last number'), Reading(answer=None, how=None))
    >>> read_answer("It costs $1,200 in total.", flexible=True).answer
    '1200'
    >>> read_answer("<Parallel><Path>maybe 5</Path><Path>maybe 6</Path></Parallel><Summary>both fail</Summary>", True)
    Reading(answer=None, how=None)
    """
    text = text if isinstance(text, str) else ""
    box_at, box = _last_box(text)
    line_at, line = -1, None
    for m in FINAL_ANSWER_LINE.finditer(text):
        cleaned = _clean_final_line(m.group(1))
        if cleaned:
            line_at, line = m.start(), cleaned
    if box is not None and box_at > line_at:  # also: a box inside the Final Answer line
        return Reading(box, "boxed")
    if line is not None or not flexible:
        return Reading(line, None if line is None else "final answer")
    hashes = [cleaned for m in _HASHES_LINE.finditer(text) if (cleaned := _clean_final_line(m.group(1)))]
    if hashes:
        return Reading(hashes[-1], "####")
    numbers = _NUMBER.findall(_BRANCH.sub(" ", text))
    if numbers:
        return Reading(numbers[-1].replace(",", ""), "last number")
    return Reading(None, None)


def extract_answer(text: str, flexible: bool = False) -> str | None:
    """The model's final answer, or None: `read_answer(text, flexible).answer`.

    >>> extract_answer(r"so $x=\\frac{1}{2}$, hence \\boxed{\\frac{1}{\\sqrt{2}}} and done")
    '\\\\frac{1}{\\\\sqrt{2}}'
    >>> extract_answer("Two paths agree.\\nFinal Answer: $18.")
    '18'
    >>> extract_answer(r"Path one: \\boxed{5}. Final Answer: 7 apples") , extract_answer("no answer")
    ('7', None)
    >>> extract_answer("<Summary>Final Answer: 18</Summary>")
    '18'
    >>> extract_answer("#### 42"), extract_answer("#### 42", flexible=True), extract_answer("x = -7.5", flexible=True)
    (None, '42', '-7.5')
    """
    return read_answer(text, flexible).answer


def _last_box(text: str) -> tuple[int, str | None]:
    """(start, content) of the last complete, non-empty \\boxed{...} or \\fbox{...}; (-1, None) if none.

    Braces are balanced (escaped `\\{` `\\}` do not count); a box cut off by the end of the text
    is not an answer. One pass over the text from the first box (a degenerate "\\boxed{\\boxed{..."
    repeated thousands of times is read in linear time).

    >>> _last_box(r"\\boxed{\\{1, 2\\}} then \\fbox{\\frac{a}{b}} then \\boxed{3")
    (22, '\\\\frac{a}{b}')
    """
    boxes = {m.end(): m.start() for m in _BOX_OPEN.finditer(text)}  # content start -> box start
    found: tuple[int, str | None] = (-1, None)
    if not boxes:
        return found
    opened, i = [], min(boxes) - 1  # the content start of each open brace; from the first box's "{"
    while i < len(text):
        if text[i] == "\\":
            i += 2  # skip the escaped character (\\{, \\}, \\\\)
            continue
        if text[i] == "{":
            opened.append(i + 1)
        elif text[i] == "}" and opened:
            start = opened.pop()
            content = text[start:i].strip()
            if start in boxes and content and boxes[start] > found[0]:
                found = (boxes[start], content)
        i += 1
    return found


def _clean_final_line(line: str) -> str:
    """The answer written on a `Final Answer:` line, without the decoration around it.

    >>> [_clean_final_line(s) for s in ["**$\\\\frac{3}{4}$**.", "The answer is 1,200 dollars", "$5"]]
    ['\\\\frac{3}{4}', '1,200', '5']
    """
    s = line.strip().lstrip("* ").rstrip("*. ")  # markdown bold, a closing period
    s = _LEADING_PHRASE.sub("", s)
    dollars = [i for i, c in enumerate(s) if c == "$" and (i == 0 or s[i - 1] != "\\")]
    if len(dollars) >= 2:  # inline math: keep what the last $...$ pair holds
        s = s[dollars[-2] + 1 : dollars[-1]]
    elif dollars:  # a lone $ is a currency sign
        s = s[: dollars[0]] + s[dollars[0] + 1 :]
    s = s.strip().rstrip(". ")
    m = _NUMBER_THEN_WORDS.match(s)
    return m.group(1) if m else s


def gold_answer(problem: Problem) -> str:
    """The gold answer as a string.

    >>> gold_answer(Problem("gsm8k:1", "q", "She pays 3 * 400 = <<3*400=1200>>1200.\\n#### 1,200"))
    '1200'
    >>> gold_answer(Problem("math:1", "q", "$\\\\frac{14}{3}$")), gold_answer(Problem("aime:1", "q", "025"))
    ('\\\\frac{14}{3}', '025')
    """
    text = problem.answer.strip()
    if "####" in text:  # GSM8K: a worked solution ending in "#### N"
        return text.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "")
    if text.startswith("$"):
        text = text[1:]
    if text.endswith("$") and not text.endswith("\\$"):
        text = text[:-1]
    return text.strip()


# ----------------------------------------------------------------------------- judging

_PARSE_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


def grade(response_text: str, problem: Problem, timeout_s: int | None = 5, flexible: bool = False) -> Grade:
    """Judge the response's final answer against the problem's gold answer.

    math-verify compares numbers, fractions, intervals, sets, tuples, equations, units,
    percentages and \\text{...} answers; an answer that is not math is compared as text.
    `flexible` grades the flexible reading (`read_answer`: strict, else `#### N`, else the last
    number outside the branches); the default, strict, is what every reward uses.

    A problem that names a checker (`problem.extra["checker"]`, e.g. "countdown": the toy world)
    is judged by that checker of `CHECKERS`, which reads the answer its own way: `flexible` changes
    nothing there (`has_flexible_reading` says so; evaluation shows such a reading as "-").
    Everything else is judged by math-verify.

    `timeout_s` bounds each math-verify parse and comparison (seconds, SIGALRM, main thread
    only); None turns it off.

    >>> p = Problem("math:7", "q", "\\\\frac{1}{2}")
    >>> grade("Final Answer: 0.5", p)
    Grade(correct=True, extracted='0.5', error=None, how='final answer')
    >>> grade(r"\\boxed{2}", p).correct, grade("I give up.", p).error
    (False, 'no answer found')
    >>> grade("half of it: 1/2", p), grade("half of it: 1/2", p, flexible=True).correct
    (Grade(correct=False, extracted=None, error='no answer found', how=None), True)
    """
    if timeout_s is not None and threading.current_thread() is not threading.main_thread():
        raise NanoparError(
            "grade() with a timeout must run on the main thread (math-verify uses SIGALRM); "
            "call it there, or pass timeout_s=None and bound the time yourself"
        )
    if not has_flexible_reading(problem):  # an exact checker (the toy world's countdown)
        return checker_named(problem.extra["checker"], problem.id)(response_text, problem)
    timeout = None if timeout_s is None else max(1, math.ceil(timeout_s))  # alarm() takes whole seconds
    extracted, how = read_answer(response_text, flexible)
    if extracted is None:
        return Grade(False, None, "no answer found")
    gold, gold_error = _parse(gold_answer(problem), timeout)
    if gold_error:
        return Grade(False, extracted, f"gold answer {problem.answer[-40:]!r}: {gold_error}", how)
    pred, pred_error = _parse(extracted, timeout)
    if pred_error:
        return Grade(False, extracted, f"answer: {pred_error}", how)
    correct, error = _equivalent(gold, pred, timeout)
    if correct:
        return Grade(True, extracted, None, how)
    if error is None and not _has_math(gold):
        error = f"gold answer {problem.answer[-40:]!r} is not math (compared as text)"
    elif error is None and not _has_math(pred):
        error = "answer is not math (compared as text)"
    return Grade(False, extracted, error, how)


def has_flexible_reading(problem: Problem) -> bool:
    """Whether `grade(..., flexible=True)` can read this problem's answers another way: not for a
    problem graded by an exact checker (it reads its own format, one way)."""
    return problem.extra.get("checker") is None


# ----------------------------------------------------------------------------- exact checkers

Checker = Callable[[str, Problem], Grade]  # (response text, problem) -> Grade
# checker name (a problem's extra["checker"]) -> Checker, or "module:attribute" of one, imported on first use
CHECKERS: dict[str, Checker | str] = {"countdown": "nanopar.toy:grade_countdown"}


def register_checker(name: str, checker: Checker | str) -> None:
    """Grade every problem whose extra["checker"] is `name` with `checker` (replacing an earlier one)."""
    if not isinstance(name, str) or not (callable(checker) or isinstance(checker, str)):
        raise NanoparError(f"register_checker takes a name and a function, not {name!r}, {checker!r}")
    CHECKERS[name] = checker


def checker_named(name: str, problem_id: str = "") -> Checker:
    """The checker registered as `name`; an unknown name is an error, never a fallback to math-verify."""
    if name not in CHECKERS:
        where = f" (problem {problem_id})" if problem_id else ""
        raise NanoparError(f"unknown checker {name!r}{where}: use one of {', '.join(CHECKERS)}")
    if isinstance(CHECKERS[name], str):
        found = plugin_named(CHECKERS[name])
        if not callable(found):
            raise NanoparError(f"the checker {CHECKERS[name]!r} is a {type(found).__name__}, not a function")
        CHECKERS[name] = found
    return CHECKERS[name]


def _parse(answer: str, timeout: int | None) -> tuple[list, str | None]:
    """math-verify's parse of one answer string (as if boxed): (parsed candidates, error or None).

    The candidates are a SymPy object and the answer string (for text comparison).
    """
    try:
        parsed = parse(
            "\\boxed{" + answer + "}", _PARSE_CONFIG, parsing_timeout=timeout, raise_on_error=True
        )
    except TimeoutException:  # a BaseException in math-verify, not an Exception
        return [], f"parse timed out after {timeout}s"
    except Exception as e:  # any parser failure becomes a counted error, with its name
        return [], f"parse failed ({type(e).__name__}: {str(e)[:80]})"
    return parsed, None if parsed else f"nothing parsable in {answer[:40]!r}"


def _equivalent(gold: list, pred: list, timeout: int | None) -> tuple[bool, str | None]:
    """Whether any gold candidate verifies against any predicted one; the first error, if any.

    Each pair is verified on its own, so one comparison that fails does not hide another.
    """
    first_error = None
    for g in gold:
        for p in pred:
            try:
                if verify(g, p, timeout_seconds=timeout, raise_on_error=True):
                    return True, None
            except TimeoutException:
                first_error = first_error or f"comparison timed out after {timeout}s"
            except Exception as e:  # recorded and reported by the caller, never silent
                first_error = first_error or f"comparison failed ({type(e).__name__}: {str(e)[:80]})"
    return False, first_error


def _has_math(parsed: list) -> bool:
    """Whether math-verify read something as math (not only the raw string)."""
    return any(not isinstance(x, str) for x in parsed)
