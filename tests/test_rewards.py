"""The rewards, their registry, schedules and the TRL adapter (rewards.py, reward_registry.py,
reward_schedules.py). Grading: test_grading.py."""

import pytest

from conftest import PARALLEL_CASES, one_line
from nanopar import NanoparError, rewards
from nanopar.data import Problem
from nanopar.format import check_parallel, check_well_formed
from nanopar.grading import Grade, grade
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
from nanopar.tags import NPR, TagIds, find_tags
from nanopar.trace import parse_ids, parse_trace

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
    "parallel-strict": {("valid", 1): 1, ("invalid", 1): -1, ("none", 1): -1, ("valid", 0): -1, ("invalid", 0): -1,
                        ("none", 0): -1},
    # as released: correct with a block its format check fails (one path) is -1, below correct without one
    "accuracy_parallel_bonus": {
        ("valid", 1): 1.2, ("invalid", 1): -1, ("none", 1): 1, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1,
    },
    "accuracy_times_parallel": {
        ("valid", 1): 1, ("invalid", 1): 0, ("none", 1): 0, ("valid", 0): -1, ("invalid", 0): 0, ("none", 0): 0,
    },
    # ("none", 1) is 0: a correct sequential answer ranks below a correct parallel one, above a wrong one
    "npr_format": {("valid", 1): 1, ("invalid", 1): -1, ("none", 1): 0, ("valid", 0): -1, ("invalid", 0): -1, ("none", 0): -1},
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
    assert result.grade == Grade(True, "12", None) and result.layout_ok
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
    assert check_parallel(trace).ok
    assert score("parallel-strict", TRACES["valid"], trace, RIGHT).total == 1.0


# Parallel-R1's released reward for the parallel steps of its alternating schedule, gold 4: each
# value worked out by hand from its rules (reward_func_acc_and_parallel): correct and no <Parallel>
# in the text 1.0; correct, a <Parallel> or more and its format check passing 1.2; otherwise -1
B = "<Parallel><Path>2+2</Path><Path>2*2</Path></Parallel><Summary>4</Summary>"
RELEASED_BONUS = {
    "correct, a valid block": (B + "Final Answer: 4", 1.2),
    "correct, no tag": ("2+2 = 4\nFinal Answer: 4", 1.0),
    "wrong, a valid block": (B + "Final Answer: 5", -1.0),
    "wrong, no tag": ("Final Answer: 5", -1.0),
    # correct with a block the check fails: -1, below a correct answer without a block
    "correct, a block of one path": ("<Parallel><Path>4</Path></Parallel><Summary>4</Summary>Final Answer: 4", -1.0),
    "correct, a block with no summary": ("<Parallel><Path>a</Path><Path>b</Path></Parallel>Final Answer: 4", -1.0),
    "correct, a block left open": ("Final Answer: 4 <Parallel><Path>a</Path><Path>b", -1.0),
    # no <Parallel> in the text: 1.0 whatever other tag is there (the format is not asked)
    "correct, a stray </Path>, no block": ("2+2 = 4</Path>Final Answer: 4", 1.0),
    "correct, a summary without a block": ("<Summary>4</Summary>Final Answer: 4", 1.0),
    # the released check passes what nanopar's reading calls invalid: a summary never closed,
    # a path between </Parallel> and <Summary>, a path after the summary
    "correct, the summary never closed": ("<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>4 Final Answer: 4", 1.2),
    "correct, a path before the summary": (
        "<Parallel><Path>a</Path><Path>b</Path></Parallel><Path>c</Path><Summary>4</Summary>Final Answer: 4", 1.2),
    "correct, a path after the summary": (B + "<Path>z</Path>Final Answer: 4", 1.2),
}


@pytest.mark.parametrize("name", sorted(RELEASED_BONUS))
def test_accuracy_parallel_bonus_is_parallel_r1s_released_reward(name):
    text, value = RELEASED_BONUS[name]
    problem = Problem("p", "what is 2+2?", "4")
    assert get_reward("accuracy_parallel_bonus")(text, parse_trace(text), problem) == pytest.approx(value)


# every reward that means "a valid parallel trace" agrees with format.check_parallel; gold 4
NPR_FORMAT = {
    "clean": 1.0,  # correct and in the format (format.check_structured)
    "sequential": 0.0,  # correct, no tag: below a correct answer in the format, above a wrong one
    "path after the summary": -1.25,  # two stray tags: -1, then 0.25 less
    "nested path": -1.25,  # two stray tags
    "truncated block": -1.25,  # an invalid block, and truncated
    "one path": -1.0,  # one invalid block
}


