"""Data and prompts: shipped benchmarks, the field mapping, every bad-input error, atomic JSONL,
and prompts rendered by the real (offline) Qwen tokenizer and by the toy character tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from conftest import one_line
from nanopar import NanoparError
from nanopar.data import (BENCHMARK_DIR, BENCHMARKS, Problem, load_problems, load_traces, read_json, read_jsonl,
                          write_json, write_jsonl)
from nanopar.grading import Reading, read_answer
from nanopar.prompts import (
    ANSWER_INSTRUCTIONS,
    INSTRUCTIONS,
    PARALLEL_INSTRUCTIONS,
    PLAIN_INSTRUCTIONS,
    build_prompt,
    instructions_named,
    parallel_instructions,
    stop_ids,
)
from nanopar.tags import NPR, PARALLEL_R1, TagIds, TagSchema

ROWS = {"gsm8k": 1319, "gsm8k_train": 7473, "math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "dapo": 17917,
        "parallel-gsm8k": 300, "parallel-gsm8k:heldout": 41}


# --------------------------------------------------------------------------- shipped benchmarks


@pytest.mark.parametrize("name", sorted(ROWS))
def test_shipped_benchmark_rows(name):
    problems = load_problems(name)
    assert len(problems) == ROWS[name]
    assert all(p.question.strip() and p.answer.strip() for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    assert all(p.source == name for p in problems)


def test_benchmarks_table_matches_the_shipped_files():
    assert set(BENCHMARKS) == set(ROWS)
    for file, _, _ in BENCHMARKS.values():
        assert (BENCHMARK_DIR / file.partition("[")[0]).is_file()  # a name may be a fixed slice of a file
    assert sorted(p.name for p in (BENCHMARK_DIR / "licenses").iterdir()) == [
        "gsm8k-MIT.txt", "native-parallel-reasoner-MIT.txt", "parallel-r1-MIT.txt",
        "qwen2.5-math-evaluation-MIT.txt",
    ]


def test_ids_extra_and_limit():
    math = load_problems("math500", limit=3)
    assert len(math) == 3
    assert math[0].id == "test/precalculus/807.json"  # the record's own unique_id
    assert set(math[0].extra) == {"solution", "subject", "level"}  # question/answer/id are not repeated
    aime = load_problems("aime25", limit=2)
    assert [p.id for p in aime] == ["aime25:1", "aime25:2"] and aime[0].answer == "70" and aime[0].extra == {}
    gsm = load_problems("gsm8k", limit=1)[0]
    assert gsm.question.startswith("Janet") and gsm.answer.rstrip().endswith("#### 18")
    assert load_problems("amc23", limit=0) == []
    with pytest.raises(NanoparError, match="limit"):
        load_problems("amc23", limit=-1)


# --------------------------------------------------------------------------- files and field mapping


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_jsonl_file_default_and_named_fields(tmp_path):
    path = write_lines(tmp_path / "set.jsonl", [
        json.dumps({"prompt": "What is 2+2?", "answer": 4, "level": 1}),
        "",  # blank lines are allowed
        json.dumps({"prompt": "What is 3+3?", "answer": "6", "id": 17}),
    ])
    problems = load_problems(str(path))
    assert problems == [
        Problem("set:1", "What is 2+2?", "4", str(path), {"level": 1}),  # a number answer becomes text
        Problem("17", "What is 3+3?", "6", str(path), {}),
    ]
    mapped = write_lines(tmp_path / "mapped.jsonl", [json.dumps({"q": "Q?", "gold": "A", "answer": "x"})])
    (problem,) = load_problems(str(mapped), question_field="q", answer_field="gold")
    assert (problem.question, problem.answer, problem.extra) == ("Q?", "A", {"answer": "x"})
    (no_answer,) = load_problems(str(mapped), question_field="q", answer_field="")  # prompts only
    assert no_answer.answer == "" and no_answer.extra == {"gold": "A", "answer": "x"}


def test_question_field_order(tmp_path):
    path = write_lines(tmp_path / "order.jsonl", [json.dumps({"prompt": "c", "problem": "b", "question": "a", "answer": "0"})])
    assert load_problems(str(path))[0].question == "a"  # question, then problem, then prompt


def test_text_file_is_questions_only(tmp_path):
    path = write_lines(tmp_path / "prompts.txt", ["What is 17 * 23?", "", "Name a prime."])
    problems = load_problems(str(path))
    assert [(p.id, p.question, p.answer) for p in problems] == [
        ("prompts:1", "What is 17 * 23?", ""), ("prompts:3", "Name a prime.", "")
    ]


def test_missing_field_names_it_and_lists_the_present_ones(tmp_path):
    path = write_lines(tmp_path / "set.jsonl", [
        json.dumps({"problem": "ok", "answer": "1"}),
        json.dumps({"problem": "no answer here", "solution": "2", "level": 3}),
    ])
    with pytest.raises(NanoparError) as error:
        load_problems(str(path))
    assert one_line(error) == f"{path}:2: no answer field (fields there: problem, solution, level)"
    with pytest.raises(NanoparError) as error:
        load_problems(str(path), question_field="query")
    assert one_line(error) == f"{path}:1: no query field (fields there: problem, answer)"
    nothing = write_lines(tmp_path / "nothing.jsonl", [json.dumps({"text": "x", "answer": "1"})])
    with pytest.raises(NanoparError) as error:
        load_problems(str(nothing))
    assert one_line(error) == f"{nothing}:1: no question/problem/prompt field (fields there: text, answer)"
    with pytest.raises(NanoparError, match="no foo field .*fields there: question, answer"):
        load_problems("gsm8k", answer_field="foo")  # a shipped set maps fields the same way


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"problem": "x", "answer": ', r":2: not valid JSON \(Expecting value"),
        ('["problem", "answer"]', r":2: not a JSON object \(a list\)"),
        ('{"problem": ["a", "list"], "answer": "1"}', r":2: field problem is a list, not text"),
        ('{"problem": "x", "answer": "1", "id": "a"}', r":2: id a repeats the id of .*:1"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", ['{"problem": "x", "answer": "1", "id": "a"}', line, "{}"])
    with pytest.raises(NanoparError) as error:
        load_problems(str(path))
    assert one_line(error).startswith(str(path))
    assert error.match(message)
    if "JSON" in message:  # read_jsonl has the same rules
        with pytest.raises(NanoparError, match=f"^{str(path)}{message}"):
            read_jsonl(path)


def test_missing_file_or_unknown_name(tmp_path):
    for spec in ("gsm8K", str(tmp_path / "nope.jsonl"), "data/nope.jsonl", str(tmp_path)):
        with pytest.raises(NanoparError) as error:
            load_problems(spec)
        assert one_line(error) == (
            f"benchmark or file not found: {spec} (known benchmarks: gsm8k, gsm8k_train, math500, aime24, aime25, amc23, dapo, "
            "parallel-gsm8k, parallel-gsm8k:heldout)"
        )
    (tmp_path / "set.json").write_text("{}")
    with pytest.raises(NanoparError, match="unsupported file type"):
        load_problems(str(tmp_path / "set.json"))
    with pytest.raises(NanoparError, match="^file not found: "):
        read_jsonl(tmp_path / "nope.jsonl")


def test_a_mix_interleaves_its_sets_and_a_bad_mix_is_a_one_line_error(tmp_path):
    """"a+b": a, b, a, b, ..., then the longer set's rest, so any first N hold each set alike
    (NPR's stages read a mix of difficulties; a distill stage samples the first N)."""
    mixed = load_problems("aime24[:3]+amc23[:1]")
    assert [p.id for p in mixed] == ["aime24:1", "amc23:1", "aime24:2", "aime24:3"]
    assert [p.id for p in load_problems("aime24+amc23", limit=3)] == ["aime24:1", "amc23:1", "aime24:2"]
    toy = load_problems("toy:easy+toy:hard")
    assert len(toy) == 40_000 and [p.source for p in toy[:4]] == ["toy-easy", "toy-hard"] * 2
    plus = write_lines(tmp_path / "a+b.jsonl", [json.dumps({"question": "q", "answer": "1"})])
    assert len(load_problems(str(plus))) == 1  # a file whose name holds "+" is that file
    for bad in ("toy:easy+", "+toy:hard", "toy:easy++toy:hard"):
        with pytest.raises(NanoparError) as error:
            load_problems(bad)
        assert one_line(error) == f"bad data mix {bad!r}: write data sets joined by '+', e.g. toy:easy+toy:hard"
    with pytest.raises(NanoparError, match="in two parts of the mix"):
        load_problems("aime24+aime24[:2]")


def test_importing_nanopar_data_does_not_import_datasets():
    code = "import sys, nanopar.data, nanopar.prompts; assert 'datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hub_name_offline_is_a_one_line_error(tmp_path):
    # A fresh process with the offline flags set before `datasets` / `huggingface_hub` are
    # imported (both read them once at import), and an empty cache: no network, no retries.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from nanopar import NanoparError\n"
        "from nanopar.data import load_problems\n"
        "try:\n"
        "    load_problems('nanopar-test/no-such-set', split='test')\n"
        "except NanoparError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert "\n" not in message
    assert message.startswith("could not load the hub data set nanopar-test/no-such-set (split test): ")


# --------------------------------------------------------------------------- SFT traces


def test_load_traces_reads_a_jsonl_file_and_names_the_bad_line(tmp_path):
    records = [{"id": "a", "question": "q", "answer": "1", "response": "r"}, {"question": "q2", "response": "r2"}]
    path = write_jsonl(tmp_path / "traces.jsonl", records)
    assert load_traces(path) == records and load_traces(str(path)) == records
    bad = write_lines(tmp_path / "bad.jsonl", [json.dumps(records[0]), "", '{"question": "q", "response": 3}'])
    with pytest.raises(NanoparError) as error:
        load_traces(bad)
    assert one_line(error) == f"{bad}:3: a trace needs string fields question and response"  # the file's line
    with pytest.raises(NanoparError) as error:
        load_traces(str(tmp_path / "nope.jsonl"))
    assert one_line(error) == f"traces not found: {tmp_path / 'nope.jsonl'}"


@pytest.mark.parametrize("schema, other", [(PARALLEL_R1, NPR), (NPR, PARALLEL_R1)], ids=["parallel-r1", "npr"])
def test_the_cold_start_traces_of_a_run_are_judged_in_its_schema(schema, other, tmp_path):
    """RunInputs.check_traces: traces in the other schema are a one-line error that names it; a mix
    gives the count of those that are not valid parallel traces; pretraining's are not judged."""
    from nanopar.curriculum import TrainConfig, recipe
    from nanopar.defaults import resolve
    from nanopar.run_inputs import RunInputs

    def stages_and_inputs(recipe_name, sft_data):
        config = TrainConfig(recipe=recipe_name, schema=schema.name, sft_data=sft_data)
        resolve(config, ["--recipe", "--schema", "--sft-data"])
        stages = recipe(config)
        return {s.name: s for s in stages}, RunInputs(config, stages, schema)

    mine = load_traces("toy:parallel", schema)  # the teacher's: 85% parallel, the rest without tags
    parallel = [r for r in mine if schema.block_open in r["response"]]
    sequential = [r for r in mine if "<" not in r["response"]]
    theirs = [r for r in load_traces("toy:parallel", other) if other.block_open in r["response"]][:10]
    wrong = write_jsonl(tmp_path / "other.jsonl", theirs)
    stages, inputs = stages_and_inputs("parallel-r1", str(wrong))
    with pytest.raises(NanoparError) as error:
        inputs.check_traces(stages["sft"])
    reason = "no valid parallel block" if schema is PARALLEL_R1 else "no <guideline> of two or more <plan>"
    assert one_line(error) == (f"sft: none of the 10 traces in {wrong} is a valid parallel trace in the {schema.name} "
                               f"schema (the first: {reason}); they are written in the {other.name} schema "
                               f"(--schema {other.name})")
    mixed = write_jsonl(tmp_path / "mixed.jsonl", sequential[:4] + parallel[:7] + theirs[:2])
    stages, inputs = stages_and_inputs("parallel-r1", str(mixed))
    assert inputs.check_traces(stages["sft"]) == (f"sft: 7 of 13 traces are valid parallel traces in the "
                                                  f"{schema.name} schema; the other 6 train as they are written")
    stages, inputs = stages_and_inputs("parallel-r1", "toy:parallel")
    assert inputs.check_traces(stages["sft"]) == (f"sft: {len(mine) - len(sequential)} of {len(mine)} traces are "
                                                  f"valid parallel traces in the {schema.name} schema; the other "
                                                  f"{len(sequential)} train as they are written")
    stages, inputs = stages_and_inputs("npr", "")
    assert stages["pretrain"].traces == "toy:instruct" and inputs.check_traces(stages["pretrain"]) is None  # mostly sequential


def test_a_step_takes_its_items_from_one_seeded_shuffle_per_epoch(tmp_path):
    """RunInputs.batch_of_step, against the rule written out position by position: item p of
    the run is the (p mod n)-th of epoch p // n's shuffle, seeded by the run's seed, the stage and
    the epoch; a step that crosses an epoch takes the end of one shuffle and the start of the
    next; every epoch visits each item once."""
    import random

    from nanopar.curriculum import Stage, TrainConfig
    from nanopar.run_inputs import RunInputs

    items, count, config = [f"trace {i}" for i in range(10)], 4, TrainConfig(seed=7)
    stage = Stage("sft", "sft", "toy:easy")
    inputs = RunInputs(config, [stage], PARALLEL_R1)

    def by_position(p):
        order = list(range(len(items)))
        random.Random(f"7/sft/{p // len(items)}").shuffle(order)
        return items[order[p % len(items)]]

    steps = [inputs.batch_of_step(items, count, stage, step) for step in range(5)]  # 20 positions: 2 epochs
    assert steps == [[by_position(p) for p in range(s * count, (s + 1) * count)] for s in range(5)]
    run = [item for step in steps for item in step]
    assert sorted(run[:10]) == sorted(items) == sorted(run[10:]) and run[:10] != run[10:]


# --------------------------------------------------------------------------- JSON Lines helpers


@dataclass
class Row:
    name: str
    value: float


def test_write_read_round_trip(tmp_path):
    records = [{"a": 1, "text": "Janet’s ducks", "nested": {"x": [1, 2]}}, {}, Row("r", 0.5)]
    path = write_jsonl(tmp_path / "deep" / "out.jsonl", records)  # parent folders are created
    assert path == tmp_path / "deep" / "out.jsonl"
    assert read_jsonl(path) == records[:2] + [{"name": "r", "value": 0.5}]
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3
    assert os.listdir(path.parent) == ["out.jsonl"]  # no temporary file left behind


def test_write_is_atomic(tmp_path):
    path = tmp_path / "out.jsonl"
    with pytest.raises(TypeError, match="record 2 is not JSON-serialisable"):
        write_jsonl(path, [{"ok": 1}, {"bad": {1, 2}}])
    assert not path.exists() and os.listdir(tmp_path) == []  # no partial file, no temporary file
    write_jsonl(path, [{"old": 1}])
    with pytest.raises(TypeError, match="record 3 is a list, not a dict"):
        write_jsonl(path, [{"new": 1}, {"new": 2}, ["not", "a", "record"]])
    assert read_jsonl(path) == [{"old": 1}] and os.listdir(tmp_path) == ["out.jsonl"]

    def records():  # a failure in the middle of a stream of records
        yield {"new": 1}
        raise RuntimeError("generator failed")

    with pytest.raises(RuntimeError):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"old": 1}] and os.listdir(tmp_path) == ["out.jsonl"]


