"""Defaults that follow the model: a real model gets a real run's settings, a toy model the toy's,
a flag always wins, the three scripts agree on sampling, and `resolve` says what it changed."""


import json

import eval as eval_script
import sample
import train
from nanopar.config import parse_config
from nanopar.curriculum import recipe
from nanopar.defaults import REAL_SAMPLING, REAL_TRAINING, built_from_code, real_defaults, resolve
from nanopar.sampler import SamplerSettings
from nanopar.toy.source import SHIPPED_BASES


def resolved(argv):
    return train.resolved_config(argv)[0]


def test_a_real_model_gets_a_real_run(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a local model folder
    config = resolved(["--model", str(tmp_path)])
    real = REAL_TRAINING | REAL_SAMPLING | {"sft_data": "parallel-gsm8k"}  # "auto": Parallel-R1's shipped traces
    assert {f: getattr(config, f) for f in REAL_TRAINING | REAL_SAMPLING} == real
    names = [s.name for s in recipe(config)]
    assert names == ["sft", "rl-easy", "rl-hard"]  # no toy pretraining, the shipped cold start (tests/test_parallel_gsm8k.py)
    assert all(s.instructions in ("parallel",) for s in recipe(config))
    assert resolved(["--model", str(tmp_path), "--paths", "4", "--hard-data", "math500"]).paths == 4  # flags win
    off = resolved(["--model", str(tmp_path), "--no-lora", "--no-eval-model"])  # a boolean's --no- flag wins too
    assert (off.lora, off.eval_model, config.lora, config.eval_model) == (False, False, True, True)


def test_toy_and_tiny_models_keep_the_toy_defaults(tmp_path):
    toy = SamplerSettings()  # the one set of sampler defaults: the toy's
    assert resolved([]).easy_data == "toy:easy" and resolved(["--model", "tiny:qwen3"]).max_new_tokens == toy.max_new_tokens == 224
    assert resolved([]).eval_problems == 256 and REAL_TRAINING["eval_problems"] == 150  # the toy's are cheap
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "toy:model"}')
    assert built_from_code(str(tmp_path))  # a checkpoint of the toy model is the toy's
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "Qwen/Qwen3-0.6B"}')
    assert not built_from_code(str(tmp_path))


