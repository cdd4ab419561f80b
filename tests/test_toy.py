"""Tests of nanopar.toy: the Countdown-style task, its checker, the teacher, the tokenizer and config.

Fast (a few seconds): 600 traces of each kind, every one format-checked, graded, re-derived step
by step and round-tripped through the tokenizer.
"""

import hashlib
import json
import random
import re
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanopar.data import Problem
from nanopar.format import check_format, check_parallel
from nanopar.model import ModelSettings, load_model
from nanopar.tags import NPR, PARALLEL_R1, TagIds, add_tag_tokens
from nanopar.toy import (
    FINAL,
    LEVELS,
    PARALLEL_PATHS,
    TEACHER_MIXES,
    check_countdown,
    evaluate,
    extract_toy_answer,
    grade_countdown,
    heldout,
    is_heldout,
    make_problems,
    npr_trace,
    parallel_trace,
    routes,
    sequential_trace,
    teacher_traces,
    toy_model_config,
    toy_tokenizer,
)
from nanopar.trace import parse_ids, parse_trace, trace_stats

N = 600  # traces of each kind
STEP = re.compile(r"^(\d+)([-+*])(\d+)=(\d+)$")
# Token bounds the teacher keeps (measured: easy sequential mean ~60 / max ~93, hard sequential
# ~73 / ~106, easy parallel ~84 / ~93, easy NPR ~97 / ~117 with NPR's tags added).
BOUNDS = {"easy-sequential": (70, 130), "hard-sequential": (80, 130), "easy-parallel": (100, 130),
          "easy-npr": (105, 130)}
MAX_PATH_TOKENS = 48  # the toy's default sampler setting: a step (label, attempt, </step>) must fit
# sha256 of json.dumps(teacher_traces(name), sort_keys=True) in Parallel-R1's tags, computed before
# the NPR teacher existed: the default run's data (and so its numbers) must not move.
PARALLEL_R1_TRACES = {
    "toy:sequential": "8df5188b90d15cd7bde9c30adaa51ff90c0ba53182a9f2a2225ced4de6a0bf74",
    "toy:instruct": "fa91f09bb13a21bc6851f72c3b65f292571daf5620ad1aecb310c857d8f11319",
    "toy:parallel": "a04c61ae491816cdd09fd8c6cc1ef93936f0cd03f65208adccb63df9fdc03f4d",
}


def known_problem():
    """numbers 5 9 8 target 12, answer (9+8)-5, written out (not drawn: independent of the generator)."""
    return Problem("t", "numbers 5 9 8 target 12", "(9+8)-5", "toy-easy",
                   {"numbers": [5, 9, 8], "target": 12, "level": "easy", "checker": "countdown",
                    "steps": ["9+8=17", "17-5=12"]})


def key(problem):
    return tuple(sorted(problem.extra["numbers"])), problem.extra["target"]


@pytest.fixture(scope="module")
def problems():
    return {level: make_problems(level, N, seed=1) for level in LEVELS}


@pytest.fixture(scope="module")
def traces(problems):
    rng = random.Random(0)
    return {
        "easy-sequential": [(p, sequential_trace(p, rng)) for p in problems["easy"]],
        "hard-sequential": [(p, sequential_trace(p, rng)) for p in problems["hard"]],
        "easy-parallel": [(p, parallel_trace(p, rng)) for p in problems["easy"]],
    }


@pytest.fixture(scope="module")
def npr_traces(problems):
    rng = random.Random(0)
    return [(p, npr_trace(p, rng)) for p in problems["easy"]]


@pytest.fixture(scope="module")
def npr_tokenizer():
    tokenizer = toy_tokenizer()
    add_tag_tokens(tokenizer, None, NPR)
    return tokenizer


@pytest.fixture(scope="module")
def held():
    return {level: heldout(level) for level in LEVELS}


@pytest.fixture(scope="module")
def tokenizer():
    return toy_tokenizer()


# --------------------------------------------------------------------------- the task


def test_generators_are_seeded(held):
    for level in LEVELS:
        assert make_problems(level, 50, seed=3) == make_problems(level, 50, seed=3)
        assert [p.question for p in make_problems(level, 50, seed=3)] != [p.question for p in make_problems(level, 50, seed=4)]
        assert heldout(level) == held[level]
    assert make_problems("easy", 3, seed=7)[:2] == make_problems("easy", 2, seed=7)  # a prefix of a longer draw