def test_json_writes_are_atomic_and_a_broken_file_is_a_one_line_error(tmp_path):
    """write_json (eval.json, eval.py's summary.json) and save_config (a run's config.json, read
    when it is run again) replace the file in one step: a failure part-way keeps the old one."""
    path = write_json(tmp_path / "eval.json", {"old": [1, 2]})
    with pytest.raises(TypeError):
        write_json(path, {"new": 1, "bad": {1, 2}})
    assert read_json(path) == {"old": [1, 2]} and os.listdir(tmp_path) == ["eval.json"]
    path.write_text('{"old": [1,')  # a file cut short elsewhere
    with pytest.raises(NanoparError, match=r"eval.json: not JSON \(Expecting value: line 1 column 12") as error:
        read_json(path)
    assert "\n" not in str(error.value)
    for text, message in (("[1, 2]", "a JSON list, not an object"), (b"\xff\xfe{", "not JSON")):
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(NanoparError, match=message):
            read_json(path)


KILLED_MID_WRITE = """
import builtins, io, os, signal, sys
from nanopar.config import save_config
from nanopar.curriculum import TrainConfig
real_open = io.open
class HalfThenKilled:  # writes half of what it is given, then the process is killed
    def __init__(self, file): self.file = file
    def write(self, text):
        self.file.write(text[: len(text) // 2]); self.file.flush(); os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name): return getattr(self.file, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.file.close()
def opened(path, mode="r", *args, **kwargs):
    file = real_open(path, mode, *args, **kwargs)
    return HalfThenKilled(file) if "config.json" in str(path) and set(mode) & set("wxa") else file
io.open = builtins.open = opened
save_config(TrainConfig(sft_steps=7), sys.argv[1])
"""