LAID_OUT = {"clean", "sequential"}  # what PAPO keeps: no stray tag, no broken block, not cut inside one
# accuracy_parallel_bonus and `parallel` are the exceptions: they mirror Parallel-R1's released rewards,
# whose format check on the text passes a path after the summary and a nested path (two stray tags in the reading)
RELEASED_BONUS_ON_CASES = {"clean": 1.2, "path after the summary": 1.2, "nested path": 1.2,
                           "truncated block": -1.0, "one path": -1.0, "sequential": 1.0}


@pytest.mark.parametrize("name", sorted(PARALLEL_CASES))
def test_parallel_rewards_use_the_one_validity_predicate_and_papo_keeps_what_can_be_laid_out(name):
    text, valid, _ = PARALLEL_CASES[name]
    problem = Problem("p", "what is 2+2?", "4")
    spec = "parallel-strict:1,parallel:1,accuracy_parallel_bonus:1,accuracy_times_parallel:1,npr_format:1"
    result = score(spec, text, parse_trace(text), problem)
    assert result.components == {
        "parallel-strict": 1.0 if valid else -1.0,
        "parallel": 1.0 if RELEASED_BONUS_ON_CASES[name] == 1.2 else -1.0,  # the same released check, no bonus
        "accuracy_parallel_bonus": RELEASED_BONUS_ON_CASES[name],
        "accuracy_times_parallel": 1.0 if valid else 0.0,
        "npr_format": NPR_FORMAT[name],
    }
    assert valid == check_parallel(parse_trace(text)).ok
    assert result.layout_ok == (name in LAID_OUT) == check_well_formed(parse_trace(text)).ok  # what PAPO keeps


# NPR's rounds, gold 4: (response, npr_format, PAPO keeps it?). NPR's format check (its released
# compute_format_score >= 0) passes a round of one plan; a tagless answer fails it (-1.5 there)
ROUND = "<guideline><plan>1:add</plan>{more}</guideline><step>1:2+2=4</step>{steps}<takeaway>4</takeaway>\n"
NPR_ROUNDS = {
    "two plans": (ROUND.format(more="<plan>2:double</plan>", steps="<step>2:2*2=4</step>") + "Final Answer: 4", 1.0, True),
    "one plan": (ROUND.format(more="", steps="") + "Final Answer: 4", 1.0, True),
    "one plan, wrong": (ROUND.format(more="", steps="") + "Final Answer: 5", -1.0, True),
    "no tag": ("2+2=4\nFinal Answer: 4", 0.0, True),
    "no label": (ROUND.format(more="", steps="").replace("1:2+2", "2+2") + "Final Answer: 4", 0.0, True),
    "text between tags": (ROUND.format(more="", steps="").replace("</step>", "</step>so") + "Final Answer: 4", 0.0, True),
    "steps miss a plan": (ROUND.format(more="<plan>2:double</plan>", steps="") + "Final Answer: 4", -1.0, False),
    "cut in a step": ("<guideline><plan>1:add</plan></guideline><step>1:2+2", -1.25, False),  # open round, truncated
}


@pytest.mark.parametrize("name", sorted(NPR_ROUNDS))
def test_npr_format_pays_a_correct_answer_in_npr_format_one_plan_or_more(name):
    """A correct answer in rounds of one plan scores as one in parallel rounds (NPR's format check
    accepts it); a correct one outside the format (no tag, a text rule broken) 0; PAPO keeps every
    response the layout can lay out, sequential ones too."""
    text, value, laid_out = NPR_ROUNDS[name]
    result = score("npr_format", text, parse_trace(text, NPR), Problem("p", "what is 2+2?", "4"))
    assert (result.total, result.layout_ok) == (value, laid_out)


def test_npr_format_ranks_correct_parallel_over_correct_sequential_over_wrong():
    def value(text, answer):
        return get_reward("npr_format")(text, parse_trace(text), Problem("p", "q", answer))

    parallel, sequential = PARALLEL_CASES["clean"][0], PARALLEL_CASES["sequential"][0]
    assert value(parallel, "4") == 1.0 > value(sequential, "4") == 0.0 > value(parallel, "5") == -1.0
    assert value(sequential, "5") == -1.0 >= value(PARALLEL_CASES["one path"][0], "4")