def test_the_three_scripts_share_their_sampling_defaults(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a local model folder
    fields = ("paths", "max_new_tokens", "max_path_tokens", "temperature")
    for model in ("toy:model", str(tmp_path)):
        configs = []
        for kind in (sample.SampleConfig, eval_script.EvalConfig, train.TrainConfig):
            config = parse_config(kind, ["--model", model])
            resolve(config, ["--model", model])
            configs.append({f: getattr(config, f) for f in fields})
        assert configs[0] == configs[1] == configs[2], model


def test_resolve_applies_preset_then_model_defaults_then_placeholders_and_says_what_it_changed(tmp_path):
    config, changed = train.resolved_config([])
    assert changed == {"dtype": "float32", "schema": "parallel-r1", "distill_tries": 1, "pretrain_data": "toy:sequential",
                       "pretrained_base": SHIPPED_BASES["parallel-r1"],
                       "eval_data": "toy:easy:heldout,toy:hard:heldout", "out": "runs/default"}  # the toy's placeholders, nothing else
    config, changed = train.resolved_config(["--preset", "long", "--sft-steps", "7", "--recipe", "npr"])
    assert (config.sft_steps, config.eval_problems) == (7, 560)  # a flag beats the preset
    assert changed["pretrain_data"] == "toy:instruct" and changed["distill_tries"] == 8 and changed["schema"] == "npr"
    assert changed["pretrained_base"] == SHIPPED_BASES["npr"] and "sft_steps" not in changed
    (tmp_path / "config.json").write_text("{}")  # a real model: its defaults, then the placeholders they leave
    config, changed = train.resolved_config(["--model", str(tmp_path), "--lr", "2e-5"])
    assert config.lr == 2e-5 and "lr" not in changed
    assert changed["pretrain_data"] == "" and config.pretrain_data == ""  # a real model's "" is not the toy's base
    assert changed["pretrained_base"] == "" and recipe(config)[0].name == "sft"  # nothing to copy
    assert changed["sft_data"] == "parallel-gsm8k"  # shown and saved like every resolved default
    assert changed["out"] == f"runs/{tmp_path.name}"  # a real model's run folder is its own
    assert config.eval_data == "gsm8k,dapo[-150:]" and changed["eval_data"] == config.eval_data
    written = parse_config(train.TrainConfig, ["--model", str(tmp_path)])
    assert resolve(written, ["--model", str(tmp_path)]) == changed | {"lr": 1e-5}  # the same road, whoever calls it
    assert "real model: 1e-05" in " ".join(train_help().split())


def test_a_mix_is_evaluated_on_the_held_out_set_of_each_of_its_parts_and_trains_without_them(tmp_path):
    from nanopar.run_inputs import RunInputs
    from nanopar.tags import schema_named

    config, _ = train.resolved_config(["--recipe", "npr", "--hard-data", "toy:easy+toy:hard"])
    assert config.eval_data == "toy:easy:heldout,toy:hard:heldout"  # each set once, not a tail of the mix
    rows = [json.dumps({"question": f"q{n}", "answer": str(n)}) for n in range(10)]
    (tmp_path / "set.jsonl").write_text("\n".join(rows) + "\n")
    spec = f"{tmp_path / 'set.jsonl'}+aime24[:2]"
    config, _ = train.resolved_config(["--easy-data", spec, "--hard-data", "aime24[:2]", "--eval-problems", "4",
                                       "--model", "toy:model"])
    assert config.eval_data.split(",")[0] == f"{tmp_path / 'set.jsonl'}[-4:]"  # the file part's own tail
    problems = RunInputs(config, recipe(config), schema_named("parallel-r1")).problems(spec)
    assert config.eval_data.split(",")[1] == "aime24[:2][-1:]"  # the other part (also --hard-data): its own
    assert [p.id for p in problems] == ["set:1", "aime24:1", "set:2", "set:3", "set:4", "set:5", "set:6"]  # each less its tail


def test_a_preset_for_a_real_model_outranks_its_defaults_and_a_flag_outranks_the_preset():
    """The smollm2 preset names a real model, whose defaults (REAL_TRAINING: lr 1e-5, ...) must not
    undo the preset's own values; the defaults still fill what the preset leaves."""
    preset = train.PRESETS["smollm2"]
    config, changed = train.resolved_config(["--preset", "smollm2"])
    assert {field: getattr(config, field) for field in preset} == preset
    assert preset["lr"] != REAL_TRAINING["lr"] and changed["lr"] == preset["lr"]  # the premise: they differ
    assert config.lora is True and config.sft_data == "parallel-gsm8k"  # not in the preset: the real defaults'
    config, _ = train.resolved_config(["--preset", "smollm2", "--lr", "3e-4"])
    assert config.lr == 3e-4


def train_help() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            train.main(["--help-all"])
        except SystemExit:
            pass
    return out.getvalue()


def test_the_shipped_base_stands_in_for_exactly_the_pretraining_that_made_it():
    """--pretrained-base auto copies the toy's shipped base only where this run would pretrain the
    same thing (its traces in the recipe's tags, the default steps and learning rate); any other
    pretraining is done here, and the resolved config says which."""
    def base(argv):
        config = resolved(argv)
        return config.pretrained_base, recipe(config)[0].shipped
    assert base([]) == (SHIPPED_BASES["parallel-r1"],) * 2
    assert base(["--recipe", "npr"]) == (SHIPPED_BASES["npr"],) * 2
    assert base(["--seed", "3", "--sft-steps", "5"]) == (SHIPPED_BASES["parallel-r1"],) * 2  # a given base, like a real model
    assert base(["--pretrain-data", "toy:sequential"]) == (SHIPPED_BASES["parallel-r1"],) * 2  # what auto says anyway
    for other in (["--pretrain-steps", "300"], ["--pretrain-lr", "1e-3"], ["--pretrain-data", "toy:instruct"],
                  ["--recipe", "npr", "--schema", "parallel-r1"], ["--pretrained-base", ""]):
        assert base(other) == ("", ""), other  # pretrained here: the shipped one was not made this way
    assert base(["--pretrained-base", "runs/x/1-pretrain/final"]) == ("runs/x/1-pretrain/final",) * 2


# what sizes a run: a real model takes each from its own defaults, never from the toy's dataclass
BUDGETS = ("sft_steps", "sft_batch", "sft_lr", "tag_lr_scale", "warmup_steps", "rl_easy_steps", "rl_hard_steps",
           "prompts_per_step", "group_size", "lr", "micro_batch", "max_new_tokens", "max_path_tokens",
           "eval_problems", "eval_samples")


def test_no_real_model_resolves_to_the_toys_budgets(tmp_path):
    """A hub id, a local folder, a .gguf file and a pypi: name all resolve every budget to the real
    model's own value (written in defaults.py, not inherited), and the cold start's to none of the
    toy's (its 250 x 32 traces would be 27 passes over Parallel-GSM8K); --preset qwen scales them
    to a CPU, and a flag still wins."""
    (tmp_path / "config.json").write_text("{}")
    toy, real = resolved([]), real_defaults(training=True)
    assert set(BUDGETS) <= set(real)
    for model in ("Qwen/Qwen2.5-1.5B-Instruct", str(tmp_path), str(tmp_path / "m.gguf"), "pypi:qwen2.5-coder-0.5b"):
        config = resolved(["--model", model])
        assert {f: getattr(config, f) for f in BUDGETS} == {f: real[f] for f in BUDGETS}, model
        assert [f for f in ("sft_steps", "sft_batch", "sft_lr", "tag_lr_scale") if getattr(config, f) == getattr(toy, f)] == []
        assert config.sft_steps * config.sft_batch <= 4 * 300, model  # a few passes over the shipped traces
    cpu = resolved(["--preset", "qwen"])
    assert cpu.model == "pypi:qwen2.5-coder-0.5b" and cpu.out == "runs/qwen"
    assert [f for f in ("sft_steps", "sft_batch", "sft_lr", "rl_easy_steps", "max_new_tokens")
            if getattr(cpu, f) in (getattr(toy, f), real[f])] == []  # its own CPU scale
    assert resolved(["--preset", "qwen", "--sft-steps", "3"]).sft_steps == 3


def test_dtype_auto_on_a_cpu_is_bfloat16_for_real_weights_only_where_the_cpu_has_bfloat16_instructions(monkeypatch):
    """The choice is made by `resolve` (so "defaults resolved" prints it and config.json keeps it):
    bfloat16 with AVX512-BF16 or AMX, float32 without and for 4-bit; the toy always float32
    (its tables must not depend on the CPU). tests/test_dtype.py stands in for GPUs."""
    from nanopar import defaults

    monkeypatch.setattr(defaults.torch.cuda, "is_available", lambda: False)
    for flags, expected in (("avx512_bf16", "bfloat16"), ("amx_bf16", "bfloat16"), ("none", "float32")):
        monkeypatch.setattr(defaults, "cpu_bf16_instructions", lambda: flags)
        config, changed = train.resolved_config(["--model", "pypi:qwen2.5-coder-0.5b"])
        assert config.dtype == changed["dtype"] == expected, flags
        assert resolved(["--model", "pypi:qwen2.5-coder-0.5b", "--load-in-4bit"]).dtype == "float32"
        assert resolved(["--model", "pypi:qwen2.5-coder-0.5b", "--dtype", "float16"]).dtype == "float16"
        assert resolved([]).dtype == resolved(["--model", "tiny:qwen3"]).dtype == "float32"
    with open("/proc/cpuinfo") as f:  # the real reading agrees with the flags line (Linux)
        flags = next(line for line in f if line.startswith("flags")).split()
    from nanopar.model import cpu_bf16_instructions
    assert (cpu_bf16_instructions() != "none") == ("avx512_bf16" in flags or "amx_bf16" in flags)


def test_the_qwen_rl_preset_runs_stage_1_at_8_x_8_beside_the_baseline_and_evaluates_on_unseen_problems():
    """Parallel-R1's stage 1 at its own group size, the accuracy-only arm from the model as shipped,
    and 200 held-out GSM8K problems none of which a GRPO stage trains on."""
    from nanopar.data import load_problems

    config, _ = train.resolved_config(["--preset", "qwen-rl"])
    stages = recipe(config)
    assert [s.name for s in stages] == ["sft", "rl-easy", "baseline-rl-easy"]
    rl, baseline = stages[1], stages[2]
    assert (rl.reward, rl.mode, baseline.reward, baseline.mode) == ("parallel-strict", "structured", "accuracy", "causal")
    assert (config.prompts_per_step, config.group_size) == (8, 8) and rl.steps == baseline.steps > 0
    assert config.eval_model and config.eval_problems >= 200 and config.eval_data == "gsm8k"
    assert config.eval_samples >= 2  # each evaluation splits its variance within and between problems
    trained = {p.question for p in load_problems(config.easy_data)}
    held_out = load_problems("gsm8k", limit=config.eval_problems)
    assert len(held_out) == config.eval_problems and not trained & {p.question for p in held_out}


def test_the_unseen_preset_is_the_released_unseen_start_on_the_toy_and_on_a_real_model():
    """Parallel-R1's rl_exp_s1.sh: the cold start, then RL on the hard set with the accuracy reward
    in structured attention, no stage 1 on the easy set; rl-hard starts from the cold start."""
    for flags, hard in (([], "toy:hard"), (["--model", "Qwen/Qwen2.5-1.5B-Instruct"], "dapo")):
        config = train.resolved_config(["--preset", "unseen", *flags])[0]
        stages = {s.name: s for s in recipe(config)}
        assert "rl-easy" not in stages and stages["sft"].mode == stages["rl-hard"].mode == "structured"
        assert (stages["rl-hard"].data, stages["rl-hard"].reward, stages["rl-hard"].start) == (hard, "accuracy", "sft")
