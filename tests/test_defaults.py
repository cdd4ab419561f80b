"""Defaults that follow the model: a real model gets a real run's settings, a toy model the toy's,
a flag always wins, and the three scripts agree on sampling."""


import eval as eval_script
import sample
from nanopar.config import parse_config
from nanopar.curriculum import TrainConfig, recipe
from nanopar.defaults import REAL_SAMPLING, REAL_TRAINING, TOY_SAMPLING, apply_model_defaults, built_from_code


def resolved(argv):
    config = parse_config(TrainConfig, argv)
    apply_model_defaults(config, argv, training=True)
    return config


def test_a_real_model_gets_a_real_run(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a local model folder
    config = resolved(["--model", str(tmp_path)])
    assert {f: getattr(config, f) for f in REAL_TRAINING | REAL_SAMPLING} == REAL_TRAINING | REAL_SAMPLING
    names = [s.name for s in recipe(config)]
    assert names == ["cold-start-data", "sft", "rl-easy", "rl-hard"]  # no toy pretraining, a distilled cold start
    assert all(s.instructions in ("parallel",) for s in recipe(config))
    assert resolved(["--model", str(tmp_path), "--paths", "4", "--hard-data", "math500"]).paths == 4  # flags win


def test_toy_and_tiny_models_keep_the_toy_defaults(tmp_path):
    assert resolved([]).easy_data == "toy:easy" and resolved(["--model", "tiny:qwen3"]).max_new_tokens == TOY_SAMPLING["max_new_tokens"] == 224
    assert resolved([]).eval_problems == 300 and REAL_TRAINING["eval_problems"] == 150  # the toy's are cheap
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "toy:model"}')
    assert built_from_code(str(tmp_path))  # a checkpoint of the toy model is the toy's
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "Qwen/Qwen3-0.6B"}')
    assert not built_from_code(str(tmp_path))


def test_the_three_scripts_share_their_sampling_defaults(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a local model folder
    fields = ("paths", "max_new_tokens", "max_path_tokens", "temperature")
    for model in ("toy:model", str(tmp_path)):
        configs = []
        for kind in (sample.SampleConfig, eval_script.EvalConfig, TrainConfig):
            config = parse_config(kind, ["--model", model])
            apply_model_defaults(config, ["--model", model])
            configs.append({f: getattr(config, f) for f in fields})
        assert configs[0] == configs[1] == configs[2], model
