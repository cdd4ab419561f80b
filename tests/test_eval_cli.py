"""eval.py as a user runs it: files that agree with each other, re-scoring that reproduces the
summary, --compare, a user's reward file, and one-line errors for bad input."""

import dataclasses
import json
from pathlib import Path

import pytest

import eval as eval_script
import nanopar.model
from conftest import one_line, reward_file, run_script
from nanopar import NanoparError
from nanopar.config import field_comments
from nanopar.data import read_jsonl
from nanopar.eval_report import decode_rate, forked
from nanopar.evaluation import summarize
from nanopar.format import check_format
from scripted import FLEXIBLE_SCRIPT, PROBLEMS, SCRIPT, TOY, scripted  # the scripted sampler and its responses

SUMMARY_KEYS = ("problems", "samples", "k", "accuracy", "accuracy_flexible", "answers_found", "answers_found_flexible",
                "pass_at_k", "parallel_ratio", "relative_position", "blocks_per_response", "paths_per_block",
                "branches_per_block", "format_valid", "parse_failures", "parse_failures_flexible", "acceleration",
                "response_length", "truncation_rate")


def check_files_agree(out: Path, benchmarks: list[str], samples: int) -> tuple[dict, list[dict]]:
    """summary.json is what summarize() makes of samples.jsonl, benchmark by benchmark."""
    summary = json.loads((out / "summary.json").read_text())
    records = read_jsonl(out / "samples.jsonl")
    assert list(summary["benchmarks"]) == benchmarks
    for name in benchmarks:
        mine = [r for r in records if r["benchmark"] == name]
        saved = summary["benchmarks"][name]
        again = summarize(mine, k=saved["k"])
        assert {k: saved[k] for k in SUMMARY_KEYS} == pytest.approx({k: again[k] for k in SUMMARY_KEYS})
        assert saved["branch_counts"] == pytest.approx(again["branch_counts"])
        assert saved["samples"] == len(mine) == saved["problems"] * samples
        assert saved["tokens_per_second"] == pytest.approx(decode_rate(mine)["tokens_per_second"])
    return summary, records


def test_tiny_model_end_to_end(tmp_path):
    out = tmp_path / "run"
    summary = eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout,aime24", "--limit", "2",
                                "--samples", "2", "--max-new-tokens", "32", "--max-path-tokens", "12",
                                "--batch-size", "1", "--out", str(out)])
    saved, records = check_files_agree(out, ["toy:easy:heldout", "aime24"], samples=2)
    assert saved == json.loads(json.dumps(summary))
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "toy:model" and config["samples"] == 2 and config["max_new_tokens"] == 32
    assert [(r["benchmark"], r["sample"]) for r in records] == [(b, s) for b in ("toy:easy:heldout", "aime24")
                                                                for _ in range(2) for s in range(2)]
    for name, metrics in saved["benchmarks"].items():
        if forked([r for r in records if r["benchmark"] == name], batches=1):  # a random model forks now and then
            assert metrics["sequential_tokens_per_second"] > 0 and metrics["parallel_tokens_per_second"] > 0
            assert metrics["speedup"] == pytest.approx(metrics["parallel_tokens_per_second"]
                                                       / metrics["sequential_tokens_per_second"])
        else:
            assert metrics["speedup"] is metrics["sequential_tokens_per_second"] is None
    reports = eval_script.main(["--rescore", str(out / "samples.jsonl"), "--reward", "accuracy"])
    for name, metrics in saved["benchmarks"].items():
        assert (reports[name]["mean"] + 1) / 2 == pytest.approx(metrics["accuracy"])


