"""Tests of nanopar.toy: the Countdown-style task, its checker, the teacher, the tokenizer and config.

Fast (a few seconds): 600 traces of each kind, every one format-checked, graded, re-derived step
by step and round-tripped through the tokenizer.
"""

import random
import re
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanopar.data import Problem
from nanopar.format import check_format
from nanopar.model import ModelSettings, load_model
from nanopar.tags import PARALLEL_R1, TagIds
from nanopar.toy import (
    FINAL,
    LEVELS,
    PARALLEL_PATHS,
    check_countdown,
    evaluate,
    extract_toy_answer,
    heldout,
    is_heldout,
    make_problems,
    parallel_trace,
    routes,
    sequential_trace,
    toy_model_config,
    toy_tokenizer,
)
from nanopar.trace import parse_trace, trace_stats

N = 600  # traces of each kind
STEP = re.compile(r"^(\d+)([-+*])(\d+)=(\d+)$")
# Token bounds the teacher keeps (measured: easy sequential mean ~51 / max ~85, hard sequential
# ~62 / ~94, easy parallel ~84 / ~92).
BOUNDS = {"easy-sequential": (70, 130), "hard-sequential": (80, 130), "easy-parallel": (100, 130)}


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


def test_token_lengths_within_bounds(traces, tokenizer):
    for kind, pairs in traces.items():
        lengths = [len(tokenizer.encode(trace, add_special_tokens=False)) for _, trace in pairs]
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