def test_accuracy_parallel_bonus_under_npr_tags_asks_npr_rules():
    """The released check knows only Parallel-R1's tags: under NPR's, a round counts as a block and
    NPR's rules (format.check_format) are the check. Gold 4, values by hand."""
    two = ROUND.format(more="<plan>2:double</plan>", steps="<step>2:2*2=4</step>")
    broken = two.replace("<step>2:2*2=4</step>", "")  # two plans, one step: NPR's rule 2 fails

    def value(text):
        return get_reward("accuracy_parallel_bonus")(text, parse_trace(text, NPR), Problem("p", "q", "4"))

    assert [value(two + "Final Answer: 4"), value(broken + "Final Answer: 4"), value("Final Answer: 4"),
            value(two + "Final Answer: 5")] == [1.2, -1.0, 1.0, -1.0]


# ----------------------------------------------------------------------------- registry and specs


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
        "answered, format, npr_format, parallel, parallel-strict, valid_parallel"
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
    assert one_line(error).startswith(message)


def test_spec_forms():
    assert parse_reward_spec("accuracy:1, format:0.2") == {"accuracy": 1.0, "format": 0.2}
    assert parse_reward_spec("accuracy,parallel:-0.5") == {"accuracy": 1.0, "parallel": -0.5}
    assert parse_reward_spec({"format": 2}) == {"format": 2.0}


def test_reward_names_are_checked():
    for bad in ("alternating", "alternating-strict", "two-phase", "two-phase-strict", "a:b", "a,b", ""):
        with pytest.raises(NanoparError, match="reward name"):
            register(bad)


# ----------------------------------------------------------------------------- schedules

ACC, PAR, BONUS = {"accuracy": 1.0}, {"parallel-strict": 1.0}, {"accuracy_parallel_bonus": 1.0}


def test_alternating_spec_per_step():
    schedule = Alternating()
    expected = [ACC] * 8 + [BONUS] * 2 + [ACC] * 8 + [BONUS] * 2 + [ACC] * 6  # steps 0..25
    assert [schedule.spec(step) for step in range(26)] == expected
    custom = Alternating("accuracy", "accuracy:1,accuracy_parallel_bonus:1", window=4, parallel_steps=1)
    mixed = {"accuracy": 1.0, "accuracy_parallel_bonus": 1.0}
    assert [custom.spec(step) for step in range(9)] == [ACC, ACC, ACC, mixed, ACC, ACC, ACC, mixed, ACC]
    assert [Alternating(window=3, parallel_steps=0).spec(k) for k in range(3)] == [ACC] * 3
    assert [Alternating(window=2, parallel_steps=2).spec(k) for k in range(3)] == [BONUS] * 3


def test_spec_copies_do_not_leak():
    schedule = Constant("accuracy")
    schedule.spec(0)["accuracy"] = 99.0
    assert schedule.spec(1) == ACC


def test_two_phase_switches_at_first_steps():
    schedule = TwoPhase(first_steps=25)
    assert [schedule.spec(k) for k in (0, 7, 8, 9, 18, 19, 24)] == [ACC, ACC, BONUS, BONUS, BONUS, BONUS, ACC]
    assert all(schedule.spec(k) == ACC for k in range(25, 60))  # accuracy only from step 25
    inner = TwoPhase(first_steps=3, scaffold=Constant("format"), after=Alternating(window=2, parallel_steps=1))
    assert [inner.spec(k) for k in range(6)] == [{"format": 1.0}] * 3 + [ACC, BONUS, ACC]  # `after` restarts at 0


def test_schedule_from_string():
    assert schedule_from_string("accuracy:1,format:0.2") == Constant({"accuracy": 1.0, "format": 0.2})
    assert schedule_from_string("constant:parallel:1") == Constant("parallel")
    assert schedule_from_string("alternating") == Alternating()
    assert schedule_from_string("alternating:10:2") == Alternating(window=10, parallel_steps=2)
    assert schedule_from_string("alternating:5") == Alternating(window=5)
    assert schedule_from_string("two-phase") == TwoPhase(200)
    two = schedule_from_string("two-phase:150:20:4")
    assert two == TwoPhase(150, Alternating(window=20, parallel_steps=4)) and two.spec(16) == BONUS


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