def test_scripted_run_rescoring_reproduces_the_accuracy(tmp_path, monkeypatch, capsys):
    """The sampler replaced by scripted responses (toy_tokenizer = toy:model's), so accuracy is 1/3."""
    from nanopar.toy import toy_tokenizer

    scripted(monkeypatch, toy_tokenizer(), [(p, text, finish) for p, text, finish, _ in SCRIPT])
    out = tmp_path / "run"
    eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout,aime24", "--limit", "1",
                      "--samples", "3", "--pass-k", "2", "--out", str(out)])
    saved, records = check_files_agree(out, ["toy:easy:heldout", "aime24"], samples=3)
    shown = capsys.readouterr().out
    assert "mean@3 (accuracy)" in shown and "pass@2" in shown and "33.3%" in shown
    assert [r["id"] for r in records] == [TOY.id] * 3 + [PROBLEMS["aime24:1"].id] * 3
    for name in ("toy:easy:heldout", "aime24"):
        assert saved["benchmarks"][name]["accuracy"] == pytest.approx(1 / 3)
        assert saved["benchmarks"][name]["pass_at_k"] == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2)
    assert saved["average"]["accuracy"] == pytest.approx(1 / 3)

    reports = eval_script.main(["--rescore", str(out / "samples.jsonl"), "--reward", "accuracy"])
    assert set(reports) == {"toy:easy:heldout", "aime24", "all"}
    for name in ("toy:easy:heldout", "aime24"):
        assert (reports[name]["mean"] + 1) / 2 == pytest.approx(saved["benchmarks"][name]["accuracy"])
        assert reports[name]["correlation"] == pytest.approx(1.0) and reports[name]["regraded_changed"] == 0
    assert reports["all"]["histogram"] == {"-1": 4, "1": 2}

    scripted_rows = [row for row in SCRIPT if row[0] in (TOY, PROBLEMS["aime24:1"])]
    reports = eval_script.main(["--rescore", str(out / "samples.jsonl"), "--reward", "format"])
    expected = [1.0 if check_format(text).ok else -1.0 for _, text, _, _ in scripted_rows]
    assert reports["all"]["mean"] == pytest.approx(sum(expected) / len(expected))


def table_row(shown: str, label: str) -> list[str]:
    """The cells after the label of the first printed table row named `label`."""
    line = next(line for line in shown.splitlines() if line.strip("│┃ ").startswith(label))
    return [cell.strip() for cell in line.strip("│┃ ").split("│")[1:]]


def test_the_table_shows_strict_and_flexible_accuracy_and_the_answers_each_found(tmp_path, monkeypatch, capsys):
    """A toy set (its checker: no flexible reading, "-") beside GSM8K answered '#### 18', 'She makes
    9 * 2 = 18 dollars.' and with a boxed 18: strict 1 of 3, flexible 3 of 3; the model fails at
    the format, not at the maths, and the table says so."""
    from nanopar.toy import toy_tokenizer

    gsm = [(p, text, "eos") for p, text, _, _ in FLEXIBLE_SCRIPT[:3]]
    scripted(monkeypatch, toy_tokenizer(), [(p, text, finish) for p, text, finish, _ in SCRIPT[:3]] + gsm)
    out = tmp_path / "run"
    summary = eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout,gsm8k", "--limit", "1",
                                "--samples", "3", "--speedup-batches", "0", "--out", str(out)])
    shown = capsys.readouterr().out
    toy, gsm8k = summary["benchmarks"]["toy:easy:heldout"], summary["benchmarks"]["gsm8k"]
    assert (gsm8k["accuracy"], gsm8k["accuracy_flexible"]) == (pytest.approx(1 / 3), 1.0)
    assert (gsm8k["answers_found"], gsm8k["answers_found_flexible"]) == (pytest.approx(1 / 3), 1.0)
    assert (toy["accuracy"], toy["answers_found"]) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert toy["accuracy_flexible"] is None and toy["answers_found_flexible"] is None
    assert summary["average"]["accuracy_flexible"] is None  # not over a set that has none
    # rows: metric, toy, gsm8k, average
    assert table_row(shown, "mean@3 (accuracy)") == ["33.3%", "33.3%", "33.3%"]
    assert table_row(shown, "flexible reading") == ["-", "100.0%", "-"]
    assert table_row(shown, "answers found (strict)") == ["66.7%", "33.3%", "50.0%"]
    assert table_row(shown, "answers found (flexible)") == ["-", "100.0%", "-"]
    records = read_jsonl(out / "samples.jsonl")
    assert [r["flexible_read_as"] for r in records] == [None] * 3 + ["####", "last number", "boxed"]
    assert [r["read_as"] for r in records] == [None] * 5 + ["boxed"]  # a checker does not say how it read


