"""DAPO's dynamic sampling (--filter-groups): a step trains on the first B groups with two different
rewards, drawing more prompts for them up to a cap, and logs what it dropped.

Checked against independent computations: which groups a hand-made sequence of draws keeps; the
model after a filtered step against a twin updated by `grpo_update` on exactly the kept groups;
a run's extra draws, resumed from a checkpoint, against the uninterrupted run's.
"""

import copy
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

import nanopar.grpo
import train
from conftest import text_rollout
from nanopar import NanoparError, distributed
from nanopar.dynamic_sampling import Drawn, fill_with_signal
from nanopar.grpo import GRPOSettings, group_advantages, grpo_step, grpo_update
from nanopar.model import ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings


def drawn(*groups, ok=None, name="a"):
    """A Drawn of reward lists, one per group: problems "<name><group>", rollouts "<name><row>",
    every layout valid unless `ok` says otherwise."""
    rewards = [r for group in groups for r in group]
    ok = ok or [True] * len(rewards)
    results = [SimpleNamespace(total=r, layout_ok=o) for r, o in zip(rewards, ok)]
    return Drawn([f"{name}{i}" for i in range(len(groups))], [f"{name}{i}" for i in range(len(rewards))], results)


def test_draws_go_on_until_enough_groups_carry_a_signal_and_stop_at_the_cap():
    asked = []

    def more(d, groups):
        asked.append(d)
        return groups[d - 1]

    later = [drawn([0.0, 0.0], [1.0, 0.0], name="b"), drawn([1.0, 0.0], [0.0, 1.0], name="c")]
    trained, every, log = fill_with_signal(drawn([1.0, 1.0], [0.0, 1.0]), lambda d: more(d, later), 2, 2, 4)
    # draw 0 holds one group with a signal (its second), draw 1 one more (its second): two draws
    assert asked == [1] and trained.problems == ["a1", "b1"] and len(every.problems) == 4
    assert trained.rollouts == ["a2", "a3", "b2", "b3"]  # the rows of those two groups, in the order drawn
    assert log == {"draws": 2, "groups_sampled": 4, "groups_trained": 2, "groups_dropped": 2, "groups_unused": 0}
    # a cap of 2 draws where nothing has a signal: the step keeps what it found (one group)
    asked.clear()
    none = [drawn([0.0, 0.0], [1.0, 1.0])] * 3
    trained, _, log = fill_with_signal(drawn([1.0, 1.0], [0.0, 1.0]), lambda d: more(d, none), 2, 2, 2)
    assert asked == [1] and log["groups_trained"] == 1 and log["draws"] == 2 and log["groups_dropped"] == 3
    # more than enough in the first draw: no further draw, the extra group left unused
    trained, _, log = fill_with_signal(drawn([1.0, 0.0], [0.0, 1.0], [1.0, 0.0]), lambda d: pytest.fail("drew"), 2, 2, 4)
    assert trained.problems == ["a0", "a1"] and log["groups_unused"] == 1 and log["draws"] == 1


def test_a_papo_stage_reads_the_signal_on_the_rollouts_it_keeps():
    """Two rewards, one of them on a rollout PAPO drops: no signal for a stage that drops, one for
    a stage that does not."""
    group = drawn([1.0, -1.0], ok=[True, False])
    assert fill_with_signal(group, lambda d: drawn([0.0, 0.0]), 1, 2, 1, drop_invalid=True)[2]["groups_trained"] == 0
    assert fill_with_signal(group, lambda d: drawn([0.0, 0.0]), 1, 2, 1, drop_invalid=False)[2]["groups_trained"] == 1


