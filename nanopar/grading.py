"""Grading answers: find the model's final answer, find the gold answer, judge equivalence.

  extract_answer(text)   the last `\\boxed{...}` / `\\fbox{...}` or `Final Answer: ...` line
                         (`FINAL_ANSWER_LINE`), whichever comes last; answers inside <Path>s count.
  gold_answer(problem)   GSM8K's "... #### 1,200" gives "1200"; other answers are used as they are.
  grade(text, problem)   both parsed by `math-verify` and compared with its `verify`: a `Grade`.

Exact checkers are the plug-in point for synthetic worlds: a problem whose extra["checker"] names
one in `CHECKERS` ("countdown" -> "nanopar.toy:grade_countdown", imported on first use) is graded
by it instead: `register_checker("maze", fn)` with `fn(response_text, problem) -> Grade`.
Every failure is a `Grade` with `correct=False` and a short `error`, counted by callers, never
hidden. math-verify times out with SIGALRM (main thread only): off it, pass `timeout_s=None`.

Left out: LLM judges, multiple-choice letter matching beyond what math-verify does, unit
conversion ("2 m" = "200 cm" is wrong here), answers written only in words ("three").
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Callable

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from . import NanoparError
from .data import Problem, resolve


@dataclass(frozen=True)
class Grade:
    correct: bool  # the extracted answer is equivalent to the gold answer
    extracted: str | None  # the model's final answer as found in the text (None: none found)
    error: str | None = None  # why grading could not decide (counted by callers); None when it did


# ----------------------------------------------------------------------------- extraction

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# the one "Final Answer:" pattern (toy.py reads its answers with it too): group 1 is the rest of the
# line up to a tag, so "Final Answer: 18</Summary>" (an answer written inside a block) gives "18"
FINAL_ANSWER_LINE = re.compile(r"final answer\s*:\s*((?:(?!</?[A-Za-z][\w-]*>)[^\n])*)", re.IGNORECASE)
_NUMBER_THEN_WORDS = re.compile(r"^(-?[\d,]*\.?\d+)\s+(?:[A-Za-z]{2,}\s*)+$")  # "18 dollars"
_LEADING_PHRASE = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The model's final answer, or None: the last box or Final Answer line in the text (a box
    inside the Final Answer line wins over the line; the last answer wins, inside a path or not).

    >>> extract_answer(r"so $x=\\frac{1}{2}$, hence \\boxed{\\frac{1}{\\sqrt{2}}} and done")
    '\\\\frac{1}{\\\\sqrt{2}}'
    >>> extract_answer("Two paths agree.\\nFinal Answer: $18.")
    '18'
    >>> extract_answer(r"Path one: \\boxed{5}. Final Answer: 7 apples") , extract_answer("no answer")
    ('7', None)
    >>> extract_answer("<Summary>Final Answer: 18</Summary>")
    '18'
    """
    box_at, box = _last_box(text)
    line_at, line = -1, None
    for m in FINAL_ANSWER_LINE.finditer(text):
        cleaned = _clean_final_line(m.group(1))
        if cleaned:
            line_at, line = m.start(), cleaned
    if box is not None and box_at > line_at:  # also: a box inside the Final Answer line
        return box
    return line


def _last_box(text: str) -> tuple[int, str | None]:
    """(start, content) of the last complete, non-empty \\boxed{...} or \\fbox{...}; (-1, None) if none.

    Braces are balanced (escaped `\\{` `\\}` do not count); a box cut off by the end of the text
    is not an answer.

    >>> _last_box(r"\\boxed{\\{1, 2\\}} then \\fbox{\\frac{a}{b}} then \\boxed{3")
    (22, '\\\\frac{a}{b}')
    """
    found = (-1, None)
    for m in _BOX_OPEN.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2  # skip the escaped character (\{, \}, \\)
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        content = text[m.end() : i - 1].strip()
        if depth == 0 and content:
            found = (m.start(), content)
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


def grade(response_text: str, problem: Problem, timeout_s: int | None = 5) -> Grade:
    """Judge the response's final answer against the problem's gold answer.

    math-verify compares numbers, fractions, intervals, sets, tuples, equations, units,
    percentages and \\text{...} answers; an answer that is not math is compared as text.

    A problem that names a checker (`problem.extra["checker"]`, e.g. "countdown": the toy world)
    is judged by that checker of `CHECKERS`; everything else by math-verify.

    `timeout_s` bounds each math-verify parse and comparison (seconds, SIGALRM, main thread
    only); None turns it off.

    >>> p = Problem("math:7", "q", "\\\\frac{1}{2}")
    >>> grade("Final Answer: 0.5", p)
    Grade(correct=True, extracted='0.5', error=None)
    >>> grade(r"\\boxed{2}", p).correct, grade("I give up.", p).error
    (False, 'no answer found')
    """
    if timeout_s is not None and threading.current_thread() is not threading.main_thread():
        raise NanoparError(
            "grade() with a timeout must run on the main thread (math-verify uses SIGALRM); "
            "call it there, or pass timeout_s=None and bound the time yourself"
        )
    if problem.extra.get("checker") is not None:  # an exact checker (the toy world's countdown)
        return checker_named(problem.extra["checker"], problem.id)(response_text, problem)
    timeout = None if timeout_s is None else max(1, math.ceil(timeout_s))  # alarm() takes whole seconds
    extracted = extract_answer(response_text)
    if extracted is None:
        return Grade(False, None, "no answer found")
    gold, gold_error = _parse(gold_answer(problem), timeout)
    if gold_error:
        return Grade(False, extracted, f"gold answer {problem.answer[-40:]!r}: {gold_error}")
    pred, pred_error = _parse(extracted, timeout)
    if pred_error:
        return Grade(False, extracted, f"answer: {pred_error}")
    correct, error = _equivalent(gold, pred, timeout)
    if correct:
        return Grade(True, extracted)
    if error is None and not _has_math(gold):
        error = f"gold answer {problem.answer[-40:]!r} is not math (compared as text)"
    elif error is None and not _has_math(pred):
        error = "answer is not math (compared as text)"
    return Grade(False, extracted, error)


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
        found = resolve(CHECKERS[name])
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