def test_a_real_model_is_asked_for_a_boxed_answer_in_its_chat_template_by_default(tmp_path, monkeypatch,
                                                                                  qwen_tokenizer):
    """eval.py's default instructions ("answer") for a hub model: Qwen's one-line request, inside
    the tokenizer's chat template (the model load is stood in for by the offline Qwen tokenizer)."""
    from nanopar.prompts import ANSWER_INSTRUCTIONS

    monkeypatch.setattr(nanopar.model, "load_model", lambda settings, schema: (None, qwen_tokenizer))
    scripted(monkeypatch, qwen_tokenizer, [(p, text, "eos") for p, text, _, _ in FLEXIBLE_SCRIPT[:2]])
    out = tmp_path / "run"
    summary = eval_script.main(["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--benchmarks", "gsm8k", "--limit", "1",
                                "--samples", "2", "--out", str(out)])
    (first, second) = read_jsonl(out / "samples.jsonl")
    question = PROBLEMS["gsm8k:1"].question
    assert first["prompt"] == f"<|im_start|>user\n{ANSWER_INSTRUCTIONS}\n\n{question}<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((out / "config.json").read_text())["instructions"] == "answer"
    assert summary["benchmarks"]["gsm8k"]["accuracy"] == 0.0 and summary["benchmarks"]["gsm8k"]["accuracy_flexible"] == 1.0


def test_no_speedup_when_nothing_forked_and_the_pair_timed_in_turns_when_something_did(tmp_path, monkeypatch,
                                                                                      capsys):
    """The toy's responses fork (a block of two paths): after its evaluation call (1.0 s, cold), the
    pair takes turns, parallel 0.5 / 0.4 s, sequential 0.8 / 0.9 s: speedup 2.00 (timing the
    cold call against one sequential decode would read 1.0 vs 0.5: 0.50x). GSM8K's responses hold
    no block: both decodes would be the same work, so no speedup ("-") and nothing decoded again."""
    from nanopar.toy import toy_tokenizer

    fake = scripted(monkeypatch, toy_tokenizer(),
                    [(p, text, finish) for p, text, finish, _ in SCRIPT[:3]]
                    + [(p, text, "eos") for p, text, _, _ in FLEXIBLE_SCRIPT[:3]],
                    wall_time=[1.0, 0.5, 0.8, 0.4, 0.9, 0.3])
    summary = eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout,gsm8k", "--limit", "1",
                                "--samples", "3", "--out", str(tmp_path / "run")])
    toy, gsm8k = summary["benchmarks"]["toy:easy:heldout"], summary["benchmarks"]["gsm8k"]
    assert toy["speedup"] == pytest.approx(2.0)
    assert toy["parallel_tokens_per_second"] == pytest.approx(2 * toy["sequential_tokens_per_second"])
    assert gsm8k["speedup"] is gsm8k["parallel_tokens_per_second"] is gsm8k["sequential_tokens_per_second"] is None
    assert len(fake.calls) == 6 and [c["tag_ids"] is None for c in fake.calls[1:5]] == [False, True, False, True]
    shown = capsys.readouterr().out
    assert table_row(shown, "speedup (x)") == ["2.00", "-", "-"]  # toy, gsm8k, average
    assert "gsm8k: no block forked in the first 1 sampler call(s): no speedup to measure" in shown


def test_progress_prints_plain_lines_when_the_output_is_not_a_terminal():
    """A log file gets a line per task at its start, at every tenth, and at an update 30 s or more
    after the last line (a clock stands in for time); a terminal gets the bars only."""
    import io

    from rich.console import Console

    from nanopar.show import progress

    def run(console):
        now = [0.0]
        with progress(console) as bar:
            bar.get_time = lambda: now[0]
            task = bar.add_task("gsm8k", total=20)
            for done in range(1, 21):
                now[0] += 1
                bar.update(task, completed=done)
            slow = bar.add_task("aime24", total=1000)
            for _ in range(5):
                now[0] += 20
                bar.advance(slow)
        return console.file.getvalue()

    log = run(Console(file=io.StringIO(), width=100))
    lines = [line for line in log.splitlines() if ": " in line]
    assert lines == [f"gsm8k: {2 * i}/20 ({10 * i}%), {2 * i} s" for i in range(11)] + [
        "aime24: 0/1000 (0%), 0 s", "aime24: 2/1000 (0%), 40 s", "aime24: 4/1000 (0%), 80 s"]
    terminal = run(Console(file=io.StringIO(), width=100, force_terminal=True))
    assert "gsm8k: 2/20" not in terminal and "gsm8k" in terminal