def test_heldout_is_fixed_distinct_and_disjoint_from_training(held):
    for level in LEVELS:
        split = held[level]
        assert len(split) == 150 and len({key(p) for p in split}) == 150
        assert len({p.id for p in split}) == 150 and all(p.id.startswith(f"toy-{level}-heldout:") for p in split)
        assert all(is_heldout(*key(p)) for p in split)
        train = [p for seed in range(4) for p in make_problems(level, 1000, seed)]
        assert not {key(p) for p in train} & {key(p) for p in split}
        assert not any(is_heldout(*key(p)) for p in train)
        assert len({key(p) for p in train}) > 1200  # not tiny: easy ~1,400 distinct in 4,000 draws, hard more


def test_problems_are_well_formed_and_solvable(problems):
    for level, spec in LEVELS.items():
        for p in problems[level]:
            numbers, target = p.extra["numbers"], p.extra["target"]
            assert p.extra["level"] == level and p.extra["checker"] == "countdown" and p.source == f"toy-{level}"
            assert p.question == f"numbers {' '.join(map(str, numbers))} target {target}"
            assert len(numbers) == spec.count and all(spec.low <= n <= spec.high for n in numbers)
            assert 1 <= target <= spec.bound
            assert check_countdown(p.answer, p)
            assert replay(",".join(p.extra["steps"]) + f"vs{target}yes so {p.answer}", numbers, target, spec.bound) == target
    assert len({p.id for p in problems["easy"]}) == N


def test_routes_enumerate_every_legal_route():
    assert len(routes([3, 7, 12])) == 22  # 3 pairs x 3 ops x 3 ops, less 5 over 100 (252 three times, 105, 120)
    assert len(routes([3, 7, 12], bound=150)) == 24  # only the three products 252 are over 150
    assert {r.value for r in routes([2, 2])} == {4}  # 2-2 = 0 is not positive; 2+2, 2*2 are one text each
    assert [r.steps for r in routes([2, 2])] == [("2+2=4",), ("2*2=4",)]
    easy, hard = (make_problems(level, 100, seed=9) for level in LEVELS)
    solving = [sum(r.value == p.extra["target"] for r in routes(p.extra["numbers"])) / len(routes(p.extra["numbers"]))
               for p in easy + hard]
    assert statistics.mean(solving) < 0.2  # a random route rarely checks out: trying several helps


# --------------------------------------------------------------------------- checking


def test_checker_accepts_correct_and_rejects_wrong_answers():
    p = known_problem()
    for right in ["(9+8)-5", "9+8-5", " 8 + 9 - 5 ", "((9)+(8))-5"]:
        assert check_countdown(right, p), right
    wrong = {
        "a number used twice": "(9+8)-5+5-5",
        "a missing number": "9+8",
        "a number not given": "(9+8)-5+1-1",
        "a wrong value": "9+8+5",
        "garbage": "twelve",
        "an equation": "9+8-5=12",
        "unary minus": "-5+9+8",
        "division": "(9+8)-5/1",
        "a leading zero": "(9+8)-05",
        "unclosed": "((9+8)-5",
        "too many closers": "(9+8))-5",
        "an empty answer": "",
        "too long": "(" * 150 + "9+8-5" + ")" * 150,
    }
    for why, answer in wrong.items():
        assert not check_countdown(answer, p), why
    assert not check_countdown(None, p)
    with pytest.raises(ValueError):
        evaluate("9+8-")


def test_extract_toy_answer():
    assert extract_toy_answer("x\nFinal Answer: 1+2\ny\nFinal Answer:  (3*4)+5 \n") == "(3*4)+5"
    assert extract_toy_answer("Final Answer:") is None
    assert extract_toy_answer("3+4=7vs7yes") is None
    assert extract_toy_answer(None) is None


# --------------------------------------------------------------------------- the teacher


def replay(attempt: str, numbers: list[int], target: int, bound: int) -> int:
    """Check one attempt "a+b=c,...vsTno" or "...vsTyes so EXPR" step by step; return its value.
    EXPR must be the same route as the steps: it uses the numbers once each and has their value."""
    body, verdict, expression = re.fullmatch(r"(.*)vs(\d+)(?:(no)|yes so (.+))", attempt).group(1, 3, 4)
    verdict = "no" if verdict else "yes"
    if expression is not None:
        value, used = evaluate(expression)
        assert value == target and sorted(used) == sorted(numbers), attempt
    pool = sorted(numbers)
    for step in body.split(","):
        a, op, b, value = STEP.match(step).groups()
        a, b, value = int(a), int(b), int(value)
        assert a >= b and value == {"+": a + b, "-": a - b, "*": a * b}[op] and 1 <= value <= bound, step
        pool.remove(a)
        pool.remove(b)  # each operand must be in the pool: a number or an earlier result
        pool.append(value)
    assert len(pool) == 1 and verdict == ("yes" if value == target else "no"), attempt
    assert attempt.split("vs")[1].startswith(str(target))
    return value


