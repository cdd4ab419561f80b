"""Command-line flags generated from a script's @dataclass config, and saving the resolved config.

Every field becomes `--field-name`, typed from its annotation, with the comment on its line as
the help text; booleans get `--flag/--no-flag`. A config class may extend another (sample.py's
extends `SamplerSettings`), so the sampler's knobs are declared once. Not here: nested configs,
config files (a run's saved config.json is plain JSON: read it, edit it, pass flags).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import types
import typing
from pathlib import Path


def field_comments(cls) -> dict[str, str]:
    """{field name: the comment on its line}, over the class and its bases."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            for name, comment in re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(klass), re.M):
                comments[name] = comment.strip()
    return comments


def parse_config(cls, argv: list[str] | None = None, description: str = ""):
    """Build an argparse parser from `cls`, parse `argv`, return a `cls` instance."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # "int | None" -> int
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        flag = "--" + field.name.replace("_", "-")
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        help_text = comments.get(field.name, "").replace("%", "%%")  # argparse %-formats help texts
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
    """The config fields named by flags in `argv` ("--max-new-tokens=9" -> "max_new_tokens"):
    what presets and model defaults must leave alone.

    >>> sorted(flags_given(["--paths", "3", "--no-lora", "--max-new-tokens=9", "x"]))
    ['max_new_tokens', 'no_lora', 'paths']
    """
    return {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}


def save_config(config, folder: str | Path, name: str = "config.json", extra: dict | None = None) -> Path:
    """Write the resolved config next to a run's outputs, with `extra` entries (say the stages)."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(config) | (extra or {}), indent=2) + "\n")
    return path
