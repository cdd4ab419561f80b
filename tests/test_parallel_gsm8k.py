"""Parallel-R1's cold-start traces, shipped: the named sets load as traces and as problems, the
held-out slice is fixed and never trained on, the format judge's count agrees with a count written
independently here, and a real model without --teacher cold-starts on them. No model is loaded."""

import json
import re
from fnmatch import fnmatch
from pathlib import Path

import eval as eval_script
import train
from nanopar.config import parse_config
from nanopar.curriculum import recipe
from nanopar.data import BENCHMARK_DIR, heldout_set_of, load_problems, load_traces
from nanopar.format import check_parallel
from nanopar.run_inputs import RunInputs
from nanopar.tags import PARALLEL_R1

FILE = BENCHMARK_DIR / "parallel_gsm8k_sft.jsonl"
TRAIN, HELDOUT = "parallel-gsm8k", "parallel-gsm8k:heldout"


def file_records() -> list[dict]:
    """Every line of the shipped file, read here without nanopar's loader."""
    return [json.loads(line) for line in FILE.read_text(encoding="utf-8").split("\n") if line.strip()]


def real_model(tmp_path) -> str:
    (tmp_path / "config.json").write_text("{}")  # a local model folder: a real model's defaults
    return str(tmp_path)


def test_the_named_sets_load_as_traces_and_as_problems():
    for name, count in ((TRAIN, 300), (HELDOUT, 41)):
        traces = load_traces(name)
        assert len(traces) == count and all(set(r) >= {"question", "answer", "response"} for r in traces)
        problems = load_problems(name)
        assert [p.question for p in problems] == [r["question"] for r in traces]
        assert [p.answer for p in problems] == [r["answer"] for r in traces]  # integers, as text
        assert all(p.source == name and p.extra["response"] for p in problems)
    assert [p.id for p in load_problems(HELDOUT)][::40] == ["parallel-gsm8k:heldout:301", "parallel-gsm8k:heldout:341"]
    config = parse_config(eval_script.EvalConfig, ["--benchmarks", HELDOUT])
    assert len(eval_script.load_benchmark(HELDOUT, config)) == 41  # eval.py --benchmarks (train.py: --eval-data)


def test_the_heldout_slice_is_the_files_last_41_and_shares_no_question_with_training():
    records = file_records()
    train_questions = [r["question"] for r in load_traces(TRAIN)]
    heldout_questions = [r["question"] for r in load_traces(HELDOUT)]
    assert len(records) == 341 == len(train_questions) + len(heldout_questions)
    assert train_questions == [r["question"] for r in records[:300]]
    assert heldout_questions == [r["question"] for r in records[300:]]
    assert not set(train_questions) & set(heldout_questions)
    # pinned: a change of the file or of the split shows here
    assert train_questions[0].startswith("Frankie's parents let him have many pets.")
    assert train_questions[-1].startswith("10 boxes each contain 50 bottles of water.")
    assert heldout_questions[0].startswith("If Tony normally has a temperature of 95 degrees")
    assert heldout_questions[-1].startswith("John wants to finish a show in 5 days.")


def test_a_run_on_the_training_name_never_reads_a_heldout_record(tmp_path):
    """Its cold-start traces, and its problems when it is --easy-data, whose held-out set is the slice."""
    assert heldout_set_of(TRAIN) == HELDOUT
    config = train.resolved_config(["--model", real_model(tmp_path), "--easy-data", TRAIN])[0]
    assert config.sft_data == TRAIN and config.eval_data.split(",")[0] == HELDOUT
    stages = recipe(config)
    inputs = RunInputs(config, stages, PARALLEL_R1)
    heldout = {r["question"] for r in file_records()[300:]}
    trained = [r["question"] for r in inputs.traces(stages[0])] + [p.question for p in inputs.problems(TRAIN)]
    assert len(trained) == 600 and not heldout & set(trained)
    assert {p.question for p in inputs.eval_problems(HELDOUT)} == heldout