def test_sequential_traces_pass_format_and_grade_correct(traces):
    for kind in ("easy-sequential", "hard-sequential"):
        attempts_seen = set()
        for p, trace in traces[kind]:
            level = LEVELS[p.extra["level"]]
            assert check_format(trace).ok and "<" not in trace, trace
            assert check_countdown(extract_toy_answer(trace), p), trace
            *attempts, final = trace.split("\n")
            assert final.startswith(FINAL + " ") and 1 <= len(attempts) <= level.attempts
            for i, attempt in enumerate(attempts):
                last = i == len(attempts) - 1
                assert attempt.endswith(f"yes so {p.answer}" if last else "no"), trace
                replay(attempt, p.extra["numbers"], p.extra["target"], level.bound)
            assert len(set(attempts)) == len(attempts)
            attempts_seen.add(len(attempts))
        assert attempts_seen == set(range(1, LEVELS[kind.split("-")[0]].attempts + 1))  # every position occurs


def test_parallel_traces_pass_format_and_grade_correct(traces):
    t = PARALLEL_R1
    places = set()
    for p, trace in traces["easy-parallel"]:
        assert check_format(trace).ok, trace
        assert check_countdown(extract_toy_answer(trace), p), trace
        stats = trace_stats(parse_trace(trace))
        assert stats.valid_blocks == 1 and stats.paths_per_block == [PARALLEL_PATHS]
        paths = re.findall(f"{t.path_open}(.*?){t.path_close}", trace)
        summary = re.search(f"{t.summary_open}(.*?){t.summary_close}", trace).group(1)
        verdicts = ["yes so " in path for path in paths]
        right = paths[verdicts.index(True)]
        assert verdicts.count(True) == 1 and right.endswith(f"yes so {summary}") and len(set(paths)) == len(paths)
        assert summary == p.answer  # the summary keeps the answer of the path that checks out
        for path in paths:
            replay(path, p.extra["numbers"], p.extra["target"], LEVELS["easy"].bound)
        assert trace.startswith(t.block_open) and trace.endswith(f"{t.summary_close}\n{FINAL} {p.answer}")
        places.add(verdicts.index(True))
    assert places == set(range(PARALLEL_PATHS))  # the right path sits at every place


def test_parallel_trace_on_hard_raises(problems):
    with pytest.raises(ValueError, match="easy problems only"):
        parallel_trace(problems["hard"][0], random.Random(0))


def test_teacher_is_seeded(problems):
    p = problems["easy"][0]
    assert sequential_trace(p, random.Random(5)) == sequential_trace(p, random.Random(5))
    assert parallel_trace(p, random.Random(5)) == parallel_trace(p, random.Random(5))
    assert npr_trace(p, random.Random(5)) == npr_trace(p, random.Random(5))


def npr_round(trace: str) -> tuple[list[str], list[str], str]:
    """(plans, steps, takeaway) of a one-round NPR trace, each the text between its tags."""
    t = NPR
    inside = lambda open_, close: re.findall(f"{re.escape(open_)}(.*?){re.escape(close)}", trace)  # noqa: E731
    (takeaway,) = inside(t.summary_open, t.summary_close)
    return inside(t.plan_open, t.plan_close), inside(t.path_open, t.path_close), takeaway


