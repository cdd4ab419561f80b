"""bench/speed.py: its flags come from its dataclass and --help starts nothing; its --quick run on a
random tiny Qwen2 (seconds, in this process) counts what its phases, rollouts and steps hold."""

import dataclasses
import importlib.util
import sys

import pytest

from conftest import ROOT
from nanopar.model import ModelSettings, load_model


@pytest.fixture
def speed(monkeypatch):
    """bench/speed.py as a module, imported as `python bench/speed.py` runs it (bench/ on sys.path)."""
    path = ROOT / "bench" / "speed.py"
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("bench_speed", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses read the module's namespace
    spec.loader.exec_module(module)
    return module


def test_the_flags_come_from_the_dataclass_and_help_starts_nothing(speed, capsys, monkeypatch):
    """--help lists every field of SpeedConfig and loads no model; an unknown part is a one-line error
    before any model loads."""
    def no_model(*args):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(speed, "load_bench_model", no_model)
    with pytest.raises(SystemExit) as done:
        speed.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for field in dataclasses.fields(speed.SpeedConfig):
        assert "--" + field.name.replace("_", "-") in text, field.name
    with pytest.raises(SystemExit) as done:
        speed.main(["--only", "floor,speed"])
    assert str(done.value) == "bench/speed.py: unknown part speed; choose from floor, sampler, fork, rebuild, steps"
    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        speed.main(["--rounds", "0"])


@pytest.mark.slow
def test_quick_run_on_a_tiny_model_counts_what_it_decoded(speed, registry, tmp_path, capsys):
    report = speed.main(["--quick", "--model", "tiny:qwen2", "--out", str(tmp_path / "speed.json")])
    shown = capsys.readouterr().out
    for title in ("floor: one weight's matrix product", "floor: nanopar against", "profile: decode step, 4 lanes",
                  "sampler: nanopar against model.generate", "fork: forked against sequential", "rebuild: one sampler call",
                  "steps: one cold-start step"):
        assert title in shown
    config = report["config"]
    assert (tmp_path / "speed.json").exists() and config["rounds"] == 1 and config["decode_lanes"] == (1, 4)

    # floor: each phase's floor is the model's dense layers over its rows: 2 x rows x their weights (the head
    # over one row a prompt in the prefill, the weighted positions in training), x 2 with the backward
    model = load_model(ModelSettings("tiny:qwen2"))[0]
    c, V = model.config, model.get_output_embeddings().weight.shape[0]
    width = c.hidden_size // c.num_attention_heads * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_row = c.num_hidden_layers * c.hidden_size * (width + 3 * c.intermediate_size)  # q k v o, gate up down
    prefill, evaluation, *decode, train = report["floor"]["phases"]
    assert prefill["rows"] == 2 * 16 and prefill["head_rows"] == 2
    assert evaluation["rows"] == 4 * 24 and evaluation["head_rows"] == 4
    assert [row["rows"] for row in decode] == [row["head_rows"] for row in decode] == [1, 4]
    assert train["rows"] == 2 * 32 and 0 < train["head_rows"] < train["rows"]
    for row in (prefill, evaluation, *decode, train):
        backward = 2 if row is train else 1
        assert row["floor_flops"] == 2 * backward * (row["rows"] * per_row + row["head_rows"] * c.hidden_size * V)
        # (a prefill's and a decode step's seconds are differences of two calls' times: on a tiny model a busy
        # machine can make one <= 0, so only the training read's is asserted positive)
        assert row["ratio"] == pytest.approx(row["seconds"] / row["floor_seconds"]) and row["floor_seconds"] > 0
        assert 0 < len(row["top"]) <= 5 and all(op["calls"] >= 0 for op in row["top"]) and row["peak_mb"] >= 0
    assert train["seconds"] > 0
    assert len(report["floor"]["probes"]) == 1 and all(t > 0 for t in report["floor"]["probes"][0]["tflops"])

    # sampler: both sides decoded exactly --new-tokens a lane, no EOS stop
    assert [row["lanes"] for row in report["sampler"]] == [1, 4]
    for row in report["sampler"]:
        assert row["nanopar_tokens"] == row["generate_tokens"] == row["lanes"] * config["new_tokens"]
        assert row["ratio"] == pytest.approx(row["generate_seconds"] / row["nanopar_seconds"])

    # fork: every lane forked once into K paths of --path-tokens + <Path> + </Path>, then spent its budget in
    # the summary: the forked call holds the inserted tags besides the sampled tokens, the sequential none
    K, L, budget = config["paths"], config["path_tokens"], config["fork_tokens"]
    for row in report["fork"]:
        lanes = row["lanes"]
        assert row["forks"] == lanes
        assert row["forked"]["tokens"] == row["rollout_tokens"] == lanes * (budget + 2 * K + 2)
        assert row["sequential"]["tokens"] == lanes * budget
        assert row["critical_path_tokens"] == row["rollout_tokens"] - lanes * (K - 1) * (L + 2)
        assert row["token_acceleration"] == pytest.approx(row["rollout_tokens"] / row["critical_path_tokens"])
        assert row["speedup"] == pytest.approx(row["forked"]["tokens_per_second"] / row["sequential"]["tokens_per_second"])

    # rebuild: the most --lanes prompts x --rebuild-samples lanes, forked by the tag bias (the two caches'
    # tokens are asserted equal inside the part)
    rebuild = report["rebuild"]
    assert rebuild["lanes"] == 4 * 2 and rebuild["forks"] > 0
    assert rebuild["ratio"] == pytest.approx(rebuild["plain_seconds"] / rebuild["lazy_seconds"])

    # steps: 4 traces cut to --trace-tokens each (a character tokenizer: every trace is longer), and a GRPO
    # step at the qwen preset's packing that sampled --prompts x --group-size rows and updated
    steps = report["steps"]
    assert steps["micro_batch_tokens"] == 1024 and steps["sft_tokens"] == 4 * config["trace_tokens"]
    assert steps["grpo_rows"] == config["prompts"] * config["group_size"]
    assert 0 < steps["grpo_sampled_tokens"] <= steps["grpo_rows"] * config["grpo_tokens"]
    assert steps["grpo_update_seconds"] > 0 and steps["sft_peak_rise_mb"] >= 0
