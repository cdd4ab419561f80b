"""bench/qwen.py: its --quick run on a random tiny Qwen2 (seconds) counts what its rollouts and steps hold."""

import json

import pytest

from conftest import run_script


@pytest.mark.slow
def test_quick_run_on_a_tiny_model_counts_what_it_decoded(tmp_path):
    out = tmp_path / "qwen.json"
    done = run_script("bench/qwen.py", "--quick", "--model", "tiny:qwen2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    config = report["config"]
    for title in ("1. nanopar's sampler vs model.generate", "2. forked vs sequential", "3. one cold-start step"):
        assert title in done.stdout

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