def test_a_config_whose_writer_is_killed_mid_write_is_the_last_whole_one(tmp_path):
    """A run killed while it writes its config.json (save_config; read when it is run again)
    leaves the last whole file, never half of one: here the writing process is killed after half
    of the text went to the file."""
    import subprocess
    import sys
    from nanopar.config import save_config
    from nanopar.curriculum import TrainConfig
    save_config(TrainConfig(sft_steps=3), tmp_path)
    child = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)])
    assert child.returncode == -9  # killed in the write, as planned
    assert read_json(tmp_path / "config.json")["sft_steps"] == 3


# --------------------------------------------------------------------------- prompts


def test_parallel_instructions_use_the_schema():
    for tag in PARALLEL_R1.all():
        assert tag in PARALLEL_INSTRUCTIONS
    assert PARALLEL_INSTRUCTIONS.rstrip().endswith("Final Answer: \\boxed{<your answer>}")
    assert PLAIN_INSTRUCTIONS.rstrip().endswith("Final Answer: \\boxed{<your answer>}") and "<Path>" not in PLAIN_INSTRUCTIONS
    other = TagSchema("custom", "<fork>", "</fork>", "<branch>", "</branch>", "<join>", "</join>")
    text = parallel_instructions(other)
    assert all(tag in text for tag in other.all()) and not any(tag in text for tag in PARALLEL_R1.all())
    assert (PARALLEL_INSTRUCTIONS + PLAIN_INSTRUCTIONS + ANSWER_INSTRUCTIONS).isascii()  # the char tokenizer reads them


