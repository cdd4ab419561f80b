"""bench/qwen.py: its --quick run on a random tiny Qwen2 (seconds) counts what its rollouts and steps hold."""

import json

import pytest

from conftest import run_script
from nanopar.model import ModelSettings, load_model


@pytest.mark.slow
def test_quick_run_on_a_tiny_model_counts_what_it_decoded(tmp_path):
    out = tmp_path / "qwen.json"
    done = run_script("bench/qwen.py", "--quick", "--model", "tiny:qwen2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    config = report["config"]
    for title in ("0a. this machine's matrix products", "0b. nanopar against the floor", "profile: decode step, 4 lanes",
                  "1. nanopar's sampler vs model.generate", "2. forked vs sequential", "3. one cold-start step"):
        assert title in done.stdout

    # 0. each phase's floor is the model's dense layers over its rows: 2 x rows x their weights (the
    # head over one row a prompt in the prefill, the weighted positions in training), x 2 with the backward
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
        # (a prefill's and a decode step's seconds are differences of two calls' times: on a tiny model
        # a busy machine can make one <= 0, so only the training read's is asserted positive)
        assert row["ratio"] == pytest.approx(row["seconds"] / row["floor_seconds"]) and row["floor_seconds"] > 0
        assert 0 < len(row["top"]) <= 5 and all(op["calls"] >= 0 for op in row["top"]) and row["peak_mb"] >= 0
    assert train["seconds"] > 0
    assert len(report["floor"]["probes"]) == 1 and all(t > 0 for t in report["floor"]["probes"][0]["tflops"])

    # 1. both contestants decoded exactly --new-tokens a lane, no EOS stop
    assert [row["lanes"] for row in report["sampler"]] == config["lanes"] == [1, 4]
    for row in report["sampler"]:
        assert row["nanopar_tokens"] == row["generate_tokens"] == row["lanes"] * config["new_tokens"]
        assert row["ratio"] == pytest.approx(row["generate_seconds"] / row["nanopar_seconds"])

    # 2. every lane forked once into K paths of --path-tokens + <Path> + </Path>, then spent its budget in
    # the summary: the forked call holds the inserted tags besides the sampled tokens, the sequential none
    K, L, budget = config["paths"], config["path_tokens"], config["fork_tokens"]
    for row in report["fork"]:
        lanes = row["lanes"]
        assert row["forks"] == lanes
        assert row["forked_tokens"] == row["rollout_tokens"] == lanes * (budget + 2 * K + 2)
        assert row["sequential_tokens"] == lanes * budget
        assert row["critical_path_tokens"] == row["rollout_tokens"] - lanes * (K - 1) * (L + 2)
        assert row["token_acceleration"] == pytest.approx(row["rollout_tokens"] / row["critical_path_tokens"])
        assert row["speedup"] == pytest.approx(row["forked_tokens_per_second"] / row["sequential_tokens_per_second"])

    # 3. before (float32, 4 rows) and after (the qwen preset): 4 traces cut to 128 tokens each (a character
    # tokenizer: every trace is longer), and a GRPO step that sampled --prompts x --group-size rows and updated
    before, after = report["steps"]
    assert (before["dtype"], before["micro_batch"]) == ("float32", 4)
    assert (after["dtype"], after["micro_batch_tokens"]) == (config["resolved_dtype"], 1024)
    for row in (before, after):
        assert row["sft_tokens"] == 4 * config["trace_tokens"]
        assert row["grpo_rows"] == config["prompts"] * config["group_size"]
        assert 0 < row["grpo_sampled_tokens"] <= row["grpo_rows"] * config["grpo_tokens"]
        assert row["grpo_update_seconds"] > 0 and row["sft_peak_rise_mb"] >= 0
