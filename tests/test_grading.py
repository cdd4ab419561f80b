"""Answer grading (grading.py): extracting the answer (strict, and the flexible reading evaluation
reports beside it), reading the gold answer, and grading one against the other, with failures
counted rather than hidden.

The gold answers below are copied from the shipped data sets (GSM8K test, MATH-500, AIME 2024);
the tests never read the data files.
"""

import random
import threading
import time

import pytest

from nanopar import NanoparError, grading
from nanopar.data import Problem, load_problems
from nanopar.grading import Grade, Reading, extract_answer, gold_answer, grade, has_flexible_reading, read_answer

# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the area is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),  # nested braces
        (r"sets: \boxed{\{1, 2\}} or \boxed{ {a}^{2} }", r"{a}^{2}"),  # the last box; escaped braces
        (r"\fbox{42}", "42"),
        (r"first \boxed{3}, then \boxed{5}", "5"),
        (r"finally \boxed{7} and a cut-off \boxed{\frac{1}{", "7"),  # an unclosed box is no answer
        ("Adding up: 12.\nFinal Answer: 12", "12"),
        ("Final Answer: $1,200.", "1,200"),  # currency sign and period dropped
        ("FINAL ANSWER: **$\\frac{3}{4}$**", r"\frac{3}{4}"),  # inline math, markdown bold
        ("Final Answer: The answer is 18 dollars", "18"),
        ("Final Answer: x = 3", "x = 3"),
        ("Final Answer:\n-7", "-7"),
        ("Final Answer: 5\nwait.\nFinal Answer: 6", "6"),  # the last line
        (r"<Path>\boxed{4}</Path> ... Final Answer: 5", "5"),  # the last answer in the text wins
        (r"Final Answer: 5 ... on second thought \boxed{6}", "6"),
        (r"Final Answer: \boxed{9}", "9"),  # a box inside the line
        ("The answer is 12.", None),
        (r"\boxed{}", None),
        ("Final Answer:", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# (response, flexible answer, how it was read); the strict reading finds an answer only where
# `how` is "boxed" or "final answer", and then it is the same one
FLEXIBLE_TABLE = [
    ("#### 42", "42", "####"),  # GSM8K's own convention
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72", "72", "####"),
    ("#### $1,200.", "1,200", "####"),  # cleaned like a Final Answer line
    ("so the answer is 42 apples.", "42", "last number"),
    ("$1,200", "1200", "last number"),  # currency sign and thousands separator go
    ("It costs $1,200 in total, i.e. 1200 dollars a year for 3 years", "3", "last number"),  # the last one
    ("x = -7.5", "-7.5", "last number"),
    ("5-7", "7", "last number"),  # a minus after a number is a subtraction
    ("3/4 of the cake", "3/4", "last number"),
    ("The answer is 42.", "42", "last number"),  # the full stop is not a decimal point
    ("50% of them", "50", "last number"),
    ("H2O and CO2", None, None),  # numbers inside words are none
    ("12,5 and 1,2345", "2345", "last number"),  # no thousands separator there: separate numbers
    # the strict reading first, when it finds anything: the flexible answer is the strict one
    ("Final Answer: 5\nthen 7 more", "5", "final answer"),
    (r"\boxed{3} and 4 more", "3", "boxed"),
    ("#### 8\nFinal Answer: 9", "9", "final answer"),
    # the branches (paths, plans, steps) hold attempts side by side: their numbers do not count
    ("<Parallel><Path>9*2=18</Path><Path>16+1=17</Path></Parallel><Summary>they disagree</Summary>", None, None),
    ("<Parallel><Path>9*2=18</Path><Path>9+9=18</Path></Parallel><Summary>both give 18</Summary> done", "18",
     "last number"),
    ("So 5 eggs. <Parallel><Path>maybe 6", "5", "last number"),  # cut off inside a path: before it
    ("<guideline><plan>1: add 2</plan><plan>2: double</plan></guideline><step>1: 2+2=4</step>"
     "<step>2: 2*2=4</step><takeaway>so 4 it is</takeaway>", "4", "last number"),
    ("<guideline><plan>1: add</plan></guideline><step>1: 2+2=", None, None),  # NPR's labels are no answer
    ("I do not know.", None, None),
    ("", None, None),
]


@pytest.mark.parametrize("text, answer, how", FLEXIBLE_TABLE)
def test_flexible_reading(text, answer, how):
    assert read_answer(text, flexible=True) == Reading(answer, how)
    assert extract_answer(text, flexible=True) == answer
    strict = read_answer(text)
    assert strict == (Reading(answer, how) if how in ("boxed", "final answer") else Reading(None, None))
    assert extract_answer(text) == strict.answer  # the default reading is the strict one


def test_the_readings_never_raise_and_stay_fast_on_any_text():
    """Seeded random strings over the characters the readings look at, and degenerate outputs a
    model writes when it loops; each must be read (strictly and flexibly) in well under a second."""
    rng = random.Random(0)
    alphabet = list("0123456789,.-$#/ \n{}%") + ["\\boxed{", "Final Answer:", "####", "<Path>", "</Path>",
                                                 "<step>", "</step>", "<Summary>", "apples ", "\\"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(500)]
    texts += [
        "Final Answer: 18 " + "a" * 40 + "!",  # a backtracking "18 dollars" rule takes exponential time here
        "\\boxed{" * 3000,  # scanning to the end from every unclosed box takes quadratic time here
        "\\boxed{" * 3000 + "5" + "}" * 3000,
        "1" * 100_000, "-" * 10_000 + "1", "<Path>" * 5000, "#### " * 5000, "\x00\ud800",
    ]
    for text in texts:
        started = time.perf_counter()
        for flexible in (False, True):
            found = read_answer(text, flexible)
            assert found.answer is None or isinstance(found.answer, str)
        assert time.perf_counter() - started < 1.0, text[:40]
    assert read_answer("\\boxed{" * 3000 + "5" + "}" * 3000) == Reading("5", "boxed")
    assert read_answer(None, flexible=True) == Reading(None, None)


def test_gold_answer_formats():
    gsm8k = "Amount raised by all students was 175,000-50,000 = <<175000-50000=125000>>125,000 dollars.\n" \
            "Amount raised by each student was 125,000/20 = <<125000/20=6250>>6,250 dollars.\n#### 6,250"
    assert gold_answer(Problem("g", "q", gsm8k)) == "6250"
    assert gold_answer(Problem("g", "q", "It was -3 degrees Celsius in the morning.\n#### -3")) == "-3"
    assert gold_answer(Problem("m", "q", r"\$32,\!348")) == r"\$32,\!348"  # an escaped $ stays
    assert gold_answer(Problem("m", "q", r"$\frac{14}{3}$")) == r"\frac{14}{3}"
    assert gold_answer(Problem("a", "q", "025")) == "025"


# ----------------------------------------------------------------------------- grading table

GSM_6250 = "Amount raised by each student was 125,000/20 = <<125000/20=6250>>6,250 dollars.\n#### 6,250"
GSM_MINUS_3 = "Increase 3 degrees = -6 + 3 = -3 degrees\nIt was -3 degrees Celsius in the morning.\n#### -3"
GSM_40000 = "So he has 100,000-60,000=$<<100000-60000=40000>>40,000 leftover\n#### 40,000"

GRADING_TABLE = [
    # GSM8K: "#### N" golds, thousands separators, currency, units
    (GSM_6250, "Final Answer: 6250", True),
    (GSM_6250, "Final Answer: $6,250", True),
    (GSM_6250, r"\boxed{6,250}", True),
    (GSM_6250, "Final Answer: 625", False),
    (GSM_MINUS_3, r"\boxed{-3}", True),
    (GSM_MINUS_3, r"\boxed{3}", False),
    (GSM_40000, "Final Answer: 40,000 dollars", True),
    (GSM_40000, r"\boxed{\$40,000}", True),
    (GSM_40000, "Final Answer: 4000", False),
    # MATH-500 (gold strings exactly as shipped)
    (r"\frac{14}{3}", r"\boxed{\dfrac{14}{3}}", True),
    (r"\frac{14}{3}", r"\boxed{14/3}", True),
    (r"\frac{14}{3}", r"\boxed{4.67}", False),
    (r"\frac{14}{3}", r"\boxed{\frac{3}{14}}", False),
    (r"\frac 34", r"\boxed{0.75}", True),
    (r"\frac 34", "Final Answer: 3/4", True),
    (r"\frac 34", "Final Answer: 4/3", False),
    (r"\dfrac{17}{50}", r"\boxed{0.34}", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"\boxed{(3, \frac{\pi}{2})}", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"\boxed{(3, \pi/2)}", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"\boxed{(\frac{\pi}{2}, 3)}", False),
    ("p - q", r"\boxed{-q + p}", True),
    ("p - q", r"\boxed{q - p}", False),
    ("(3,4]", r"\boxed{(3, 4]}", True),
    ("(3,4]", r"\boxed{[3, 4]}", False),
    ("(3,4]", r"\boxed{(3, 4)}", False),
    (r"\left(\frac{3}{5},\frac{8}{3}\right]", r"\boxed{(0.6, 8/3]}", True),
    (r"(-\infty, 2) \cup (3, \infty)", r"\boxed{(-\infty,2)\cup(3,\infty)}", True),
    (r"x \in [-2,7]", r"\boxed{[-2, 7]}", True),
    (r"\text{Evelyn}", "Final Answer: Evelyn", True),
    (r"\text{Evelyn}", r"\boxed{\text{Navin}}", False),
    (r"90^\circ", r"\boxed{90}", True),
    (r"90^\circ", r"\boxed{90^{\circ}}", True),
    (r"90^\circ", r"\boxed{45^\circ}", False),
    ("x=5", r"\boxed{5}", True),
    ("x=5", "Final Answer: x = 5", True),
    ("x=5", r"\boxed{6}", False),
    (r"\text{(C)}", r"\boxed{C}", True),
    (r"\text{(C)}", r"\boxed{\text{(C)}}", True),
    (r"\text{(C)}", r"\boxed{\text{(B)}}", False),
    (r"10,\!080", r"\boxed{10080}", True),
    (r"\$32,\!348", "Final Answer: $32,348", True),
    (r"5.4 \text{ cents}", r"\boxed{5.4}", True),
    ("-2 + 7i", r"\boxed{7i - 2}", True),
    ("-2 + 7i", r"\boxed{-2 - 7i}", False),
    ("3, 5, 7", r"\boxed{7, 5, 3}", True),
    ("3, 5, 7", r"\boxed{3, 5}", False),
    (r"1 \pm \sqrt{19}", r"\boxed{1+\sqrt{19}, 1-\sqrt{19}}", True),
    (r"\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}", r"\boxed{\begin{pmatrix}-1&0\\0&-1\end{pmatrix}}", True),
    # AIME 2024 integers (zero-padded golds)
    ("025", r"\boxed{25}", True),
    ("204", "Final Answer: 204", True),
    ("204", r"\boxed{240}", False),
    # equivalences the brief asks for, on literal golds
    ("1000", r"\boxed{1,000}", True),
    ("1000", r"\boxed{100}", False),
    ("18", r"Final Answer: \$18", True),
    ("0.5", r"\boxed{\frac12}", True),
    ("3", r"\boxed{x=3}", True),
    ("10", r"\boxed{10\%}", True),  # math-verify: a percent sign may be dropped ...
    (r"10\%", r"\boxed{0.1}", True),  # ... or read as /100
    ("10", r"\boxed{0.1}", False),
    ("-4", "Final Answer: -4", True),
    ("-4", "Final Answer: 4", False),
]


@pytest.mark.parametrize("gold, response, correct", GRADING_TABLE)
def test_grading_table(gold, response, correct):
    result = grade(response, Problem("t", "q", gold))
    assert result.correct is correct, result
    if correct:
        assert result.error is None


def test_grade_reports_failures_instead_of_hiding_them(monkeypatch):
    missing = grade("I am not sure.", Problem("a", "q", "113"))
    assert missing == Grade(False, None, "no answer found")
    assert grade(r"\boxed{???}", Problem("t", "q", "3")) == Grade(False, "???", "answer is not math (compared as text)")
    assert grade(r"\boxed{3}", Problem("t", "q", "!!")).error == "gold answer '!!' is not math (compared as text)"
    assert grade(r"\boxed{!!}", Problem("t", "q", "!!")) == Grade(True, "!!", None)  # equal as text
    assert grade(r"\boxed{\text{}}", Problem("t", "q", "3")).error == r"answer: nothing parsable in '\\text{}'"

    def timing_out(*args, **kwargs):
        raise grading.TimeoutException("Operation timed out!")

    monkeypatch.setattr(grading, "verify", timing_out)
    slow = grade(r"\boxed{2}", Problem("t", "q", "2"))
    assert slow == Grade(False, "2", "comparison timed out after 5s")
    monkeypatch.setattr(grading, "parse", timing_out)
    assert grade(r"\boxed{2}", Problem("t", "q", "2"), timeout_s=3).error.endswith("parse timed out after 3s")


GSM_72 = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"
GSM_1200 = "She pays 3 * 400 = <<3*400=1200>>1200.\n#### 1,200"

# (gold, response, strict: correct and error, flexible: correct and how it read)
STRICT_AND_FLEXIBLE = [
    (GSM_72, "Altogether 48+24 = 72 clips.\n#### 72", (False, "no answer found"), (True, "####")),
    (GSM_72, "so the answer is 72 clips.", (False, "no answer found"), (True, "last number")),
    (GSM_72, "so she sold 71 clips.", (False, "no answer found"), (False, "last number")),  # wrong maths
    (GSM_72, r"48+24 = 72, so \boxed{72}", (True, None), (True, "boxed")),
    (GSM_72, "Final Answer: 70\nor maybe 72", (False, None), (False, "final answer")),  # strict answer stands
    (GSM_1200, "She pays $1,200.", (False, "no answer found"), (True, "last number")),
    (GSM_1200, "I cannot tell.", (False, "no answer found"), (False, None)),
]


@pytest.mark.parametrize("gold, response, strict, flexible", STRICT_AND_FLEXIBLE)
def test_grade_strict_and_flexible(gold, response, strict, flexible):
    problem = Problem("gsm8k:t", "q", gold)
    first, second = grade(response, problem), grade(response, problem, flexible=True)
    assert (first.correct, first.error) == strict
    assert (second.correct, second.how) == flexible
    if second.how is None:
        assert second == Grade(False, None, "no answer found")
    assert first.how == (second.how if second.how in ("boxed", "final answer") else None)


def test_a_checker_reads_its_own_format_flexible_or_not():
    toy = load_problems("toy:easy:heldout", limit=1)[0]  # numbers 1 7 1 target 8
    assert not has_flexible_reading(toy) and has_flexible_reading(Problem("g", "q", GSM_72))
    for text in ("7+1=8vs8yes\nFinal Answer: (7+1)*1", "so (7+1)*1", "#### (7+1)*1"):
        assert grade(text, toy, flexible=True) == grade(text, toy)
    assert grade("#### (7+1)*1", toy) == Grade(False, None, "no answer found")


def test_grade_refuses_a_timeout_off_the_main_thread():
    results = {}

    def worker():
        try:
            grade(r"\boxed{2}", Problem("t", "q", "2"))
        except NanoparError as e:
            results["error"] = str(e)
        results["no_timeout"] = grade(r"\boxed{2}", Problem("t", "q", "2"), timeout_s=None)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "main thread" in results["error"]
    assert results["no_timeout"] == Grade(True, "2", None)