def test_a_structured_cold_start_trains_the_tags_as_the_sampler_writes_them(tmp_path, qwen_tokenizer):
    """The traces put newlines between a block's tags; the structured sampler writes them back to
    back (it inserts <Path> after <Parallel>, </Parallel><Summary> after the last path). So the
    structured SFT examples hold, token for token, each inserted tag right after the one that
    triggers it (in the traces whose gaps there hold only whitespace: all but 2, which write a
    word before a block's first path, kept as shared text), and nothing else changes: the text
    with the tags' whitespace removed is the trace's own. A causal stage (the model writes every
    tag) trains the trace as written."""
    config = train.resolved_config(["--model", real_model(tmp_path)])[0]
    stages = recipe(config)
    inputs = RunInputs(config, stages, PARALLEL_R1)
    ids = {tag: qwen_tokenizer.convert_tokens_to_ids(tag) for tag in LETTER}
    follows = {ids["<Parallel>"]: {ids["<Path>"]}, ids["</Parallel>"]: {ids["<Summary>"]},
               ids["</Path>"]: {ids["<Path>"], ids["</Parallel>"]}}
    records = inputs.traces(stages[0])
    examples = [inputs.sft_example(r, stages[0], qwen_tokenizer) for r in records]
    assert stages[0].mode == "structured" and len(records) == 300
    gap = re.compile(r"(?:<Parallel>|</Path>|</Parallel>)(.*?)(?=<Path>|</Parallel>|<Summary>)", re.S)
    spaced = [not any(g.strip() for g in gap.findall(r["response"])) for r in records]
    assert sum(spaced) == 298
    for (_, response), record, only_space in zip(examples, records, spaced):
        assert not only_space or all(b in follows[a] for a, b in zip(response, response[1:]) if a in follows)
        text = qwen_tokenizer.decode(response[:-1])  # less EOS
        squeeze = lambda t: re.sub(r"(</?(?:Parallel|Path|Summary)>)\s+(?=</?(?:Parallel|Path|Summary)>)", r"\1", t)
        assert squeeze(text) == squeeze(record["response"])
    causal = [s for s in recipe(train.resolved_config(["--model", real_model(tmp_path), "--mode", "causal"])[0])
              if s.name == "sft"][0]
    assert inputs.as_trained(records[0]["response"], causal) == records[0]["response"]


TAG = re.compile(r"</?(?:Parallel|Path|Summary)>")
LETTER = {"<Parallel>": "P", "</Parallel>": "p", "<Path>": "A", "</Path>": "a", "<Summary>": "S", "</Summary>": "s"}


def parallel_by_regex(response: str) -> bool:
    """Independent of nanopar.format: the tags, as letters, are one or more blocks of two or more
    paths, each block followed by its summary (text between tags is free)."""
    letters = "".join(LETTER[tag] for tag in TAG.findall(response))
    return re.fullmatch(r"(?:P(?:Aa){2,}pSs)+", letters) is not None


def test_the_judge_passes_the_traces_an_independent_count_passes():
    records = file_records()
    judged = [check_parallel(r["response"], PARALLEL_R1) for r in records]
    assert [c.ok for c in judged] == [parallel_by_regex(r["response"]) for r in records]
    failed = {line: c.reason for line, c in enumerate(judged, 1) if not c.ok}
    assert sum(c.ok for c in judged) == 337
    assert failed == {65: "no valid parallel block", 96: "no valid parallel block", 279: "no valid parallel block",
                      328: "<Summary> is never closed"}  # three sequential traces, one cut inside its summary
    assert not TAG.search("".join(records[line - 1]["response"] for line in (65, 96, 279)))


def test_a_run_says_how_many_of_its_cold_start_traces_are_parallel(tmp_path):
    """Nothing is dropped: the run's check of --sft-data prints the count, and all 300 train."""
    config = train.resolved_config(["--model", real_model(tmp_path)])[0]
    stages = recipe(config)
    inputs = RunInputs(config, stages, PARALLEL_R1)
    assert inputs.check_traces(stages[0]) == ("sft: 297 of 300 traces are valid parallel traces in the "
                                              "parallel-r1 schema; the other 3 train as they are written")
    assert len(inputs.traces(stages[0])) == 300


def test_a_real_model_without_a_teacher_cold_starts_on_them(tmp_path):
    model = real_model(tmp_path)

    def run(*flags):
        config, changed = train.resolved_config(["--model", model, *flags])
        return config.sft_data, changed.get("sft_data"), [(s.name, s.traces, s.teacher) for s in recipe(config)][:2]

    assert run() == (TRAIN, TRAIN, [("sft", TRAIN, ""), ("rl-easy", "", "")])  # resolved, and said so
    teacher = "Qwen/Qwen2.5-7B-Instruct"
    assert run("--teacher", teacher) == ("", "", [("cold-start-data", "", teacher), ("sft", "cold-start-data", "")])
    assert run("--recipe", "npr")[:2] == ("", "")  # NPR rejection-samples its own cold start
    assert run("--recipe", "npr")[2][1] == ("rejection", "", "")
    assert run("--sft-data", "")[2][0][0] == "cold-start-data"  # "" still means: the model distils its own
    assert run("--sft-data", "my.jsonl")[0] == "my.jsonl"  # a flag wins
    assert train.resolved_config([])[0].sft_data == "toy:parallel"  # the toy keeps its teacher


def test_it_is_shipped_with_its_license_and_in_the_package_data():
    assert (BENCHMARK_DIR / "licenses" / "parallel-r1-MIT.txt").is_file()
    assert "parallel_gsm8k_sft.jsonl" in (BENCHMARK_DIR / "README.md").read_text()
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()  # no tomllib on 3.10
    patterns = re.findall(r'"([^"]+)"', re.search(r"^nanopar = \[(.*)\]$", pyproject, re.M)[1])  # its package-data
    assert any(fnmatch("benchmarks/parallel_gsm8k_sft.jsonl", pattern) for pattern in patterns)  # in the wheel
