"""The recipes' stages as the papers run them: where each stage starts, how each decodes, and the
defaults that follow the schema. Checked on the stage lists (`curriculum.recipe`), no model."""

import dataclasses

import pytest

import train
from conftest import one_line
from nanopar import NanoparError
from nanopar.curriculum import recipe, starting_stage


def stages_of(argv):
    config = train.resolved_config(argv)[0]
    stages = recipe(config)
    return config, {s.name: s for s in stages}, stages


def test_npr_fine_tunes_the_base_on_the_format_rl_models_traces(tmp_path):
    """NPR's stage 2 starts from the original model (the toy's instruct base, --model on a real
    model), not from the format-RL model: that one only writes the traces."""
    _, by_name, stages = stages_of(["--recipe", "npr"])
    assert starting_stage(stages, by_name["sft"]) is by_name["pretrain"]
    assert starting_stage(stages, by_name["rejection"]) is by_name["format-rl"]  # the data comes from stage 1
    assert by_name["rejection"].keep == "structured"  # NPR's filter: its format, a round of one plan too
    assert by_name["sft"].traces == "rejection" and starting_stage(stages, by_name["parallel-rl"]) is by_name["sft"]
    (tmp_path / "config.json").write_text("{}")  # a real model: no pretraining, the SFT starts from --model
    _, by_name, stages = stages_of(["--recipe", "npr", "--model", str(tmp_path)])
    assert "pretrain" not in by_name and starting_stage(stages, by_name["sft"]) is None


def test_the_teacher_and_the_baseline_decode_plainly():
    """Parallel-R1's cold-start data comes from plain generation of a prompted teacher, and the
    accuracy-only baseline is plain GRPO: both causal, whatever --mode the run's parallel stages use."""
    _, by_name, _ = stages_of(["--sft-data", "", "--baseline", "--mode", "structured"])
    assert by_name["cold-start-data"].mode == "causal" and by_name["cold-start-data"].instructions == "parallel"
    assert by_name["cold-start-data"].keep == "parallel"  # Parallel-R1's filter: correct and a valid parallel trace
    assert by_name["baseline-rl-easy"].mode == by_name["baseline-rl-hard"].mode == "causal"
    assert by_name["sft"].mode == by_name["rl-easy"].mode == by_name["rl-hard"].mode == "structured"


def test_npr_chooses_up_to_its_engines_plan_count_unless_told(tmp_path):
    """Parallel-R1's K (3 on the toy, 2 on a real model) must not cap NPR's plans: NPR's engine
    forks up to 5; --paths still wins."""
    (tmp_path / "config.json").write_text("{}")  # a real model
    assert stages_of(["--model", str(tmp_path)])[0].paths == 2
    assert stages_of(["--model", str(tmp_path), "--recipe", "npr"])[0].paths == 5
    assert stages_of(["--recipe", "npr"])[0].paths == 5
    assert stages_of(["--recipe", "npr", "--paths", "3"])[0].paths == 3
    assert stages_of(["--schema", "npr"])[0].paths == 5  # the schema decides, not the recipe


def test_npr_stage_1_pays_the_write_ups_reward_or_npr_zeros_released_one():
    """--format-rl-reward: NPR's format RL pays `npr_format` (its write-up: format and correctness)
    unless told `accuracy` (NPR-Zero's released reward); no other stage changes."""
    _, by_name, stages = stages_of(["--recipe", "npr"])
    assert by_name["format-rl"].reward == "npr_format" and by_name["parallel-rl"].reward == "accuracy"
    _, zero, zero_stages = stages_of(["--recipe", "npr", "--format-rl-reward", "accuracy"])
    assert zero["format-rl"].reward == "accuracy"
    assert [dataclasses.replace(s, reward="") for s in zero_stages] == [dataclasses.replace(s, reward="") for s in stages]
    assert [s.reward for s in zero_stages if s.name != "format-rl"] == [s.reward for s in stages if s.name != "format-rl"]
    assert "format-rl" not in stages_of(["--format-rl-reward", "accuracy"])[1]  # Parallel-R1's recipe has no such stage


def test_npr_trains_papo_on_easy_and_hard_mixed_and_rejection_samples_2048_toy_problems(tmp_path):
    """NPR trains every stage on one mixed-difficulty set (ORZ); on the toy's hard set alone its
    PAPO stage never had a group that paid. Its rejection on the toy samples 2,048 problems (512
    left the parallel SFT data-starved). A flag given wins; a real model keeps 512; Parallel-R1's
    recipe is as before."""
    config, by_name, _ = stages_of(["--recipe", "npr"])
    assert by_name["parallel-rl"].data == "toy:easy+toy:hard" and by_name["format-rl"].data == "toy:easy"
    assert config.distill_problems == 2048 and config.eval_data == "toy:easy:heldout,toy:hard:heldout"
    config, by_name, _ = stages_of(["--recipe", "npr", "--hard-data", "toy:hard", "--distill-problems", "512"])
    assert by_name["parallel-rl"].data == "toy:hard" and config.distill_problems == 512
    config, by_name, _ = stages_of([])
    assert by_name["rl-hard"].data == "toy:hard" and config.distill_problems == 512
    (tmp_path / "config.json").write_text("{}")  # a real model: GSM8K and DAPO mixed, 512 problems sampled
    config, by_name, _ = stages_of(["--recipe", "npr", "--model", str(tmp_path)])
    assert by_name["parallel-rl"].data == "gsm8k_train+dapo" and config.distill_problems == 512


def test_a_bad_stage_1_reward_is_a_one_line_error_before_any_stage_runs(tmp_path):
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path), "--recipe", "npr", "--stages", "format-rl", "--format-rl-reward", "acuracy",
                    "--rl-easy-steps", "1", "--eval-problems", "0"])
    assert one_line(error).startswith("unknown reward 'acuracy'; known: accuracy, ")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing was trained or written
