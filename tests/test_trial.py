"""train.py --trial: a few steps a stage, then the whole run's time projected from them."""

import dataclasses

import pytest

import train
from nanopar import NanoparError
from nanopar.curriculum import Stage, TrainConfig
from nanopar.data import read_jsonl
from nanopar.trial import projection, trim


def test_the_projection_is_each_stages_fixed_cost_plus_its_median_step_times_the_runs_steps():
    full = TrainConfig(eval_problems=256, eval_batch=64)  # 4 sampler calls a set; the trial made 1
    trial = [Stage("model", "given", ""), Stage("sft", "sft", "", steps=3), Stage("rl", "grpo", "", steps=3)]
    run = [Stage("sft", "sft", "", steps=250), Stage("rl", "grpo", "", steps=30)]
    records = [{"stage": "model", "event": "eval", "seconds": 5.0},
               *({"stage": "sft", "step": i + 1, "train_seconds": t} for i, t in enumerate([9.0, 1.0, 2.0])),
               {"stage": "sft", "event": "done", "seconds": 22.0}, {"stage": "sft", "event": "eval", "seconds": 6.0},
               *({"stage": "rl", "step": i + 1, "sample_seconds": s, "train_seconds": 1.0} for i, s in enumerate([3.0, 4.0, 5.0])),
               {"stage": "rl", "event": "done", "seconds": 20.0}]
    rows = {r["stage"]: r for r in projection(full, trial, run, records)}
    assert rows["model"]["projected_seconds"] == 5.0 * 4
    # sft: fixed 22 - (9 + 1 + 2) = 10, median step 2, 250 steps; its evaluation 6 x 4 calls
    assert rows["sft"]["seconds_a_step"] == 2.0 and rows["sft"]["run_steps"] == 250
    assert rows["sft"]["projected_seconds"] == 10 + 2.0 * 250 + 6.0 * 4
    # rl: steps of 4, 5 and 6 s (sampling + update), fixed 20 - 15 = 5, no evaluation line
    assert rows["rl"]["projected_seconds"] == 5 + 5.0 * 30 and rows["rl"]["eval_seconds"] == 0


def test_a_pass_rate_pool_is_projected_by_its_problems():
    """A trial's pool samples one sampler call (8 x 8 lanes / 4 samples: 16 problems) and the run's
    pool is projected from its time a problem; the pool is not part of the stage's fixed cost."""
    config = train.resolved_config(["--pool-samples", "4", "--pool-problems", "256", "--prompts-per-step", "8",
                                    "--group-size", "8"])[0]
    full, changed = trim(config, [], 2)
    assert changed["pool_problems"] == 16 and full.pool_problems == 256
    records = [{"stage": "rl", "event": "pool", "seconds": 40.0, "problems": 16, "available": 7473},
               *({"stage": "rl", "step": i + 1, "sample_seconds": 5.0, "train_seconds": 1.0} for i in range(2)),
               {"stage": "rl", "event": "done", "seconds": 60.0}]
    (row,) = projection(full, [Stage("rl", "grpo", "", steps=2)], [Stage("rl", "grpo", "", steps=30)], records)
    # fixed 60 - 12 - 40 = 8; the pool 40 s for 16 problems -> 640 s for 256; 30 steps of 6 s
    assert row["stage_seconds"] == 8 + 640 + 6.0 * 30
    everything = dataclasses.replace(full, pool_problems=0)  # 0: all 7,473 of the stage's problems
    assert projection(everything, [Stage("rl", "grpo", "", steps=2)], [Stage("rl", "grpo", "", steps=30)],
                      records)[0]["stage_seconds"] == 8 + 40.0 * 7473 / 16 + 6.0 * 30


def test_trim_keeps_the_runs_batches_and_lengths_and_names_its_own_folder():
    config, _ = train.resolved_config(["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--load-in-4bit"])
    full, changed = trim(config, [], 3)
    assert (full.sft_steps, full.rl_easy_steps, full.rl_hard_steps, full.eval_problems) == (60, 100, 100, 150)
    assert changed == {"pretrain_steps": 3, "sft_steps": 3, "rl_easy_steps": 3, "rl_hard_steps": 3, "eval_problems": full.eval_batch,
                       "out": "runs/Qwen2.5-1.5B-Instruct-trial"}
    assert (config.prompts_per_step, config.group_size, config.max_new_tokens) == \
        (full.prompts_per_step, full.group_size, full.max_new_tokens)
    assert trim(*train.resolved_config(["--out", "mine"])[:1], ["--out", "mine"], 2)[0].out == "mine"
    with pytest.raises(NanoparError, match="--trial must be >= 1 steps a stage, not 0"):
        trim(config, [], 0)


@pytest.mark.slow
def test_a_toy_trial_runs_every_stage_briefly_and_prints_the_runs_projection(tmp_path, capsys):
    out = train.main(["--trial", "2", "--out", str(tmp_path), "--eval-problems", "8", "--eval-batch", "4",
                      "--max-new-tokens", "48", "--max-path-tokens", "12"])
    steps = [(m["stage"], m["step"]) for m in read_metrics(out) if "step" in m]
    assert steps == [("sft", 1), ("sft", 2), ("rl-easy", 1), ("rl-easy", 2), ("rl-hard", 1), ("rl-hard", 2)]
    printed = capsys.readouterr().out
    assert "--trial 2: the run at" in printed and "the run" in printed


def read_metrics(run):
    return read_jsonl(run / "metrics.jsonl")
