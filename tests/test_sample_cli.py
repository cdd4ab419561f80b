"""sample.py as a user runs it: a tiny model, prompts from flags and files, --json, bad input."""

import json

import pytest

import sample
from conftest import one_line, run_script
from nanopar import NanoparError
from nanopar.tiny import char_tokenizer
from nanopar.trace import parse_trace


def run(*args):
    return run_script("sample.py", *args)


def test_cli_draws_trees_and_writes_consistent_json(tmp_path):
    out = tmp_path / "out.json"
    result = run("--model", "tiny:qwen3", "--prompt", "12 + 30 =", "--samples", "3", "--max-new-tokens", "48",
                 "--temperature", "1.0", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "prompt 1 · sample 3" in result.stdout and "3 responses" in result.stdout
    records = json.loads(out.read_text())
    assert len(records) == 3
    tokenizer = char_tokenizer()
    for record in records:
        assert record["prompt"] == "12 + 30 =\n" and record["stats"]["new_tokens"] == len(record["ids"])
        assert record["stats"]["sampled_tokens"] == sum(record["sampled"]) <= 48
        blocks = parse_trace(record["text"]).blocks
        assert len(blocks) == len(record["structure"]["blocks"]) == record["stats"]["forks"]
        assert len(record["ids"]) == len(record["logprobs"]) == len(record["sampled"])
    assert len(tokenizer.encode("12 + 30 =", add_special_tokens=False)) == 9  # char-level: one token per char


def test_prompts_from_text_and_jsonl_files(tmp_path):
    (tmp_path / "p.txt").write_text("1+1=\n\n2+2=\n")
    (tmp_path / "p.jsonl").write_text('{"problem": "3+3="}\n{"question": "4+4=", "answer": "8"}\n')
    for name, expected in (("p.txt", ["1+1=\n", "2+2=\n"]), ("p.jsonl", ["3+3=\n", "4+4=\n"])):
        records = sample.main(["--model", "tiny:qwen2", "--prompts-file", str(tmp_path / name),
                               "--max-new-tokens", "8", "--json", str(tmp_path / "o.json")])
        assert [r["prompt"] for r in records] == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "tiny:qwen3", "--prompts-file", "missing.jsonl"], "benchmark or file not found: missing.jsonl (known benchmarks: gsm8k"),
        (["--model", "tiny:qwen4", "--prompt", "x"], "unknown tiny model 'tiny:qwen4': use tiny:qwen2, tiny:qwen3 or toy:model"),
        (["--prompt", "x"], "--model is required"),
        (["--model", "tiny:qwen3", "--prompt", "x", "--paths", "1"], "paths per block must be between 2 and 8, got 1"),
        (["--model", "tiny:qwen3", "--prompt", "x", "--mode", "seen"], "unknown attention mode 'seen'"),
        (["--model", "tiny:qwen3", "--prompt", "x", "--schema", "multiverse"], "unknown tag schema 'multiverse': use one of parallel-r1, npr"),
    ],
)
def test_bad_input_is_a_clear_error(args, message):
    with pytest.raises(NanoparError) as error:
        sample.main(args)
    assert one_line(error).startswith(message)


def test_the_script_prints_an_error_as_one_line():
    result = run("--model", "tiny:qwen3", "--prompt", "x", "--paths", "1")
    assert result.returncode == 1 and result.stderr == "error: paths per block must be between 2 and 8, got 1\n"


def test_broken_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "3+3="}\n{"problem": \n')
    with pytest.raises(Exception, match=r"p.jsonl:2: not valid JSON"):
        sample.main(["--model", "tiny:qwen3", "--prompts-file", str(path)])
    path.write_text('{"text": "3+3="}\n')
    with pytest.raises(Exception, match=r"p.jsonl:1: no question/problem/prompt field"):
        sample.main(["--model", "tiny:qwen3", "--prompts-file", str(path)])


def test_an_empty_prompts_file_is_named(tmp_path):
    (tmp_path / "p.txt").write_text("\n")
    with pytest.raises(NanoparError) as error:
        sample.main(["--model", "tiny:qwen3", "--prompts-file", str(tmp_path / "p.txt")])
    assert one_line(error) == f"no prompts in {tmp_path / 'p.txt'}"


def test_unknown_flag_is_refused():
    result = run("--model", "tiny:qwen3", "--promt", "x")
    assert result.returncode == 2 and "unrecognized arguments: --promt" in result.stderr


def test_npr_schema_samples_in_npr_tags(tmp_path):
    """--schema npr: NPR's eight tags are single tokens of the model, and a record's structure is
    its text read with NPR's schema."""
    from nanopar.tags import NPR

    records = sample.main(["--model", "tiny:qwen3", "--schema", "npr", "--prompt", "2+2?", "--samples", "4",
                           "--max-new-tokens", "40", "--temperature", "1.0", "--json", str(tmp_path / "o.json")])
    tokenizer = char_tokenizer()
    before = len(tokenizer)
    for record in records:
        blocks = parse_trace(record["text"], NPR).blocks
        assert len(blocks) == len(record["structure"]["blocks"]) == record["stats"]["forks"]
        assert all(i < before + len(NPR.all()) for i in record["ids"])  # the tags are the only new ids


def test_a_checkpoint_is_sampled_as_it_was_trained(tmp_path):
    """eval.py and sample.py read the schema, attention mode, path stride and prompt a checkpoint
    was trained with (its stage's mode and prompt, saved by the runner); a flag still wins."""
    import eval as eval_script

    from nanopar.config import parse_config
    from nanopar.defaults import resolve

    (tmp_path / "run_config.json").write_text('{"schema": "npr", "mode": "causal", "path_stride": 50, '
                                              '"instructions": "parallel"}')
    for kind in (sample.SampleConfig, eval_script.EvalConfig):
        config = parse_config(kind, ["--model", str(tmp_path)])
        resolve(config, ["--model", str(tmp_path)])
        assert (config.schema, config.mode, config.path_stride, config.instructions) == ("npr", "causal", 50, "parallel")
        argv = ["--model", str(tmp_path), "--schema", "parallel-r1", "--mode", "structured", "--path-stride", "0",
                "--instructions", "plain"]
        config = parse_config(kind, argv)
        resolve(config, argv)
        assert (config.schema, config.mode, config.path_stride, config.instructions) == (
            "parallel-r1", "structured", 0, "plain")
    config = parse_config(sample.SampleConfig, ["--model", "tiny:qwen3"])
    resolve(config, ["--model", "tiny:qwen3"])
    assert (config.schema, config.mode, config.path_stride) == ("parallel-r1", "structured", 0)
