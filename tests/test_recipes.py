"""The recipes' stages as the papers run them: where each stage starts, how each decodes, and the
defaults that follow the schema. Checked on the stage lists (`curriculum.recipe`), no model."""

import train
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