def test_npr_traces_follow_npr_rules_and_grade_correct(npr_traces):
    t = NPR
    counts, places = [], set()
    for p, trace in npr_traces:
        assert check_format(trace, NPR).ok and check_parallel(trace, NPR).ok, trace
        assert not any(tag in trace for tag in PARALLEL_R1.all()), trace
        assert grade_countdown(trace, p).correct, trace
        assert trace.startswith(t.block_open) and trace.endswith(f"{t.summary_close}\n{FINAL} {p.answer}")
        plans, steps, takeaway = npr_round(trace)
        assert 2 <= len(plans) == len(steps) <= PARALLEL_PATHS, trace
        moves = []
        for i, (plan, step) in enumerate(zip(plans, steps)):
            label = NPR.label(i)
            assert label == f"{i + 1}:" and plan.startswith(label) and step.startswith(label), trace
            move, attempt = plan[len(label):], step[len(label):]
            assert re.fullmatch(r"\d[-+*]\d", move), plan  # the first move of the route: a few tokens
            assert attempt.startswith(f"{move}="), trace  # step i executes plan i's route
            replay(attempt, p.extra["numbers"], p.extra["target"], LEVELS["easy"].bound)
            moves.append(move)
        assert len(set(moves)) == len(moves), trace  # no two plans are one strategy
        verdicts = ["yes so " in step for step in steps]
        assert verdicts.count(True) == 1 and steps[verdicts.index(True)].endswith(f"yes so {takeaway}"), trace
        assert takeaway == p.answer  # the takeaway keeps the expression of the route that checks out
        assert check_countdown(takeaway, p)
        counts.append(len(plans))
        places.add((len(plans), verdicts.index(True)))
    assert set(counts) == {2, 3} and 0.4 < counts.count(2) / len(counts) < 0.6  # each count about half the time
    assert places == {(k, i) for k in (2, 3) for i in range(k)}  # the right step sits at every place


def test_npr_teacher_asks_for_easy_problems_and_a_schema_with_plans(problems):
    easy, rng = problems["easy"][0], random.Random(0)
    with pytest.raises(ValueError, match="easy problems only"):
        npr_trace(problems["hard"][0], rng)
    with pytest.raises(ValueError, match="has no plans"):
        npr_trace(easy, rng, schema=PARALLEL_R1)
    with pytest.raises(ValueError, match="has plans"):
        parallel_trace(easy, rng, schema=NPR)
    with pytest.raises(ValueError, match="2..8 plans"):
        npr_trace(easy, rng, paths=1)
    assert all(len(npr_round(npr_trace(p, rng, paths=2))[0]) == 2 for p in problems["easy"][:50])


def test_npr_tokens_put_each_step_label_right_after_its_tag(npr_traces, npr_tokenizer):
    """What the sampler forces at a branch's start (<step>, then the ids of "i:") is exactly how
    the teacher's traces tokenize, and the id reading (the layout's, the sampler's) is valid."""
    tag_ids = TagIds.from_tokenizer(npr_tokenizer, NPR)
    assert len(npr_tokenizer) <= toy_model_config().vocab_size  # the toy model needs no new rows for NPR's tags
    for p, trace in npr_traces:
        ids = npr_tokenizer.encode(trace, add_special_tokens=False)
        assert npr_tokenizer.decode(ids) == trace and npr_tokenizer.unk_token_id not in ids
        starts = [i for i, token in enumerate(ids) if token == tag_ids.path_open]
        for k, at in enumerate(starts):
            label = list(tag_ids.labels[k])
            assert ids[at + 1: at + 1 + len(label)] == label, trace
            close = ids.index(tag_ids.path_close, at)
            assert close - at <= MAX_PATH_TOKENS, trace  # label, attempt and </step> fit a path's budget
        assert check_parallel(parse_ids(ids, tag_ids)).ok, trace


def test_teacher_traces_in_npr_tags_have_the_mix_shares():
    for name, parallel_share in (("toy:instruct", 0.1), ("toy:parallel", 0.75)):
        records = teacher_traces(name, NPR)
        assert len(records) == 4000
        npr = [r for r in records if NPR.block_open in r["response"]]
        assert len(npr) == round(4000 * parallel_share), name
        assert all(check_format(r["response"], NPR).ok and check_parallel(r["response"], NPR).ok
                   and r["id"].startswith("toy-easy") for r in npr), name
        assert all("<" not in r["response"] and check_format(r["response"], NPR).ok  # sequential: no tags at all
                   for r in records if NPR.block_open not in r["response"]), name
        instructed = [r for r in records if r.get("instructions") == "parallel"]
        # an instruct base: prompted "in parallel", it answers in NPR's tags (and only then)
        assert instructed == (npr if name == "toy:instruct" else [])
        assert not any(tag in r["response"] for r in records for tag in PARALLEL_R1.all()), name
    assert teacher_traces("toy:sequential", NPR) == teacher_traces("toy:sequential")  # no parallel part: no change


def test_parallel_r1_teacher_traces_are_pinned():
    """The Parallel-R1 traces of every mix are byte for byte what they were before NPR's teacher."""
    for name in TEACHER_MIXES:
        records = teacher_traces(name)
        digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()
        assert digest == PARALLEL_R1_TRACES[name], name
        assert teacher_traces(name, PARALLEL_R1) == records


