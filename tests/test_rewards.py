"""Answer grading (grading.py), the rewards, their registry, schedules and the TRL adapter (rewards.py).

The gold answers below are copied from the shipped data sets (GSM8K test, MATH-500, AIME 2024);
the tests never read the data files.
"""

import threading

import pytest

from nanopar import NanoparError, grading, rewards
from nanopar.data import Problem
from nanopar.grading import Grade, extract_answer, gold_answer, grade
from nanopar.rewards import (
    Alternating,
    Constant,
    TwoPhase,
    as_trl_reward,
    get_reward,
    parse_reward_spec,
    register,
    schedule_from_string,
    score,
)
from nanopar.tags import TagIds, find_tags
from nanopar.trace import parse_ids, parse_trace

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


# ----------------------------------------------------------------------------- rewards on traces

BLOCK = "<Parallel><Path>3*4 = 12</Path><Path>4+4+4 = 12</Path></Parallel><Summary>Both give 12.</Summary>"
TRACES = {
    "valid": "Two ways to count.\n" + BLOCK + "\nFinal Answer: 12",
    "invalid": "<Parallel><Path>3*4 = 12</Path></Parallel><Summary>12</Summary>\nFinal Answer: 12",  # one path
    "none": "3*4 = 12.\nFinal Answer: 12",
}
RIGHT, WRONG = Problem("r", "q", "#### 12"), Problem("w", "q", "#### 13")

# reward -> {(trace kind, correct?): value}
EXPECTED = {
    "accuracy": {("valid", 1): 1, ("invalid", 1): 1, ("none", 1): 1, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1},
    "format": {("valid", 1): 1, ("invalid", 1): -1, ("none", 1): 1, ("valid", 0): 1, ("invalid", 0): -1, ("none", 0): 1},
    "parallel": {("valid", 1): 1, ("invalid", 1): -1, ("none", 1): -1, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1},
    "accuracy_parallel_bonus": {
        ("valid", 1): 1.2, ("invalid", 1): 1, ("none", 1): 1, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1,
    },
    "accuracy_times_parallel": {
        ("valid", 1): 1, ("invalid", 1): 0, ("none", 1): 0, ("valid", 0): -1, ("invalid", 0): 0, ("none", 0): 0,
    },
    "npr_format": {("valid", 1): 1, ("invalid", 1): -1, ("none", 1): 1, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_rewards_on_small_traces(name):
    fn = get_reward(name)
    got = {
        (kind, correct): fn(text, parse_trace(text), RIGHT if correct else WRONG)
        for kind, text in TRACES.items()
        for correct in (1, 0)
    }
    assert got == pytest.approx(EXPECTED[name])


def test_npr_format_penalty_grows_with_the_problems():
    def penalty(text):
        return get_reward("npr_format")(text, parse_trace(text), RIGHT)

    assert penalty(TRACES["invalid"]) == -1.0  # one invalid block
    assert penalty(TRACES["valid"] + "</Path>") == -1.0  # one stray tag
    assert penalty(TRACES["valid"] + "</Path></Summary>") == -1.25
    assert penalty("</Path>" * 9 + "Final Answer: 12") == -2.0  # floored


def test_score_weights_components_and_grades_once(monkeypatch):
    calls = []

    def counting_grade(text, problem, timeout_s=5):
        calls.append(text)
        return grade(text, problem, timeout_s)

    monkeypatch.setattr(rewards, "grade", counting_grade)
    text = TRACES["valid"]
    spec = "accuracy:1,format:0.2,parallel:0.5,accuracy_parallel_bonus:1,accuracy_times_parallel:2,npr_format:1"
    result = score(spec, text, parse_trace(text), RIGHT)
    assert len(calls) == 1
    assert result.components == {
        "accuracy": 1.0, "format": 1.0, "parallel": 1.0,
        "accuracy_parallel_bonus": 1.2, "accuracy_times_parallel": 1.0, "npr_format": 1.0,
    }
    assert result.total == pytest.approx(1 + 0.2 + 0.5 + 1.2 + 2 + 1)
    assert result.grade == Grade(True, "12", None) and result.format_ok
    format_only = score("format", text, parse_trace(text), WRONG)  # still graded, for logging
    assert len(calls) == 2 and format_only.total == 1.0 and format_only.grade.correct is False
    assert rewards.graded(text, RIGHT).correct and len(calls) == 3  # outside score: no cache


def test_score_counts_grading_failures():
    result = score("accuracy", "I could not finish", parse_trace("I could not finish"), RIGHT)
    assert result.total == -1.0 and result.grade.error == "no answer found"


def test_rewards_read_token_id_traces():
    tags = TagIds(1000, 1001, 1002, 1003, 1004, 1005)
    ids = [7, 1000, 1002, 8, 1003, 1002, 9, 1003, 1001, 1004, 5, 1005, 6]  # a valid block
    trace = parse_ids(ids, tags)
    assert rewards.uses_parallel(TRACES["valid"], trace)
    assert score("parallel", TRACES["valid"], trace, RIGHT).total == 1.0


# ----------------------------------------------------------------------------- registry and specs


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so a test's rewards do not outlive it."""
    monkeypatch.setattr(rewards, "REWARDS", dict(rewards.REWARDS))
    return rewards.REWARDS


def test_a_user_reward_in_a_few_lines_is_selectable_by_name(registry):
    @register("short_and_correct")
    def short_and_correct(text, trace, problem):
        return float(rewards.is_correct(text, problem) and len(text) < 40)

    text = TRACES["none"]
    result = score("accuracy:1,short_and_correct:0.5", text, parse_trace(text), RIGHT)
    assert result.components == {"accuracy": 1.0, "short_and_correct": 1.0} and result.total == 1.5
    assert Constant("short_and_correct:2").spec(0) == {"short_and_correct": 2.0}
    with pytest.raises(NanoparError, match="already registered"):
        register("short_and_correct")(short_and_correct)
    register("short_and_correct", replace=True)(lambda text, trace, problem: 0.0)
    assert score("short_and_correct", text, parse_trace(text), RIGHT).total == 0.0


def test_unknown_reward_lists_the_known_names(registry):
    with pytest.raises(NanoparError) as error:
        get_reward("acuracy")
    assert str(error.value) == (
        "unknown reward 'acuracy'; known: accuracy, accuracy_parallel_bonus, accuracy_times_parallel, "
        "format, npr_format, parallel"
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "reward spec '': empty entry (expected name:weight, comma separated)"),
        ("accuracy:1,,format:1", "reward spec 'accuracy:1,,format:1': empty entry"),
        ("accuracy:x", "reward spec 'accuracy:x': weight 'x' of 'accuracy' is not a number"),
        ("accuracy:1,accuracy:2", "reward spec 'accuracy:1,accuracy:2': 'accuracy' appears twice"),
        ("acc:1", "unknown reward 'acc'; known: accuracy, "),
        (":1", "reward spec ':1': empty entry"),
    ],
)
def test_bad_spec_strings(spec, message):
    with pytest.raises(NanoparError) as error:
        parse_reward_spec(spec)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_spec_forms():
    assert parse_reward_spec("accuracy:1, format:0.2") == {"accuracy": 1.0, "format": 0.2}
    assert parse_reward_spec("accuracy,parallel:-0.5") == {"accuracy": 1.0, "parallel": -0.5}
    assert parse_reward_spec({"format": 2}) == {"format": 2.0}


