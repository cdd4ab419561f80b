"""Evaluation (nanopar/evaluation.py): pass@k and mean@k against independent computations, grading
of the shipped benchmarks' real answer formats through the evaluation path, records and summaries
of scripted and of real (tiny, random) sampling, re-scoring; eval.py's speed helpers and reward
report beside it (nanopar/eval_report.py)."""

import itertools
import json
import math
import statistics
from fractions import Fraction

import pytest

from nanopar import NanoparError, evaluation
from nanopar.data import load_problems
from nanopar.eval_report import decode_rate, forked, histogram, reward_report, sequential_rate, speedup
from nanopar.evaluation import evaluate, paired_difference, pass_at_k, rescore, sample_record, summarize
from nanopar.format import check_format
from nanopar.grading import gold_answer
from nanopar.metrics import rollout_metrics
from nanopar.model import ModelSettings, load_model
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, instructions_named, stop_ids
from nanopar.rewards import response_text, score
from nanopar.sampler import SamplerSettings
from nanopar.toy import toy_tokenizer
from scripted import FLEXIBLE_SCRIPT, GSM_18, GSM_70000, POLICY, PROBLEMS, SCRIPT, TOY, scripted

# ----------------------------------------------------------------------------- pass@k, mean@k


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The fraction of k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_enumeration_over_all_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n, c, k", [(16, 3, 1), (16, 3, 8), (100, 7, 10), (200, 1, 100), (64, 0, 5), (64, 64, 64)])
def test_pass_at_k_equals_the_binomial_formula(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # math.comb(m, k) = 0 for m < k
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the plain accuracy


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(NanoparError, match="pass@k needs"):
        pass_at_k(n, c, k)


def hand_record(problem: str, correct: bool, **fields) -> dict:
    """A minimal record as summarize reads it; structure fields default to a plain response
    (branch counts: the paths read, as under Parallel-R1's schema)."""
    fields.setdefault("branches_per_block", fields.get("paths_per_block", []))
    return {"source": "s", "id": problem, "correct": correct, "has_parallel": False, "relative_positions": [],
            "paths_per_block": [], "blocks": 0, "format_ok": True, "parse_error": None, "new_tokens": 10,
            "critical_path": 10, "finish": "eos"} | fields


def test_summarize_by_hand():
    records = [
        hand_record("a", True, has_parallel=True, blocks=1, paths_per_block=[2], relative_positions=[0.25],
                    new_tokens=40, critical_path=20),
        hand_record("a", False, parse_error="no answer found", finish="length", format_ok=False, new_tokens=30,
                    critical_path=30),
        hand_record("a", False),
        hand_record("a", True, has_parallel=True, blocks=2, paths_per_block=[3, 2], relative_positions=[0.5, 0.75],
                    new_tokens=60, critical_path=30),
        hand_record("b", False),
        hand_record("b", False),
        hand_record("b", False),
        hand_record("b", True),
    ]
    s = summarize(records, k=2)
    assert (s["problems"], s["samples"], s["k"]) == (2, 8, 2)
    assert s["accuracy"] == pytest.approx((2 / 4 + 1 / 4) / 2)  # mean@4 over problems
    assert s["pass_at_k"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # C(2,2)/C(4,2), C(3,2)/C(4,2)
    assert s["parallel_ratio"] == 2 / 8
    assert s["relative_position"] == pytest.approx((0.25 + 0.5 + 0.75) / 3)  # over blocks, not responses
    assert s["blocks_per_response"] == 3 / 8 and s["paths_per_block"] == pytest.approx(7 / 3)
    assert s["branches_per_block"] == pytest.approx(7 / 3) and s["branch_counts"] == {"2": 2 / 3, "3": 1 / 3}
    assert s["format_valid"] == 7 / 8 and s["parse_failures"] == 1 / 8 and s["truncation_rate"] == 1 / 8
    assert s["acceleration"] == pytest.approx(180 / 130) and s["response_length"] == pytest.approx(180 / 8)
    assert s["block_acceleration"] == pytest.approx((40 + 60) / (20 + 30))  # only the responses with a block
    # problems are the unit: per-problem accuracies 0.5 and 0.25, sample sd 0.25 / sqrt(2), over sqrt(2)
    assert s["accuracy_se"] == pytest.approx(0.125)
    # the parallel ratio likewise: per-problem shares 0.5 and 0, sample sd 0.5 / sqrt(2), over sqrt(2)
    assert s["parallel_ratio_se"] == pytest.approx(0.25)
    assert summarize(records)["k"] == 4 and summarize(records)["pass_at_k"] == pytest.approx(1.0)
    plain = summarize([hand_record("a", False)])
    assert plain["accuracy_se"] is None and plain["block_acceleration"] is None  # one problem; no block
    assert plain["relative_position"] is None and plain["paths_per_block"] is None and plain["branch_counts"] is None


def test_the_standard_error_is_the_binomial_one_at_one_sample_and_grows_with_correlated_samples():
    """k = 1: sqrt(p (1 - p) / (n - 1)). k = 4 with each problem all right or all wrong (samples
    that agree): the standard error of 4 problems, not of 16 independent draws."""
    import math

    one = summarize([hand_record(str(i), i < 3) for i in range(10)])
    assert one["accuracy_se"] == pytest.approx(math.sqrt(0.3 * 0.7 / 9))
    agree = summarize([hand_record(str(i), i < 2) for i in range(4) for _ in range(4)])
    assert agree["accuracy_se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 3))  # > sqrt(0.25 / 15) of 16 draws


def test_a_paired_difference_takes_the_problems_both_evaluated_one_by_one():
    """Two evaluations of the same 6 problems, 2 samples each; the second right once more on three
    of them. Per-problem differences 0.5, 0.5, 0.5, 0, 0, 0: mean 0.25, sample sd sqrt(0.075),
    over sqrt(6). The unpaired error, sqrt(se_a^2 + se_b^2), is much larger: the problems a model
    solves are mostly the ones the other solves."""
    import math
    import statistics

    right_before = {"p0": 0, "p1": 1, "p2": 1, "p3": 2, "p4": 0, "p5": 2}  # correct samples of 2
    right_after = {"p0": 1, "p1": 2, "p2": 2, "p3": 2, "p4": 0, "p5": 2}
    before, after = (summarize([hand_record(p, i < n) for p, n in right.items() for i in range(2)])
                     for right in (right_before, right_after))
    assert before["per_problem"] == {f"s/{p}": n / 2 for p, n in right_before.items()}
    difference, se = paired_difference(before, after)
    differences = [0.5, 0.5, 0.5, 0, 0, 0]
    assert difference == pytest.approx(after["accuracy"] - before["accuracy"]) == pytest.approx(0.25)
    assert se == pytest.approx(statistics.stdev(differences) / math.sqrt(6)) == pytest.approx(math.sqrt(0.075 / 6))
    assert se < 0.5 * math.hypot(before["accuracy_se"], after["accuracy_se"])
    # only the shared problems count; results saved before per-problem accuracies were kept: None
    wider = summarize([hand_record(p, True) for p in ["p0", "p1", "p9"] for _ in range(2)])
    assert paired_difference(before, wider) == pytest.approx((0.75, math.sqrt(0.125 / 2)))  # p0 +1, p1 +0.5
    assert paired_difference({k: v for k, v in before.items() if k != "per_problem"}, after) is None
    assert paired_difference(before, summarize([hand_record("p0", True)])) is None  # one shared problem


def test_summarize_refuses_a_k_some_problem_lacks():
    records = [hand_record("a", True), hand_record("a", False), hand_record("b", True)]
    with pytest.raises(NanoparError, match=r"pass@2 needs .*fewest: 1\)"):
        summarize(records, k=2)
    with pytest.raises(NanoparError, match="no records"):
        summarize([])


# ----------------------------------------------------------------------------- grading the shipped sets

PARALLEL_17 = r"<Parallel><Path>9*2=18, so \boxed{18}</Path><Path>16+1=17</Path></Parallel><Summary>17</Summary>" \
              "\nFinal Answer: 17"

# (problem id in the shipped files, response, correct): the gold strings are the files' own
SHIPPED_GRADING = [
    ("gsm8k:1", "She sells 16 - 3 - 4 = 9 eggs.\nFinal Answer: 18", True),  # gold "... #### 18"
    ("gsm8k:1", "Final Answer: $18", True),
    ("gsm8k:1", r"so she makes \boxed{18} dollars", True),
    ("gsm8k:1", "Final Answer: 16", False),
    ("gsm8k:1", "She makes 18 dollars every day.", False),  # no answer line: a parse failure, wrong
    ("gsm8k:1", PARALLEL_17, False),  # a path's box does not count: the last answer is 17
    ("gsm8k:3", "Final Answer: 70,000", True),  # gold "... #### 70000"
    ("gsm8k:3", "Final Answer: 7000", False),
    ("test/precalculus/807.json", r"\boxed{(3, \frac{\pi}{2})}", True),  # gold \left( 3, \frac{\pi}{2} \right)
    ("test/precalculus/807.json", r"Final Answer: $\left(3, \frac{\pi}{2}\right)$", True),
    ("test/precalculus/807.json", r"\boxed{(3, \pi)}", False),
    ("test/precalculus/807.json", r"\boxed{(\frac{\pi}{2}, 3)}", False),
    ("test/algebra/2584.json", r"\boxed{\dfrac{14}{3}}", True),  # gold \frac{14}{3}
    ("test/algebra/2584.json", "Final Answer: 14/3", True),
    ("test/algebra/2584.json", r"\boxed{4.67}", False),
    ("test/intermediate_algebra/1994.json", r"\boxed{-q + p}", True),  # gold p - q
    ("test/intermediate_algebra/1994.json", r"\boxed{q - p}", False),
    ("aime24:1", "Final Answer: 204", True),  # AIME: integer golds
    ("aime24:1", r"\boxed{204}", True),
    ("aime24:1", r"\boxed{240}", False),
    ("aime25:1", r"\boxed{70}", True),
    ("aime25:1", r"\boxed{07}", False),
    ("amc23:1", "Final Answer: 27", True),
    ("amc23:1", "Final Answer: 28", False),
]


def test_shipped_answer_formats_grade_through_evaluate_and_rescore(monkeypatch):
    tokenizer = toy_tokenizer()
    table = [(PROBLEMS[pid], text, "eos") for pid, text, _ in SHIPPED_GRADING]
    scripted(monkeypatch, tokenizer, table)
    problems = list({id(p): p for p, _, _ in table}.values())
    samples = {p.id: sum(row[0] is p for row in table) for p in problems}
    records = []
    for problem in problems:  # problems have different numbers of rows: one call each
        records += evaluate(None, tokenizer, [problem], POLICY, SamplerSettings(), samples=samples[problem.id])
    by_row = {(r["id"], r["response"]): r for r in records}
    for pid, text, correct in SHIPPED_GRADING:
        record = by_row[(pid, text)]
        assert record["correct"] is correct, (pid, text, record["extracted"], record["parse_error"])
        assert record["answer"] == PROBLEMS[pid].answer  # the gold as shipped, "#### 18" included
    assert by_row[("gsm8k:1", "She makes 18 dollars every day.")]["parse_error"] == "no answer found"
    again = rescore(records, "accuracy")
    assert [r.grade.correct for r in again] == [r["correct"] for r in records]


NON_INTEGER_GOLDS = {"aime25": {"aime25:20"}}  # its gold is "336^\\circ", as the source data set writes it


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gsm8k", "math500", "aime24", "aime25", "amc23"])
def test_every_shipped_gold_grades_right_and_integer_golds_off_by_one_wrong(name):
    """Each gold answer of the shipped file, written back in a box, is judged correct; for the
    integer sets (GSM8K, AIME, AMC) the gold plus one is judged wrong."""
    problems = load_problems(name)
    records = [{"id": p.id, "answer": p.answer, "response": rf"\boxed{{{gold_answer(p)}}}"} for p in problems]
    assert [r.grade.correct for r in rescore(records, "accuracy")] == [True] * len(problems)
    integers = [(p, int(gold_answer(p))) for p in problems if gold_answer(p).lstrip("-").isdigit()]
    if name != "math500":
        assert {p.id for p in problems} - {p.id for p, _ in integers} == NON_INTEGER_GOLDS.get(name, set())
    wrong = [{"id": p.id, "answer": p.answer, "response": f"Final Answer: {n + 1}"} for p, n in integers]
    assert not any(r.grade.correct for r in rescore(wrong, "accuracy"))


# ----------------------------------------------------------------------------- records and summaries
# (the scripted sampler, SCRIPT and FLEXIBLE_SCRIPT live in scripted.py: test_eval_cli.py runs them too)



def test_scripted_evaluation_records_and_summary(monkeypatch):
    tokenizer = toy_tokenizer()
    fake = scripted(monkeypatch, tokenizer, [(p, text, finish) for p, text, finish, _ in SCRIPT])
    done = []
    problems = [TOY, PROBLEMS["gsm8k:1"], PROBLEMS["aime24:1"]]
    records = evaluate(None, tokenizer, problems, POLICY, SamplerSettings(seed=5), samples=3, batch_size=2,
                       progress=done.append)
    assert done == [2, 3] and [c["seed"] for c in fake.calls] == [5, 6]  # one seed per sampler call
    assert [len(c["prompts"]) for c in fake.calls] == [2, 1] and all(c["samples"] == 3 for c in fake.calls)
    assert [(r["id"], r["sample"], r["batch"]) for r in records] == [
        (p.id, s, i // 2) for i, p in enumerate(problems) for s in range(3)]
    for record, (problem, text, finish, correct) in zip(records, SCRIPT):
        assert record["response"] == text and record["finish"] == finish and record["correct"] is correct
        assert record["prompt"] == tokenizer.decode(build_prompt(problem, tokenizer, instructions=""))
        assert (record["answer"], record["question"], record["extra"]) == (problem.answer, problem.question, problem.extra)
        assert record["format_ok"] == check_format(text).ok
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert record["new_tokens"] == len(ids) + (finish == "eos") == len(record["ids"])
        assert record["blocks"] == text.count("<Parallel>") == len(record["structure"]["blocks"])
    first = records[0]  # <Parallel> at token 0; the shorter path's tokens run beside the longer one
    paths = [len(tokenizer.encode(f"<Path>{p}</Path>", add_special_tokens=False)) for p in ("7+1=8,8*1=8vs8yes", "7*1=7,7+1=8vs8yes")]
    assert first["relative_positions"] == [0.0] and first["paths_per_block"] == [2] and first["has_parallel"]
    assert first["critical_path"] == first["new_tokens"] - min(paths)
    second_gsm = records[4]  # "ab" before the block: 2 tokens
    assert second_gsm["relative_positions"] == [2 / second_gsm["new_tokens"]] and second_gsm["has_parallel"]
    assert not records[7]["has_parallel"] and records[7]["valid_blocks"] == 0  # one path: not a valid block
    assert records[8]["parse_error"] == "no answer found" and records[2]["parse_error"] == "no answer found"

    s = summarize(records, k=2)
    assert s["accuracy"] == pytest.approx((1 / 3 + 2 / 3 + 1 / 3) / 3)
    assert s["pass_at_k"] == pytest.approx(((1 - 1 / 3) + 1 + (1 - 1 / 3)) / 3)  # C(2,2)/C(3,2) = 1/3
    assert s["parallel_ratio"] == pytest.approx(2 / 9) and s["blocks_per_response"] == pytest.approx(4 / 9)
    assert s["format_valid"] == pytest.approx(sum(check_format(t).ok for _, t, _, _ in SCRIPT) / 9)
    assert s["parse_failures"] == pytest.approx(2 / 9)  # two without an answer ("17</Path>" reads 17: wrong)
    assert s["truncation_rate"] == pytest.approx(2 / 9)
    assert s["acceleration"] == pytest.approx(sum(r["new_tokens"] for r in records) / sum(r["critical_path"] for r in records))
    assert s["acceleration"] > 1
    assert s["answers_found"] == pytest.approx(7 / 9)  # the truncated toy path and "I do not know": none
    assert [r["read_as"] for r in records[3:]] == ["final answer", "boxed", "final answer", "boxed", "final answer", None]
    # the toy's checker reads its own format: no flexible reading there, so none for a set holding it
    assert all(r["flexible_correct"] is None and r["flexible_read_as"] is None for r in records[:3])
    assert [r["flexible_correct"] for r in records[3:]] == [r["correct"] for r in records[3:]]
    assert s["accuracy_flexible"] is None and s["answers_found_flexible"] is None
    assert summarize(records[3:])["accuracy_flexible"] == summarize(records[3:])["accuracy"] == pytest.approx(1 / 2)




def test_strict_and_flexible_readings_side_by_side(monkeypatch):
    """GSM8K-style answers (#### N, a number in a sentence, $70,000): each record stores both
    gradings, and the summary tells the format failures (flexible only) from the maths ones."""
    tokenizer = toy_tokenizer()
    scripted(monkeypatch, tokenizer, [(p, text, "eos") for p, text, _, _ in FLEXIBLE_SCRIPT])
    records = evaluate(None, tokenizer, [GSM_18, GSM_70000], POLICY, SamplerSettings(), samples=4,
                       instructions=instructions_named("answer"))
    for record, (_, text, (correct, found), (flexible, how)) in zip(records, FLEXIBLE_SCRIPT):
        assert record["response"] == text
        assert (record["correct"], record["extracted"] is not None) == (correct, found)
        assert (record["flexible_correct"], record["flexible_read_as"]) == (flexible, how)
        assert (record["flexible_error"] == "no answer found") == (how is None)
    assert [r["flexible_extracted"] for r in records] == ["18", "18", "18", "16", "70000", "7000", None, None]
    s = summarize(records)
    assert s["accuracy"] == pytest.approx((1 / 4 + 0 / 4) / 2)  # 12.5%: one boxed answer
    assert s["accuracy_flexible"] == pytest.approx((3 / 4 + 1 / 4) / 2)  # 50%: three more read
    assert s["answers_found"] == 2 / 8 and s["answers_found_flexible"] == 6 / 8
    assert s["parse_failures"] == 6 / 8 and s["parse_failures_flexible"] == 2 / 8
    again = json.loads(json.dumps(records))  # as read back from samples.jsonl: the same summary
    assert summarize(again) == s
    old = [{k: v for k, v in r.items() if not k.startswith("flexible")} for r in again]  # saved before
    assert summarize(old)["accuracy_flexible"] is None and summarize(old)["accuracy"] == s["accuracy"]


def test_a_grpo_step_and_an_evaluation_report_the_same_structure(monkeypatch):
    """The same responses, as a training step's rollouts and as saved evaluation records: the
    structure numbers (and accuracy, parse failures) are equal to the last bit."""
    tokenizer = toy_tokenizer()
    fake = scripted(monkeypatch, tokenizer, [(p, text, finish) for p, text, finish, _ in SCRIPT])
    problems = [TOY, PROBLEMS["gsm8k:1"], PROBLEMS["aime24:1"]]
    prompts = [build_prompt(p, tokenizer, instructions="") for p in problems]
    eos = stop_ids(None, tokenizer)
    rollouts = fake(None, prompts, POLICY, SamplerSettings(), eos, 3)
    owners = [p for p in problems for _ in range(3)]
    results = [score("accuracy", response_text(r, tokenizer, eos), r.trace, p) for r, p in zip(rollouts, owners)]
    step = rollout_metrics(rollouts, results, group_size=3)
    records = [json.loads(json.dumps(sample_record(r, p, i % 3, tokenizer, eos)))  # as read back from a file
               for i, (r, p) in enumerate(zip(rollouts, owners))]
    summary = summarize(records)
    shared = ["accuracy", "parse_failures", "parallel_ratio", "relative_position", "blocks_per_response",
              "paths_per_block", "branches_per_block", "branch_counts", "acceleration", "response_length",
              "truncation_rate"]
    assert {key: step[key] for key in shared} == {key: summary[key] for key in shared}
    assert step["parallel_ratio"] == 2 / 9 and step["truncation_rate"] == 2 / 9 and step["acceleration"] > 1


def test_speed_helpers(monkeypatch):
    tokenizer = toy_tokenizer()
    fake = scripted(monkeypatch, tokenizer, [(p, text, finish) for p, text, finish, _ in SCRIPT], wall_time=0.5)
    problems = [TOY, PROBLEMS["gsm8k:1"], PROBLEMS["aime24:1"]]
    records = evaluate(None, tokenizer, problems, POLICY, SamplerSettings(seed=5), samples=3, batch_size=2)
    rate = decode_rate(records)  # two calls of 0.5 s each
    assert rate["seconds"] == 1.0 and rate["tokens"] == sum(r["new_tokens"] for r in records)
    assert rate["tokens_per_second"] == rate["tokens"] / 1.0
    assert decode_rate(records, batches=1)["tokens"] == sum(r["new_tokens"] for r in records[:6])
    evaluated = fake.calls[:]
    fake.calls.clear()
    sequential = sequential_rate(None, tokenizer, problems, POLICY, SamplerSettings(seed=5), samples=3, batch_size=2)
    assert sequential["seconds"] == 1.0
    assert [c["tag_ids"] for c in fake.calls] == [None, None]  # no tags: nothing forks
    assert [(c["prompts"], c["seed"]) for c in fake.calls] == [(c["prompts"], c["seed"]) for c in evaluated]


def test_speedup_takes_turns_and_keeps_the_best_round_of_each(monkeypatch):
    """The evaluation's own call (1.0 s, cold) is not timed again; then parallel and sequential
    take turns: 0.5, 0.8, 0.4, 0.9 s. The best of each (0.4, 0.8) make the speedup: 2.0 on the same
    tokens. (Timing the evaluation's call against one sequential decode would read 1.0 vs 0.5: 0.5x.)"""
    tokenizer = toy_tokenizer()
    fake = scripted(monkeypatch, tokenizer, [(p, text, finish) for p, text, finish, _ in SCRIPT],
                    wall_time=[1.0, 0.5, 0.8, 0.4, 0.9])
    problems = [TOY, PROBLEMS["gsm8k:1"], PROBLEMS["aime24:1"]]
    records = evaluate(None, tokenizer, problems, POLICY, SamplerSettings(seed=5), samples=3, batch_size=3)
    assert forked(records) and forked(records, batches=1) and not forked(records, mode="causal")
    pair = speedup(None, tokenizer, problems, POLICY, SamplerSettings(seed=5), samples=3, batch_size=3, repeats=2)
    tokens = sum(r["new_tokens"] for r in records)
    assert pair["parallel"] == {"tokens": tokens, "seconds": 0.4, "tokens_per_second": tokens / 0.4}
    assert pair["sequential"] == {"tokens": tokens, "seconds": 0.8, "tokens_per_second": tokens / 0.8}
    assert pair["speedup"] == pytest.approx(2.0)
    assert [c["tag_ids"] is None for c in fake.calls] == [False, False, True, False, True]  # taking turns
    assert len({(tuple(map(tuple, c["prompts"])), c["seed"]) for c in fake.calls}) == 1  # the same prompts and seed
    nothing = [r for r in records if not r["paths_per_block"] or max(r["paths_per_block"]) < 2]
    assert len(nothing) == 7 and not forked(nothing)  # one path is no fork


def test_real_tiny_model_records_agree_with_the_sampler():
    model, tokenizer = load_model(ModelSettings("tiny:qwen3"))
    problems = load_problems("aime24", limit=2)
    settings = SamplerSettings(max_new_tokens=40, max_path_tokens=12, seed=3)
    records = evaluate(model, tokenizer, problems, Policy.for_tokenizer(tokenizer), settings, samples=3, batch_size=1)
    assert len(records) == 6 and {r["batch"] for r in records} == {0, 1}
    assert sum(r["blocks"] for r in records) > 0  # a random model draws <Parallel> now and then: forks happen
    for r in records:
        ids = r["ids"][:-1] if r["finish"] == "eos" else r["ids"]
        assert r["response"] == tokenizer.decode(ids, skip_special_tokens=False)
        assert r["new_tokens"] == len(r["ids"]) == r["stats"]["new_tokens"] and r["stats"]["sampled_tokens"] <= 40
        assert r["critical_path"] == r["stats"]["critical_path"] and r["blocks"] == r["stats"]["forks"]
        assert r["relative_positions"] == [b["open"] / len(r["ids"]) for b in r["structure"]["blocks"]]
        assert r["paths_per_block"] == [len(b["paths"]) for b in r["structure"]["blocks"]]
        assert r["correct"] is False and set(r) >= {"prompt", "extracted", "parse_error", "format_ok", "valid_blocks"}
        assert not set(evaluation.TRAINING_ONLY) & set(r)


# ----------------------------------------------------------------------------- re-scoring


def test_rescore_and_report_by_hand(monkeypatch):
    tokenizer = toy_tokenizer()
    scripted(monkeypatch, tokenizer, [(p, text, finish) for p, text, finish, _ in SCRIPT])
    records = evaluate(None, tokenizer, [TOY, PROBLEMS["gsm8k:1"], PROBLEMS["aime24:1"]], POLICY, SamplerSettings(),
                       samples=3)
    results = rescore(records, "accuracy:1,format:0.5")
    correct = [c for *_, c in SCRIPT]
    fmt = [1.0 if check_format(t).ok else -1.0 for _, t, _, _ in SCRIPT]
    totals = [(1.0 if c else -1.0) + 0.5 * f for c, f in zip(correct, fmt)]
    assert [r.total for r in results] == totals
    report = reward_report(results, [r["correct"] for r in records])
    assert report["count"] == 9 and report["mean"] == pytest.approx(statistics.fmean(totals))
    assert report["accuracy"] == pytest.approx(4 / 9) and report["regraded_changed"] == 0
    assert report["correlation"] == pytest.approx(statistics.correlation(totals, [float(c) for c in correct]))
    assert report["mean_if_correct"] == pytest.approx(statistics.fmean(t for t, c in zip(totals, correct) if c))
    assert sum(report["histogram"].values()) == 9
    assert report["components"] == {"accuracy": pytest.approx(statistics.fmean(1.0 if c else -1.0 for c in correct)),
                                     "format": pytest.approx(statistics.fmean(fmt))}
    flipped = [not r["correct"] for r in records]
    assert reward_report(results, flipped)["regraded_changed"] == 9
    accuracy_only = reward_report(rescore(records, "accuracy"))
    assert accuracy_only["correlation"] == pytest.approx(1.0) and (accuracy_only["mean"] + 1) / 2 == pytest.approx(4 / 9)


def test_rescore_bad_input():
    with pytest.raises(NanoparError, match="unknown reward 'acuracy'"):
        rescore([{"id": "a", "answer": "1", "response": "Final Answer: 1"}], "acuracy")
    with pytest.raises(NanoparError) as error:
        rescore([{"id": "a", "answer": "1", "response": "x"}, {"id": "b", "text": "x"}], "accuracy", where="s.jsonl")
    assert str(error.value) == "s.jsonl:2: no answer, response field (an eval.py samples.jsonl record has them)"


def test_histogram_bins():
    assert histogram([1.0, -1.0, 1.0]) == {"-1": 1, "1": 2}
    values = [i / 10 for i in range(11)] + [0.05]
    bins = histogram(values, bins=4)
    assert len(bins) == 4 and sum(bins.values()) == 12 and list(bins)[-1].endswith("1]")