def does_what_it_asks(instructions: str) -> str:
    """The response of a model that does exactly what the last line of `instructions` asks, with
    42 as its answer."""
    last = instructions.rstrip().splitlines()[-1]
    return "48 - 6 = 42.\n" + last.replace("<your answer>", "42").replace("\\boxed{}", "\\boxed{42}")


@pytest.mark.parametrize("schema", [PARALLEL_R1, NPR], ids=lambda s: s.name)
@pytest.mark.parametrize("name", ["parallel", "plain", "answer"])
def test_every_instruction_set_ends_asking_for_an_answer_the_strict_grader_reads(name, schema):
    """Parallel-R1's (a Final Answer line), NPR's (a box) and the plain and answer sets all end by
    asking for the answer in a box: a model that does what they ask is read by the strict reading."""
    text = instructions_named(name, "gsm8k", schema)
    assert "\\boxed{" in text.rstrip().splitlines()[-1]
    assert read_answer(does_what_it_asks(text)) == Reading("42", "boxed")
    assert text == INSTRUCTIONS[name] or (name == "parallel" and text == parallel_instructions(schema))
    assert instructions_named("none", "gsm8k", schema) == ""  # "none" is the bare question: nothing asked


@pytest.mark.parametrize("recipe", ["parallel-r1", "npr"])
@pytest.mark.parametrize("flag", ["answer", "parallel"])
def test_every_stage_of_each_recipe_asks_a_real_model_for_a_boxed_answer(recipe, flag):
    """Real data (the stages prompt as `Runner.prompt` does: the stage's data source words the
    instructions): every stage, baseline and cold start included, asks for the boxed answer. The
    toy keeps its own prompts: its marker or nothing, never English its model cannot read."""
    from nanopar.curriculum import TrainConfig, recipe as stages_of
    from nanopar.defaults import resolve
    from nanopar.tags import schema_named

    def resolved(**flags) -> TrainConfig:  # as train.py resolves a command line that gives these flags
        config = TrainConfig(**flags)
        resolve(config, ["--" + name.replace("_", "-") for name in flags])
        return config

    real = resolved(recipe=recipe, instructions=flag, baseline=True, model="Qwen/Qwen2.5-1.5B-Instruct",
                    easy_data="gsm8k_train", hard_data="math500", sft_data="", pretrain_data="auto")
    stages = stages_of(real)
    assert {s.name for s in stages} >= {"rl-hard" if recipe == "parallel-r1" else "parallel-rl", "baseline-rl-easy"}
    for stage in stages:
        text = instructions_named(stage.instructions, stage.data or stage.traces, schema_named(real.schema))
        assert read_answer(does_what_it_asks(text)) == Reading("42", "boxed"), stage.name
    toy = resolved(recipe=recipe, instructions=flag, baseline=True)
    for stage in stages_of(toy):
        text = instructions_named(stage.instructions, stage.data or stage.traces, schema_named(toy.schema))
        assert text in ("", "in parallel"), stage.name