def test_reward_names_are_checked():
    for bad in ("alternating", "two-phase", "a:b", "a,b", ""):
        with pytest.raises(NanoparError, match="reward name"):
            register(bad)


# ----------------------------------------------------------------------------- schedules

ACC, PAR = {"accuracy": 1.0}, {"parallel": 1.0}


def test_alternating_spec_per_step():
    schedule = Alternating()
    expected = [ACC] * 8 + [PAR] * 2 + [ACC] * 8 + [PAR] * 2 + [ACC] * 6  # steps 0..25
    assert [schedule.spec(step) for step in range(26)] == expected
    custom = Alternating("accuracy", "accuracy:1,accuracy_parallel_bonus:1", window=4, parallel_steps=1)
    mixed = {"accuracy": 1.0, "accuracy_parallel_bonus": 1.0}
    assert [custom.spec(step) for step in range(9)] == [ACC, ACC, ACC, mixed, ACC, ACC, ACC, mixed, ACC]
    assert [Alternating(window=3, parallel_steps=0).spec(k) for k in range(3)] == [ACC] * 3
    assert [Alternating(window=2, parallel_steps=2).spec(k) for k in range(3)] == [PAR] * 3


def test_spec_copies_do_not_leak():
    schedule = Constant("accuracy")
    schedule.spec(0)["accuracy"] = 99.0
    assert schedule.spec(1) == ACC


def test_two_phase_switches_at_first_steps():
    schedule = TwoPhase(first_steps=25)
    assert [schedule.spec(k) for k in (0, 7, 8, 9, 18, 19, 24)] == [ACC, ACC, PAR, PAR, PAR, PAR, ACC]
    assert all(schedule.spec(k) == ACC for k in range(25, 60))  # accuracy only from step 25
    inner = TwoPhase(first_steps=3, scaffold=Constant("format"), after=Alternating(window=2, parallel_steps=1))
    assert [inner.spec(k) for k in range(6)] == [{"format": 1.0}] * 3 + [ACC, PAR, ACC]  # `after` restarts at 0