# --------------------------------------------------------------------------- tokenizer and model


def test_tokenizer_round_trips_every_trace_and_tags_are_single_tokens(traces, tokenizer, tmp_path):
    tag_ids = TagIds.from_tokenizer(tokenizer)  # raises unless each tag is one token
    assert len(set(tag_ids.all())) == 6
    assert len(tokenizer.encode(FINAL, add_special_tokens=False)) == 1
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer) and TagIds.from_tokenizer(loaded) == tag_ids
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    for kind, pairs in traces.items():
        for p, trace in pairs:
            text = f"{p.question}\n{trace}"  # the toy prompt, then the response
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids
            assert tokenizer.decode(ids) == text, kind
            assert loaded.encode(text, add_special_tokens=False) == ids
            assert loaded.decode(ids) == text
    odd = "Any ASCII:  two  spaces,\ttab\n\nand ~!@#$%^&*_ {}[]|\\;'\"<>?/`"
    assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd


def test_tokenizer_ids_are_pinned(tokenizer):
    """The ids a trained toy checkpoint depends on: EOS, the words, the characters, tab, newline, tags."""
    pinned = {"<|endoftext|>": 0, "<unk>": 1, FINAL: 2, "numbers": 3, " so ": 8, " ": 9, "0": 25, "~": 103,
              "\t": 104, "\n": 105, "<Parallel>": 106, "</Summary>": 111}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in pinned} == pinned and len(tokenizer) == 112
    text = "numbers 3 target 33\nyes so 3\tFinal Answer: 3<Path>"
    ids = [3, 9, 28, 9, 4, 9, 28, 28, 105, 5, 8, 28, 104, 2, 9, 28, 108]
    assert tokenizer.encode(text, add_special_tokens=False) == ids and tokenizer.decode(ids) == text
    assert tokenizer.clean_up_tokenization_spaces is False


def test_token_lengths_within_bounds(traces, npr_traces, tokenizer, npr_tokenizer):
    for kind, pairs in (traces | {"easy-npr": npr_traces}).items():
        encode = (npr_tokenizer if kind == "easy-npr" else tokenizer).encode
        lengths = [len(encode(trace, add_special_tokens=False)) for _, trace in pairs]
        mean, longest = statistics.mean(lengths), max(lengths)
        print(f"{kind}: mean {mean:.1f} tokens, max {longest}, min {min(lengths)}")
        assert mean <= BOUNDS[kind][0] and longest <= BOUNDS[kind][1], kind


def test_model_config_and_a_checkpoint_folder_that_loads_like_any_model(traces, tokenizer, tmp_path):
    config = toy_model_config(tokenizer)
    assert config.model_type == "qwen3" and config.vocab_size == 128 >= len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    assert 0.7e6 < params < 0.9e6, params
    built, built_tokenizer = load_model(ModelSettings("toy:model", device="cpu"))  # through data.SOURCES
    assert built_tokenizer.get_vocab() == tokenizer.get_vocab() and built.config._name_or_path == "toy:model"
    pairs = zip(built.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(ModelSettings(str(tmp_path), device="cpu"))
    assert TagIds.from_tokenizer(loaded_tokenizer) == TagIds.from_tokenizer(tokenizer)
    assert loaded.get_input_embeddings().weight.shape[0] == 128  # nothing added or resized
    p, trace = traces["easy-parallel"][0]
    ids = torch.tensor([tokenizer.encode(f"{p.question}\n{trace}", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model.eval()(ids).logits, atol=1e-5)


def test_rewards_grade_toy_problems_with_the_exact_checker():
    from nanopar.grading import grade
    from nanopar.rewards import score
    from nanopar.trace import parse_trace
    from nanopar.toy import make_problems, parallel_trace

    problem = known_problem()
    assert grade("Final Answer: 9+8-5", problem).correct
    assert not grade("Final Answer: 12", problem).correct  # the value alone does not use the numbers
    assert grade("no answer", problem).error == "no answer found"
    trace = parallel_trace(problem, random.Random(0))
    assert score("parallel", trace, parse_trace(trace), problem).total == 1.0
    trace = npr_trace(problem, random.Random(0))
    for reward in ("parallel", "npr_format", "format"):
        assert score(reward, trace, parse_trace(trace, NPR), problem).total == 1.0, reward