def test_the_answer_request_goes_into_the_chat_template_of_a_saved_checkpoint(qwen_tokenizer, tmp_path):
    """A checkpoint saves its tokenizer (model.save_checkpoint_model) and loads it back with
    AutoTokenizer: the chat template survives, so a trained Qwen is still prompted in chat form."""
    from transformers import AutoTokenizer

    qwen_tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.chat_template == qwen_tokenizer.chat_template
    problem = load_problems("gsm8k", limit=1)[0]
    text = tokenizer.decode(build_prompt(problem, tokenizer, instructions_named("answer", "gsm8k")))
    assert text == (f"<|im_start|>user\n{ANSWER_INSTRUCTIONS}\n\n{problem.question}<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_build_prompt_qwen_chat(qwen_tokenizer):
    tokenizer, tag_ids = qwen_tokenizer, TagIds.from_tokenizer(qwen_tokenizer)
    problem = load_problems("aime24", limit=1)[0]
    ids = build_prompt(problem, tokenizer)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\n" + PARALLEL_INSTRUCTIONS + "\n\n" + problem.question)
    assert text.endswith(problem.question + "<|im_end|>\n<|im_start|>assistant\n")
    assert ids[-3:] == tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[0] == 151644  # <|im_start|>, a single token
    assert tag_ids.all() == tuple(range(151669, 151675))
    for tag_id in tag_ids.all():  # each tag is one token in the prompt, not split into pieces
        assert tag_id in ids
    with_system = tokenizer.decode(build_prompt("2+2?", tokenizer, PLAIN_INSTRUCTIONS, system="Be brief."))
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + PLAIN_INSTRUCTIONS)
    plain = build_prompt("2+2?", tokenizer, instructions="", chat=False)  # chat=False: plain text even here
    assert tokenizer.decode(plain) == "2+2?\n"


