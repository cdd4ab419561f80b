"""Every script's --help (bench/train_step.py's too): it prints (a "%" in a field comment once
crashed argparse) and lists every field of the script's config with its comment."""

import dataclasses
import importlib.util
import sys

import pytest

import eval as eval_script
import sample
import train
from conftest import ROOT

sys.path.append(str(ROOT / "bench"))  # as `python bench/train_step.py` has it: its helpers beside it
_spec = importlib.util.spec_from_file_location("train_step_bench", ROOT / "bench" / "train_step.py")
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # (dataclasses look their module up)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("script, config", [(train, train.TrainConfig), (sample, sample.SampleConfig),
                                            (eval_script, eval_script.EvalConfig), (bench, bench.BenchConfig)])
def test_help_lists_every_flag(script, config, capsys):
    with pytest.raises(SystemExit) as exit:
        script.main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    for field in dataclasses.fields(config):
        assert "--" + field.name.replace("_", "-") in text, field.name
    if script is train:
        assert '"cosine" (to 10%)' in " ".join(text.split())  # the comment, with its percent sign
        assert "--gradient-checkpointing" in text and "--max-paths" not in text  # a GPU knob; a constant


@pytest.mark.parametrize("script", [train, sample, eval_script])
def test_the_model_flag_says_a_gguf_file_is_a_model(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    model_help = text[text.index("--model MODEL ", text.index("options:")):][:300]  # the option, not the usage line
    assert ".gguf file" in model_help, model_help