def test_eval_py_writes_progress_lines_into_a_log(tmp_path):
    """eval.py with its output piped (not a terminal): the progress of each benchmark is in the
    output as it goes, not only the bars rich draws once at the end."""
    result = run_script("eval.py", "--model", "toy:model", "--benchmarks", "toy:easy:heldout", "--limit", "2",
                        "--samples", "1", "--batch-size", "1", "--max-new-tokens", "8", "--speedup-batches", "0",
                        "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    for line in ("toy:easy:heldout: 0/2 (0%), ", "toy:easy:heldout: 1/2 (50%), ", "toy:easy:heldout: 2/2 (100%), "):
        assert line in result.stdout


def test_a_users_reward_file_rescores_by_name(tmp_path, registry):
    user_rewards = reward_file(tmp_path, "short_and_correct", shorter_than=20)
    samples = tmp_path / "samples.jsonl"
    lines = [{"benchmark": "b", "id": "1", "answer": "204", "response": r"\boxed{204}", "correct": True},
             {"benchmark": "b", "id": "1", "answer": "204", "response": "a long way round... Final Answer: 204",
              "correct": True},
             {"benchmark": "b", "id": "1", "answer": "204", "response": r"\boxed{5}", "correct": False}]
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reports = eval_script.main(["--rescore", str(samples), "--reward-file", str(user_rewards),
                                "--reward", "accuracy:1,short_and_correct:0.5"])
    assert reports["b"]["histogram"] == {"-1": 1, "1": 1, "1.5": 1}
    assert reports["b"]["components"] == {"accuracy": pytest.approx(1 / 3), "short_and_correct": pytest.approx(1 / 3)}


def write_summary(path: Path, model: str, benchmarks: dict) -> str:
    path.write_text(json.dumps({"model": model, "benchmarks": benchmarks}))
    return str(path)


def test_compare_prints_both_runs_and_their_differences(tmp_path, capsys):
    a = write_summary(tmp_path / "a.json", "base", {"gsm8k": {"accuracy": 0.5, "parallel_ratio": 0.0, "speedup": None}})
    b = write_summary(tmp_path / "b.json", "trained", {"gsm8k": {"accuracy": 0.625, "parallel_ratio": 0.25},
                                                       "aime24": {"accuracy": 0.1}})
    rows = eval_script.main(["--compare", a, b])
    assert rows[("gsm8k", "accuracy")] == {"a": 0.5, "b": 0.625, "difference": pytest.approx(0.125)}
    assert rows[("gsm8k", "parallel_ratio")]["difference"] == pytest.approx(0.25)
    assert rows[("aime24", "accuracy")] == {"a": None, "b": 0.1, "difference": None}
    assert ("gsm8k", "speedup") not in rows  # absent on both sides
    shown = capsys.readouterr().out
    assert "A: base" in shown and "B: trained" in shown and "+12.5%" in shown and "+25.0%" in shown
    assert "±" not in shown  # no per-problem accuracies: no error of the difference to give
    # with them, the accuracy's difference carries the standard error of the per-problem
    # differences: 0.5, 0, 0, 0 -> sample sd 0.25, over sqrt(4)
    a = write_summary(tmp_path / "a.json", "base", {"gsm8k": {"accuracy": 0.25, "per_problem": {
        "g/1": 0.5, "g/2": 0.5, "g/3": 0.0, "g/4": 0.0}}})
    b = write_summary(tmp_path / "b.json", "trained", {"gsm8k": {"accuracy": 0.375, "per_problem": {
        "g/1": 1.0, "g/2": 0.5, "g/3": 0.0, "g/4": 0.0}}})
    rows = eval_script.main(["--compare", a, b])
    assert rows[("gsm8k", "accuracy")]["difference_se"] == pytest.approx(0.125)
    assert "+12.5% ± 12.5%" in capsys.readouterr().out


def test_every_config_field_has_a_comment():
    comments = field_comments(eval_script.EvalConfig)
    assert {f.name for f in dataclasses.fields(eval_script.EvalConfig)} <= set(comments)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "toy:model", "--benchmarks", "gsm8k,nope.jsonl"],
         "benchmark or file not found: nope.jsonl (known benchmarks: gsm8k"),
        (["--model", "toy:model", "--benchmarks", "{fields}"], "{fields}:1: no question/problem/prompt field (fields there: query, solution)"),
        (["--model", "toy:model", "--benchmarks", "{fields}", "--question-field", "query"],
         "{fields}:1: no answer field (fields there: query, solution)"),
        (["--model", "toy:model", "--samples", "2", "--pass-k", "4"], "--pass-k must be between 1 and --samples (2)"),
        (["--model", "toy:model", "--paths", "1"], "paths per block must be between 2 and 8, got 1"),
        (["--model", "toy:model", "--instructions", "parallell"], "unknown instructions 'parallell'"),
        (["--benchmarks", "aime24"], "no model at runs/default/4-rl-hard/final: run `python train.py` first"),
        (["--rescore", "{missing}"], "file not found: {missing}"),
        (["--rescore", "{samples}", "--reward", "acuracy"], "unknown reward 'acuracy'; known: accuracy"),
        (["--rescore", "{samples}"], "{samples}:1: no answer field"),
        (["--rescore", "{samples}", "--reward-file", "{missing}"], "reward file not found: {missing}"),
        (["--compare", "{missing}"], "--compare takes two summary.json files, got 1"),
        (["--compare", "{missing}", "{missing}"], "summary not found: {missing}"),
        (["--compare", "{samples}", "{samples}"], "{samples}: not an eval.py summary.json (no benchmarks)"),
    ],
)
def test_bad_input_is_one_line_naming_what_is_missing(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/default/ here
    names = {"fields": str(tmp_path / "set.jsonl"), "missing": str(tmp_path / "missing.jsonl"),
             "samples": str(tmp_path / "samples.jsonl")}
    (tmp_path / "set.jsonl").write_text(json.dumps({"query": "1+1?", "solution": "2"}) + "\n")
    (tmp_path / "samples.jsonl").write_text(json.dumps({"id": "a", "response": "Final Answer: 2"}) + "\n" * 2)
    with pytest.raises(NanoparError) as error:
        eval_script.main([arg.format(**names) for arg in args] + ["--out", str(tmp_path / "out")])
    assert one_line(error).startswith(message.format(**names))
    assert not (tmp_path / "out").exists()  # nothing written, no model loaded


def test_the_script_prints_an_error_as_one_line():
    result = run_script("eval.py", "--model", "toy:model", "--benchmarks", "missing.jsonl")
    assert result.returncode == 1
    assert result.stderr == ("error: benchmark or file not found: missing.jsonl "
                             "(known benchmarks: gsm8k, gsm8k_train, math500, aime24, aime25, amc23, dapo, "
                             "parallel-gsm8k, parallel-gsm8k:heldout)\n")


def test_each_benchmark_is_prompted_as_its_source_words_the_instructions(tmp_path):
    """--instructions parallel: the toy's problems get the toy's marker, a math set the English
    instructions (the toy model never saw those)."""
    out = tmp_path / "eval"
    eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout,aime24", "--limit", "1",
                      "--samples", "1", "--max-new-tokens", "4", "--speedup-batches", "0", "--instructions", "parallel",
                      "--out", str(out)])
    prompts = {r["benchmark"]: r["prompt"] for r in read_jsonl(out / "samples.jsonl")}
    assert prompts["toy:easy:heldout"].startswith("in parallel\n\nnumbers")
    assert prompts["aime24"].startswith("Work through the problem below")


def test_out_of_memory_while_evaluating_is_one_line_naming_the_batch_that_fits(tmp_path, monkeypatch):
    import torch

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB.  See documentation for Memory")

    monkeypatch.setattr(eval_script, "evaluate", no_room)
    with pytest.raises(NanoparError) as error:
        eval_script.main(["--model", "toy:model", "--benchmarks", "toy:easy:heldout", "--limit", "2", "--samples", "4",
                          "--batch-size", "8", "--out", str(tmp_path)])
    assert one_line(error) == ("out of memory evaluating toy:easy:heldout, sampling: CUDA out of memory. Tried to "
                               "allocate 1.50 GiB. -> --batch-size 4 (8 problems x 4 samples a sampler call now); "
                               "docs/gpu.md, Out of memory")