def test_build_prompt_char_tokenizer_is_plain_text():
    from nanopar.tiny import char_tokenizer

    tokenizer = char_tokenizer()
    problem = Problem("t:1", "What is 2+3?", "5")
    ids = build_prompt(problem, tokenizer)  # no chat template: the plain form
    assert tokenizer.decode(ids) == PARALLEL_INSTRUCTIONS + "\n\nWhat is 2+3?\n"
    assert len(ids) == len(PARALLEL_INSTRUCTIONS) + len("\n\nWhat is 2+3?\n")  # one token per character
    assert tokenizer.unk_token_id not in ids


def test_the_plain_form_starts_with_the_bos_a_tokenizer_adds():
    """Gemma's and Llama's tokenizers add a BOS; without a chat template the prompt must carry it
    (Gemma-3 270M without it: "<h2><h2>..." for every question; docs/real-checkpoint.md)."""
    from tokenizers.processors import TemplateProcessing

    from nanopar.tiny import char_tokenizer

    tokenizer = char_tokenizer()
    assert build_prompt("2+3?", tokenizer, instructions="") == tokenizer.encode("2+3?\n")  # adds none: no BOS
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="<bos> $A",
                                                                    special_tokens=[("<bos>", tokenizer.bos_token_id)])
    ids = build_prompt("2+3?", tokenizer, instructions="")
    assert ids == tokenizer.encode("2+3?\n") and ids[0] == tokenizer.bos_token_id and ids.count(ids[0]) == 1
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert build_prompt("2+3?", tokenizer, instructions="").count(tokenizer.bos_token_id) == 1  # the template's