def test_alternating_pays_the_released_reward_on_the_released_steps():
    """The released schedule (compute_score): global_step, 1-based (verl counts its first step as 1),
    pays accuracy when (global_step - 1) % 10 < 8, else accuracy_parallel_bonus. nanopar's step k
    (0-based) is global_step k + 1."""
    schedule = Alternating()
    for k in range(100):
        global_step = k + 1
        assert schedule.spec(k) == (ACC if (global_step - 1) % 10 < 8 else {"accuracy_parallel_bonus": 1.0}), k
    assert TwoPhase(first_steps=20).spec(9) == {"accuracy_parallel_bonus": 1.0}


def test_the_strict_reading_keeps_its_own_name():
    """alternating-strict pays `parallel-strict` (a correct answer in a valid parallel trace) on the same steps."""
    strict = schedule_from_string("alternating-strict")
    assert strict == Alternating(parallel_spec="parallel-strict")
    assert [strict.spec(k) for k in (0, 7, 8, 9, 10)] == [ACC, ACC, PAR, PAR, ACC]
    assert schedule_from_string("alternating-strict:5:1") == Alternating(parallel_spec="parallel-strict", window=5,
                                                                          parallel_steps=1)
    assert schedule_from_string("two-phase-strict:100:5:1") == TwoPhase(
        100, Alternating(parallel_spec="parallel-strict", window=5, parallel_steps=1))
    assert schedule_from_string("two-phase-strict").spec(8) == PAR
    for name in ("alternating-strict", "two-phase-strict"):
        with pytest.raises(NanoparError, match="reward name"):
            register(name)


@pytest.mark.parametrize(
    "text, message",
    [
        ("alternating-strict:ten", "schedule 'alternating-strict:ten': 'ten' is not a whole number "
                                   "(alternating-strict[:WINDOW[:PARALLEL_STEPS]])"),
        ("alternating-strict:10:2:1", "schedule 'alternating-strict:10:2:1': too many numbers"),
        ("alternating-strict:2:5", "alternating schedule needs window >= 1 and 0 <= parallel steps <= window"),
        ("two-phase-strict:x", "schedule 'two-phase-strict:x': 'x' is not a whole number "
                               "(two-phase-strict[:FIRST_STEPS[:WINDOW[:PARALLEL_STEPS]]])"),
    ],
)
def test_bad_strict_schedule_strings_are_one_line_errors(text, message):
    with pytest.raises(NanoparError) as error:
        schedule_from_string(text)
    assert one_line(error).startswith(message)


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
    plain, with_ids = as_trl_reward("parallel-strict"), as_trl_reward("parallel-strict", tokenizer=tokenizer)
    assert plain(completions=[as_trl_decodes], answer=["12"]) == [-1.0]  # tags lost: no block
    assert with_ids(completions=[as_trl_decodes], completion_ids=[ids], answer=["12"]) == [1.0]
    with pytest.raises(NanoparError, match="no completion_ids"):
        with_ids(completions=[as_trl_decodes], answer=["12"])


def test_the_released_stage_1_reward_reads_the_block_as_its_format_check_does():
    """`parallel` is Parallel-R1's released compute_score: +1 for a correct answer whose
    text holds <Parallel> and passes the released check, -1 otherwise; where the released check
    is looser than Algorithm 1 on the sampler's reading, it pays what `parallel-strict` does not."""
    right = Problem("p", "q", "4")
    block = "<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary>"
    cases = {  # text: (parallel, parallel-strict)
        block + " Final Answer: 4": (1.0, 1.0),
        block + " Final Answer: 5": (-1.0, -1.0),  # wrong
        "Final Answer: 4": (-1.0, -1.0),  # no block
        block.replace("</Summary>", "") + " Final Answer: 4": (1.0, -1.0),  # a summary left open
        block.replace("<Path>a</Path>", "<Path><Path>a</Path></Path>") + " Final Answer: 4": (1.0, -1.0),  # nested
        "<Parallel><Path>a</Path></Parallel><Summary>s</Summary> Final Answer: 4": (-1.0, -1.0),  # one path
    }
    for text, paid in cases.items():
        trace = parse_trace(text)
        assert (score("parallel", text, trace, right).total, score("parallel-strict", text, trace, right).total) == paid, text