def test_a_filtered_step_is_the_update_of_exactly_the_groups_with_a_signal(monkeypatch):
    """Four toy problems in two draws of two: problem 0 all wrong, 1 one right, 2 one right (of the
    second draw: graded against its own answer), 3 all right. The step updates as `grpo_update` on
    groups 1 and 2 alone does; its metrics are over all eight responses."""
    from nanopar.prompts import build_prompt, stop_ids
    from nanopar.toy import toy_problems

    model, tokenizer = load_model(ModelSettings("toy:model"))
    policy, twin = Policy.for_tokenizer(tokenizer), copy.deepcopy(model)
    problems = toy_problems("toy:easy")[:4]
    prompts = [build_prompt(p, tokenizer, "") for p in problems]
    eos = stop_ids(model, tokenizer)[0]

    def rollout(i, right):
        answer = problems[i].answer if right else "0"
        return text_rollout(prompts[i], tokenizer.encode(f"Final Answer: {answer}") + [eos], policy.tag_ids)

    calls = [[rollout(0, False), rollout(0, False), rollout(1, True), rollout(1, False)],
             [rollout(2, False), rollout(2, True), rollout(3, True), rollout(3, True)]]
    monkeypatch.setattr(nanopar.grpo, "sample", lambda model, prompts, policy, sampling, eos, G: calls.pop(0))
    settings = GRPOSettings(group_size=2, filter_groups=True, max_draws=3)
    rollouts, metrics = grpo_step(model, tokenizer, make_optimizer(model, lr=1e-3)[0], problems[:2], prompts[:2],
                                  policy, SamplerSettings(), settings, {"accuracy": 1.0},
                                  more=lambda d: (problems[2:], prompts[2:], SamplerSettings()))
    assert len(rollouts) == 8 and metrics["paid"] == [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
    assert (metrics["draws"], metrics["groups_trained"], metrics["groups_dropped"]) == (2, 2, 2)
    assert metrics["reward"] == pytest.approx(0.0) and metrics["zero_variance_groups"] == pytest.approx(0.5)
    kept = [rollouts[2], rollouts[3], rollouts[4], rollouts[5]]
    advantages = group_advantages(torch.tensor([1.0, -1.0, -1.0, 1.0]), 2)
    by_hand = grpo_update(twin, make_optimizer(twin, lr=1e-3)[0], kept, advantages, policy, settings,
                          tokenizer.pad_token_id)
    assert metrics["loss"] == by_hand["loss"] and metrics["grad_norm"] > 0
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_a_step_that_filters_without_further_draws_is_refused_in_one_line(monkeypatch):
    from nanopar.prompts import build_prompt
    from nanopar.toy import toy_problems

    model, tokenizer = load_model(ModelSettings("toy:model"))
    policy = Policy.for_tokenizer(tokenizer)
    problems = toy_problems("toy:easy")[:1]
    monkeypatch.setattr(nanopar.grpo, "sample", lambda *args: pytest.fail("sampled"))
    with pytest.raises(NanoparError, match="further draws"):
        grpo_step(model, tokenizer, None, problems, [build_prompt(problems[0], tokenizer, "")], policy,
                  SamplerSettings(), GRPOSettings(group_size=2, filter_groups=True), "accuracy")
    with pytest.raises(NanoparError, match="--max-draws 0"):
        GRPOSettings(filter_groups=True, max_draws=0)


RUN = ["--skip", "sft,rl-hard", "--rl-easy-steps", "2", "--prompts-per-step", "2", "--group-size", "4",
       "--max-new-tokens", "64", "--max-path-tokens", "24", "--easy-reward", "accuracy", "--eval-problems", "0",
       "--filter-groups", "--max-draws", "3", "--save-rollouts", "--checkpoint-every", "1", "--keep-checkpoints", "0"]


@pytest.mark.slow
def test_a_run_logs_its_draws_and_a_resumed_step_draws_the_same_problems(tmp_path):
    """The toy's base on toy:easy with --filter-groups: each step's line says its draws and groups,
    its saved rollouts are every group drawn (the extra draws' problems too), and a run resumed
    from the checkpoint after step 1 samples step 2's draws exactly as the uninterrupted run did."""
    whole = tmp_path / "whole"
    train.main(["--out", str(whole), *RUN])
    steps = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("stage") == "rl-easy" and "step" in s]
    saved = [json.loads(line) for line in (whole / "2-rl-easy" / "rollouts.jsonl").read_text().splitlines()]
    for step in steps:
        assert step["groups_trained"] + step["groups_dropped"] + step["groups_unused"] == step["groups_sampled"]
        assert step["groups_sampled"] == 2 * step["draws"] and 1 <= step["draws"] <= 3
        assert sum(r["step"] == step["step"] for r in saved) == 4 * step["groups_sampled"]
        assert step["groups_trained"] == 2 or step["draws"] == 3  # fewer only at the cap
    assert any(s["draws"] > 1 for s in steps)  # the premise: some step drew more (the base solves ~half)
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "2-rl-easy" / "final")
    shutil.rmtree(resumed / "2-rl-easy" / "checkpoint-2", ignore_errors=True)
    train.main(["--out", str(resumed), *RUN])
    again = [json.loads(line) for line in (resumed / "2-rl-easy" / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["id"], r["response"]) for r in again] == [(r["id"], r["response"]) for r in saved]


def test_filter_groups_is_refused_under_torchrun(monkeypatch):
    from nanopar.runner import open_run

    config = train.resolved_config(["--filter-groups"])[0]
    monkeypatch.setattr(distributed, "active", lambda: True)
    with pytest.raises(NanoparError) as refused:
        open_run(config)
    assert "\n" not in str(refused.value) and "one process" in str(refused.value)