def test_stop_ids(qwen_tokenizer):
    from nanopar.tiny import char_tokenizer

    tokenizer = qwen_tokenizer
    assert stop_ids(None, tokenizer) == [151645]  # <|im_end|>: the tokenizer's EOS
    base = type("Model", (), {"generation_config": type("Config", (), {"eos_token_id": 151643})()})()
    assert stop_ids(base, tokenizer) == [151643, 151645]  # + the model's <|endoftext|>
    instruct = type("Model", (), {"generation_config": type("Config", (), {"eos_token_id": [151645, 151643]})()})()
    assert stop_ids(instruct, tokenizer) == [151643, 151645]
    assert stop_ids(None, char_tokenizer()) == [0]


def test_hub_rows_map_like_file_records(monkeypatch):
    """The hub path without the hub: a stand-in `datasets` module returns rows (plain dicts)."""
    import types

    class Rows(list):  # what load_dataset(..., split=...) returns, as far as data.py uses it
        def select(self, indices):
            return Rows(self[i] for i in indices)

    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return Rows([{"question": "Q1", "answer": "1", "n": 1}, {"question": "Q2", "answer": 2}, {"oops": 3}])

    fake = types.SimpleNamespace(load_dataset=load_dataset, exceptions=types.SimpleNamespace(DatasetsError=RuntimeError))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    problems = load_problems("someone/some-set:main", split="test", limit=2)
    assert calls == [("someone/some-set", "main", "test")]
    assert problems == [
        Problem("someone/some-set:main:1", "Q1", "1", "someone/some-set:main[test]", {"n": 1}),
        Problem("someone/some-set:main:2", "Q2", "2", "someone/some-set:main[test]", {}),
    ]
    with pytest.raises(NanoparError) as error:
        load_problems("someone/some-set")
    assert one_line(error) == (
        "someone/some-set (train split) row 3: no question/problem/prompt field (fields there: oops)"
    )