def test_schedule_from_string():
    assert schedule_from_string("accuracy:1,format:0.2") == Constant({"accuracy": 1.0, "format": 0.2})
    assert schedule_from_string("constant:parallel:1") == Constant("parallel")
    assert schedule_from_string("alternating") == Alternating()
    assert schedule_from_string("alternating:10:2") == Alternating(window=10, parallel_steps=2)
    assert schedule_from_string("alternating:5") == Alternating(window=5)
    assert schedule_from_string("two-phase") == TwoPhase(200)
    two = schedule_from_string("two-phase:150:20:4")
    assert two == TwoPhase(150, Alternating(window=20, parallel_steps=4)) and two.spec(16) == PAR


@pytest.mark.parametrize(
    "text, message",
    [
        ("alternating:ten", "schedule 'alternating:ten': 'ten' is not a whole number"),
        ("alternating:10:2:1", "schedule 'alternating:10:2:1': too many numbers"),
        ("alternating:2:5", "alternating schedule needs window >= 1 and 0 <= parallel steps <= window"),
        ("two-phase:-1", "two-phase schedule needs first_steps >= 0"),
        ("two-phase:1.5", "schedule 'two-phase:1.5': '1.5' is not a whole number"),
        ("alternate:10:2", "unknown reward 'alternate'"),
        ("constant:", "reward spec '': empty entry"),
    ],
)
def test_bad_schedule_strings(text, message):
    with pytest.raises(NanoparError) as error:
        schedule_from_string(text)
    assert str(error.value).startswith(message)


# ----------------------------------------------------------------------------- TRL adapter


def test_trl_adapter_on_plain_strings():
    f = as_trl_reward("parallel")
    completions = [TRACES["valid"], TRACES["none"], TRACES["valid"].replace("12", "11"), "no answer"]
    values = f(prompts=["p"] * 4, completions=completions, answer=["12"] * 4, question=["q"] * 4, trainer_state=None)
    assert values == [1.0, -1.0, -1.0, -1.0]
    assert f.__name__ == "parallel" and f.grade_errors == {"no answer found": 1}


def test_trl_adapter_on_chat_messages_and_functions():
    def length_penalty(text, trace, problem):
        return -len(text) / 100

    f = as_trl_reward(length_penalty)
    assert f(completions=[[{"role": "assistant", "content": "x" * 50}]], answer=["1"]) == [-0.5]
    assert f.__name__ == "length_penalty" and not f.grade_errors
    g = as_trl_reward("accuracy")
    assert g(completions=[[{"role": "assistant", "content": r"so \boxed{\frac{1}{2}}"}]], answer=["0.5"]) == [1.0]
    with pytest.raises(NanoparError, match="no 'answer' column"):
        g(completions=["Final Answer: 1"], solution=["1"])


class TagTokenizer:
    """Characters are tokens (their code points), the six tags are special tokens 1000..1005."""

    def __init__(self):
        self.tag_ids = {name: 1000 + i for i, name in enumerate(
            ["<Parallel>", "</Parallel>", "<Path>", "</Path>", "<Summary>", "</Summary>"])}
        self.tags = {i: name for name, i in self.tag_ids.items()}

    def encode(self, text, add_special_tokens=False):
        ids, at = [], 0
        for start, end, _ in find_tags(text):
            ids += [ord(c) for c in text[at:start]] + [self.tag_ids[text[start:end]]]
            at = end
        return ids + [ord(c) for c in text[at:]]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(("" if skip_special_tokens else self.tags[i]) if i in self.tags else chr(i) for i in ids)


def test_trl_adapter_recovers_tags_that_trl_decoding_dropped():
    tokenizer = TagTokenizer()
    ids = tokenizer.encode(TRACES["valid"])
    as_trl_decodes = tokenizer.decode(ids, skip_special_tokens=True)  # what TRL hands over
    assert "<Parallel>" not in as_trl_decodes
    plain, with_ids = as_trl_reward("parallel"), as_trl_reward("parallel", tokenizer=tokenizer)
    assert plain(completions=[as_trl_decodes], answer=["12"]) == [-1.0]  # tags lost: no block
    assert with_ids(completions=[as_trl_decodes], completion_ids=[ids], answer=["12"]) == [1.0]
    with pytest.raises(NanoparError, match="no completion_ids"):
        with_ids(completions=[as_trl_decodes], answer=["12"])
