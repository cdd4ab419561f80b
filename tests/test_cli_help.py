"""The scripts' --help and --help-all: --help is a screen of the flags a first run needs, --help-all
every flag once under its heading (a "%" in a field comment once crashed argparse), and no flag
a documented command gives went away or parses differently."""

import contextlib
import dataclasses
import io
import re
import sys
import types
import typing
from unittest import mock

import pytest

import eval as eval_script
import export
import sample
import train
from nanopar.config import parse_config
from test_docs import all_commands

SCRIPTS = {"train.py": (train, train.TrainConfig), "eval.py": (eval_script, eval_script.EvalConfig),
           "sample.py": (sample, sample.SampleConfig)}
CONFIGS = {name: config for name, (_, config) in SCRIPTS.items()} | {"export.py": export.ExportConfig}


@pytest.fixture(autouse=True)
def terminal_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse and --help read the width from here


def printed_help(name: str, flag: str) -> str:
    """What `python <name> <flag>` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.object(sys, "argv", [name]), pytest.raises(SystemExit) as exit:
        SCRIPTS[name][0].main([flag])
    assert exit.value.code == 0
    return out.getvalue()


def flag(field) -> str:
    return "--" + field.name.replace("_", "-")


def sections(text: str) -> dict[str, list[str]]:
    """{heading: the flags listed under it} of argparse's help: a heading is an unindented line
    ending in ":", a flag the first long option of a line indented by two spaces."""
    found, heading = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line):
            heading = line[:-1]
            found[heading] = []
        elif heading and (listed := re.match(r"  (?:-h, )?(--[a-z0-9-]+)", line)):
            found[heading].append(listed[1])
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_is_one_screen_of_the_flags_a_first_run_needs(name):
    config = SCRIPTS[name][1]
    text = printed_help(name, "--help")
    lines = text.splitlines()
    shown = [line.split()[0] for line in lines if line.startswith("  --")]
    assert len(lines) <= 60 and len(shown) <= 30, (len(lines), len(shown))
    assert max(map(len, lines)) <= 80  # fits the terminal it was cut for
    assert len(shown) == len(set(shown)) and set(shown) < {flag(f) for f in dataclasses.fields(config)}
    assert lines[-1] == f"{len(dataclasses.fields(config))} flags in full, with a real model's defaults: {name} --help-all"
    assert {"--model", "--dtype", "--device", "--load-in-4bit", "--seed", "--temperature"} <= set(shown)
    if name == "train.py":  # what the README's first commands and a first real run give
        assert {"--preset", "--out", "--stages", "--skip", "--trial", "--baseline", "--rl-easy-steps",
                "--rl-hard-steps", "--easy-reward", "--hard-reward", "--lora", "--recipe"} <= set(shown)
        assert "  --rl-easy-steps 30          GRPO steps on easy problems" in lines  # the default as a value to type
        assert "  --baseline                  also run accuracy-only GRPO from the same ..." in lines  # a switch: no value
        assert "--kl-beta" not in text and "the data:" not in text  # a knob and a group of --help-all only


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_all_lists_every_flag_once_under_a_heading(name):
    config = SCRIPTS[name][1]
    listed = sections(printed_help(name, "--help-all"))
    where = {option: heading for heading, options in listed.items() for option in options}
    every = [option for options in listed.values() for option in options]
    fields = [flag(field) for field in dataclasses.fields(config)]
    assert sorted(every) == sorted(fields + ["--help", "--help-all"])  # each once
    assert {where[option] for option in fields}.isdisjoint({"options"})  # under a heading of the config's
    assert listed["options"] == ["--help", "--help-all"]
    assert (where["--paths"], where["--dtype"]) == ("sampling", "the model")  # headings shared by the scripts
    if name == "train.py":
        text = printed_help(name, "--help-all")
        assert '"cosine" (to 10%)' in " ".join(text.split())  # the comment, with its percent sign
        assert "--max-paths" not in text  # a constant, not a flag
        assert [where[f] for f in ("--lora", "--gradient-checkpointing", "--kl-beta", "--eval-samples")] == [
            "the model", "the model", "optimisation", "held-out evaluation after every training stage (the final table)"]
        assert list(listed)[1:3] == ["the run", "the model"]  # the script's own headings first
    if name == "eval.py":
        assert where["--model"] == "what to evaluate"  # a field a config redefines: its own heading


def test_export_help_is_one_screen_of_every_flag():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.object(sys, "argv", ["export.py"]), pytest.raises(SystemExit):
        export.main(["--help"])
    lines = out.getvalue().splitlines()
    shown = [line.split()[0] for line in lines if line.startswith("  --")]
    assert len(lines) <= 30 and max(map(len, lines)) <= 80
    assert {"--checkpoint", "--out", "--gguf", "--dtype", "--replace", "--check"} <= set(shown)
    assert lines[-1] == f"{len(dataclasses.fields(export.ExportConfig))} flags in full: export.py --help-all"


def test_a_flag_only_help_all_lists_still_parses():
    shown = printed_help("train.py", "--help")
    assert "--kl-beta" not in shown and "--no-chat" not in shown and "--clip-high" not in shown
    config = parse_config(train.TrainConfig, ["--kl-beta", "0.1", "--no-chat", "--clip-high", "0.28", "--out", "x"])
    assert (config.kl_beta, config.chat, config.clip_high, config.out) == (0.1, False, 0.28, "x")


def given_values(config_class, argv: list[str]) -> dict[str, object]:
    """{field: the value `argv` gives it}, read from the command itself (a later flag wins): what
    parsing it must produce."""
    fields, hints, values = {f.name for f in dataclasses.fields(config_class)}, typing.get_type_hints(config_class), {}
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        name = name.replace("-", "_")
        if name not in fields and name.startswith("no_"):
            values[name[3:]] = False
            continue
        assert name in fields, f"{word}: no such flag (an abbreviation?)"
        kind = hints[name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        if kind is bool:
            values[name] = True
        elif typing.get_origin(kind) is tuple:
            values[name] = tuple(argv[i + 1:next((j for j in range(i + 1, len(argv)) if argv[j].startswith("--")),
                                                 len(argv))])
        else:
            values[name] = kind(inline or argv[i + 1])
    return values


def test_every_flag_a_documented_command_gives_parses_to_the_value_it_gives():
    commands = [(doc, script, argv) for doc, script, argv in all_commands() if script in CONFIGS]
    assert sum(doc == "README.md" for doc, _, _ in commands) >= 10  # the premise: the README's commands are found
    assert any(script == "export.py" for _, script, _ in commands)
    checked = set()
    for doc, script, argv in commands:
        config_class = CONFIGS[script]
        config = parse_config(config_class, argv)
        for name, value in given_values(config_class, argv).items():
            assert getattr(config, name) == value, f"{doc}: {script} {' '.join(argv)}: {name}"
            checked.add(name)
    assert {"model", "preset", "load_in_4bit", "micro_batch_tokens", "rescore"} <= checked  # the premise


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_model_flag_says_a_gguf_file_is_a_model(name):
    text = " ".join(printed_help(name, "--help-all").split())
    model_help = text[text.index("--model MODEL ", text.index("options:")):][:300]  # the option, not the usage line
    assert ".gguf file" in model_help, model_help
    model_line = next(line for line in printed_help(name, "--help").splitlines() if ".gguf" in line)
    assert "folder, .gguf file" in model_line
