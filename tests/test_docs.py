"""What the docs tell a reader, checked against the code: a command they print does what their
words say (its flags are the script's, it resolves to stages the recipe has, a stage folder it
names is one a command writes), a count or figure they give is the one the code or the record
makes, and the README stays a tutorial: in order, short, its jargon defined."""

import ast
import builtins
import contextlib
import importlib.util
import inspect
import io
import json
import random
import re
import shlex
import statistics
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import eval as eval_script
import export as export_script
import sample as sample_script
import train as train_script
from ablations import alternating_spec
from conftest import A_, EOS, NPR_TAGS, P, ROOT, ST_, TAGS, V, bias_logits, follow_bias, npr_writer
from nanopar import NanoparError, grpo
from nanopar.config import parse_config
from nanopar.curriculum import TrainConfig, recipe, select
from nanopar.defaults import real_defaults, resolve
from nanopar.layout import build_layout
from nanopar.policy import Policy
from nanopar.rewards import load_reward_file, schedule_from_string, score
from nanopar.sampler import SamplerSettings, sample
from nanopar.tiny import tiny_qwen_model
from nanopar.toy.task import heldout
from nanopar.toy.teacher import parallel_trace, sequential_trace
from nanopar.trace import parse_trace

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROMPT = [1, 2, 3]


def disjoint_commands() -> list[tuple[str, int, int]]:
    """(file, stride, max path tokens) of every line of the docs that gives `--path-stride N` and
    calls it disjoint; the path budget is the line's `--max-path-tokens`, else the toy's default."""
    found = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            stride, budget = re.search(r"--path-stride (\d+)", line), re.search(r"--max-path-tokens (\d+)", line)
            if stride and "disjoint" in line:
                found.append((doc.name, int(stride[1]), int(budget[1]) if budget else TrainConfig().max_path_tokens))
    return found


def branch_positions(rollout, tags, stride) -> list[list[set[int]]]:
    """Per block of a rollout: the set of positions each branch occupies under the layout."""
    ids = torch.tensor([rollout.prompt_ids + rollout.ids])
    positions = build_layout(ids, tags, "structured", prompt_lengths=[len(rollout.prompt_ids)],
                             path_stride=stride).position_ids[0, len(rollout.prompt_ids):].tolist()
    return [[set(positions[p.start:p.end]) for p in block.paths] for block in rollout.trace.blocks]


def overlapping(blocks: list[list[set[int]]]) -> int:
    """How many pairs of branches of one block share a position."""
    return sum(bool(a & b) for paths in blocks for i, a in enumerate(paths) for b in paths[i + 1:])


def test_a_stride_the_docs_call_disjoint_keeps_the_longest_paths_apart():
    """A model that opens a block at once and never closes a path itself: every path runs to the
    budget and gets an inserted </Path> (`--max-path-tokens` + 2 tokens, the longest the sampler
    writes). At the stride the docs print, no two paths of the block share a position."""
    commands = disjoint_commands()
    assert commands  # the premise: the docs show such a command
    for doc, stride, budget in commands:
        model = tiny_qwen_model(vocab_size=V, seed=0)
        bias_logits(model, {A_: -30.0, EOS: -30.0})
        follow_bias(model, {(PROMPT[-1], P): 30.0})
        settings = SamplerSettings(paths=3, max_path_tokens=budget, max_new_tokens=3 * budget + 8, max_blocks=1, seed=0)
        (rollout,) = sample(model, [PROMPT], Policy(TAGS, path_stride=stride), settings, eos_ids=[EOS])
        lengths = [len(p) for b in rollout.trace.blocks for p in b.paths]
        assert lengths == [budget + 2] * 3, lengths  # the premise: three paths of the longest length
        assert overlapping(branch_positions(rollout, TAGS, stride)) == 0, f"{doc}: --path-stride {stride}"


def test_npr_steps_need_two_more_positions_for_their_label():
    """NPR's steps also hold the forced label "k:" (two tokens here, as in the toy's and Qwen's
    tokenizers): --max-path-tokens + 2 lets a cut step reach its sibling, + 2 + the label does not."""
    model = npr_writer()
    bias_logits(model, {ST_: -30.0, EOS: -30.0})  # a step never closes itself: each runs to the budget
    budget, label = 6, len(NPR_TAGS.labels[0])
    settings = SamplerSettings(paths=3, max_path_tokens=budget, max_new_tokens=200, max_blocks=1, seed=0)
    rollouts = sample(model, [PROMPT] * 16, Policy(NPR_TAGS), settings, eos_ids=[EOS])
    full = [r for r in rollouts if r.trace.blocks and len(r.trace.blocks[0].paths) >= 2
            and {len(p) for p in r.trace.blocks[0].paths} == {budget + 2 + label}]  # every step cut at the budget
    assert len(full) >= 4  # the premise: rounds of several plans whose steps all ran to the budget
    first = lambda r, stride: branch_positions(r, NPR_TAGS, stride)[:1]
    assert sum(overlapping(first(r, budget + 2)) for r in full) > 0
    assert sum(overlapping(first(r, budget + 2 + label)) for r in full) == 0


def test_the_alternating_arms_steps_in_the_results_are_the_schedules():
    """docs/results.md counts the reward ablation's alternating arm: its parallel steps and the
    accuracy steps that remain, against the accuracy arm's, at the rl-hard steps of the command the
    docs give (the default's unless it says otherwise). The table holds a column of the arm's
    schedule; a column of the strict reading of it, which an older run measured, says so."""
    text = " ".join((ROOT / "docs" / "results.md").read_text().split())
    given = re.search(r"`python train\.py --ablations --rl-hard-steps (\d+)[^`]*`", text)
    steps = int(given.group(1)) if given else TrainConfig().rl_hard_steps
    spec = alternating_spec(steps)
    header = re.search(r"\| \(a\) rl-hard's reward \(Unseen\) \| `accuracy` \| `parallel-strict` \| `parallel` \|(.*?)\| ?-{3}",
                       text)  # the alternating columns: the cells up to the separator row
    assert header, "docs/results.md has no reward ablation table"
    columns = re.findall(r"`([^`]+)`", header.group(1))
    assert spec in columns and set(columns) <= {spec, spec.replace("alternating", "alternating-strict", 1)}, columns
    for measured in columns:
        if measured != spec:
            assert f"measured with `{measured}`'s reading" in text, measured
    kinds = [next(iter(schedule_from_string(spec).spec(k))) for k in range(steps)]
    said = re.search(r"the alternating arm's (\d+) parallel steps.*? (\d+) accuracy steps to the accuracy arm's (\d+)", text)
    assert said, "docs/results.md does not count the alternating arm's steps"
    assert tuple(map(int, said.groups())) == (steps - kinds.count("accuracy"), kinds.count("accuracy"), steps)


# ------------------------------------------------------------------ the README as a tutorial

README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
GLOSSARY = ROOT / "docs" / "glossary.md"
README_LINES = 250  # the tutorial stays short: new sections go to docs/ with a one-line pointer
READING_ORDER_BY = 120  # the line by which "Read the code" starts: a reader gets there early
# the README's sections in a tutorial's order (each heading holds these words)
TUTORIAL = ["parallel trace", "Set up", "What `python train.py` does", "Sample the model you trained", "Read the code",
            "Prototype a reward", "One GPU", "Real weights on a CPU", "Several GPUs", "Dependencies and licenses"]
# the jargon the README and the docs use, and the terms the reading order names
GLOSSARY_TERMS = ["structured attention", "the `parallel` reward", "parallel ratio", "acceleration", "tag rows",
                  "strict reading", "PAPO", "Algorithm 1", "Seen / Unseen", "mean@k", "pass@k", "cold start", "GRPO",
                  "multiverse positions", "lane", "zero recompute", "valid parallel trace", "block position",
                  "critical path", "speedup", "self-distilled", "4-bit + LoRA", "vs its start", "stray tag",
                  # what a newcomer meets first, and the final table's own rows
                  "Parallel-R1", "NPR", "trace", "SFT", "RL", "teacher", "the committed teacher", "stage", "run folder",
                  "preset", "T", "K", "KV cache", "GSM8K", "DAPO", "real checkpoint", "GGUF", "wheel", "memory plan",
                  "TRL", "answers found", "truncated", "its reward (vs start)"]
# everyday words the README's prose may write in capitals without a glossary row
EVERYDAY = {"CPU", "CPUs", "GPU", "GPUs", "GB", "GiB", "MiB", "MIT", "PyPI", "JSON", "CI"}
# the core of the reading order: the path of one GRPO step, and the most lines it may take
CORE = ["tags.py", "trace.py", "layout.py", "policy.py", "kvcache.py", "sampler.py", "forward.py", "grpo.py", "rewards.py"]
CORE_LINES = 3000
SCRIPTS = {"train.py": train_script, "eval.py": eval_script, "sample.py": sample_script, "export.py": export_script}


def prose(text: str) -> str:
    """`text` without its fenced code blocks."""
    return re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)


def code_blocks(text: str, language: str = "") -> list[str]:
    """The fenced code blocks of `text` (of `language` only, when given)."""
    return re.findall(rf"^```{language}[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def markdown_table(text: str, first_header: str) -> dict[str, dict[str, str]]:
    """{row label: {column: cell}} of the markdown table whose header starts with `first_header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header}"))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    header = cells(lines[start])
    table = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = cells(line)
        table[row[0]] = dict(zip(header[1:], row[1:]))
    return table


def boxed_table(text: str, first_row: str) -> dict[str, dict[str, str]]:
    """{row label: {column: cell}} of the rich table (as train.py prints it) that holds `first_row`."""
    block = next(b for b in code_blocks(text) if f"│ {first_row}" in b)
    lines = block.splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("┃")).strip("┃").split("┃")]
    return {cells[0]: dict(zip(header[1:], cells[1:]))
            for cells in ([c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│"))}


def test_the_readme_fits_in_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines (at most {README_LINES}): move a section to docs/"


def test_the_readme_runs_in_a_tutorials_order_and_reaches_the_code_early():
    lines = README.read_text().splitlines()
    headings = [(number, line[3:]) for number, line in enumerate(lines, 1) if line.startswith("## ")]
    at = {words: next((n for n, title in headings if words in title), None) for words in TUTORIAL}
    assert None not in at.values(), f"sections missing: {[w for w, n in at.items() if n is None]}"
    assert list(at.values()) == sorted(at.values()), f"sections out of the tutorial's order: {at}"
    assert at["Read the code"] <= READING_ORDER_BY, f"the reading order starts at line {at['Read the code']}"


def test_the_readmes_test_command_is_the_one_ci_runs():
    """.ci/run runs the README's test command: the two lines are the same, byte for byte."""
    (ci,) = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert ci in README.read_text().splitlines()


def glossary() -> dict[str, str]:
    """{term cell: meaning} of docs/glossary.md's table."""
    rows = [line.strip().strip("|").split("|", 1) for line in GLOSSARY.read_text().splitlines() if line.startswith("| ")]
    return {term.strip(): meaning.strip() for term, meaning in rows[1:]}  # the header row left out


def test_the_glossary_defines_the_jargon_and_the_readme_points_to_it():
    """Each listed term is a row of its own (the whole term cell, or one of its comma-separated
    names) with a meaning of more than a few words."""
    meanings = glossary()
    for term in GLOSSARY_TERMS:
        defined = [m for t, m in meanings.items() if term == t or term in t.split(", ")]
        assert defined and len(defined[0]) > 30, f"docs/glossary.md does not define {term!r}"
    opening = README.read_text().split("\n## ")[0]
    assert "(docs/glossary.md)" in opening  # before the first section


def test_every_abbreviation_the_readmes_prose_uses_is_in_the_glossary():
    """A word of the README's prose with two capitals or more (SFT, GRPO, DAPO, LoRA, SmolLM2, ...)
    is named in a term cell of the glossary, or is an everyday one (CPU, GiB): a reader meets no
    abbreviation the glossary does not explain. Code, inline code and link targets are left out."""
    text = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", prose(README.read_text()))
    words = set(re.findall(r"\b[A-Z][A-Za-z0-9]*[A-Z][A-Za-z0-9]*\b", text))
    assert {"SFT", "GRPO", "KV"} <= words  # the premise
    terms = " ".join(glossary())
    missing = sorted(w for w in words - EVERYDAY if not re.search(rf"(?<![\w-]){re.escape(w)}(?![\w])", terms))
    assert not missing, f"docs/glossary.md has no row for {missing}"


def reading_order_files(text: str) -> list[str]:
    """The file names (`x.py`) of a reading order, each at its first mention."""
    names = re.findall(r"\b\w+\.py\b", text)
    return sorted(set(names), key=names.index)


def test_the_core_is_one_grpo_step_of_the_lines_the_readme_says_and_both_reading_orders_agree():
    """The README's reading order opens with the core, the files of one GRPO step, and says how
    many lines they hold (`wc -l`, to the hundred), at most CORE_LINES; nanopar/__init__.py says the
    same number and lists the same files in the same order, core first; every module is listed."""
    text = README.read_text()
    section = text[text.index("## Read the code"):]
    section = section[:section.index("\n## ")]
    trees = [block for block in code_blocks(section) if not block.lstrip().startswith(("G =", "import"))]
    core = [line.split()[0].removeprefix("nanopar/") for line in trees[0].splitlines() if line.startswith("nanopar/")]
    assert core == CORE
    lines = sum((ROOT / "nanopar" / name).read_text().count("\n") for name in CORE)
    assert lines <= CORE_LINES, f"the core holds {lines} lines"
    said = f"{round(lines, -2):,} lines"
    assert re.search(rf"\*\*The core: one GRPO step, {said}\*\*", section), f"the README should say {said}"
    init = importlib.import_module("nanopar").__doc__
    assert f"one GRPO step, {said}" in init
    readme_order = reading_order_files("\n".join(trees))
    assert readme_order == reading_order_files(init), "the README's reading order and nanopar/__init__.py's differ"
    assert readme_order[:len(CORE)] == CORE
    modules = {p.name for p in (ROOT / "nanopar").glob("*.py")}
    assert not sorted(modules - set(readme_order)), "modules missing from the reading order"


def command_lines(doc: Path) -> list[str]:
    """The lines of `doc` that may hold a command: those of its code blocks (a line that ends in a
    backslash joined to the next) and its inline code spans."""
    text = doc.read_text()
    lines = [line for block in code_blocks(text) for line in block.replace("\\\n", " ").splitlines()]
    return lines + re.findall(r"`([^`]+)`", " ".join(prose(text).split()))


def script_commands(doc: Path) -> list[tuple[str, list[str]]]:
    """(script, its arguments) of every `python train.py|eval.py|sample.py ...` and `torchrun ...
    script ...` in `doc`, comments cut, once each."""
    found = []
    for line in command_lines(doc):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # not a shell line (an apostrophe in a code block's prose)
            continue
        parts = [[]]
        for word in words:
            parts.append([]) if word in ("&&", ";", "|") else parts[-1].append(word)
        for part in parts:
            for i, word in enumerate(part):
                if word in SCRIPTS and i and (part[i - 1] == "python" or "torchrun" in part[:i]):
                    if (word, part[i + 1:]) not in found:
                        found.append((word, part[i + 1:]))
    return found


def all_commands() -> list[tuple[str, str, list[str]]]:
    """(doc name, script, arguments) of every script command in the README and the docs, but
    `--help`, `--help-all` and those with a `...` placeholder."""
    return [(doc.name, script, argv) for doc in DOCS for script, argv in script_commands(doc)
            if not {"--help", "--help-all"} & set(argv) and "..." not in argv]


def help_flags(script: str) -> set[str]:
    """The flags `python <script> --help-all` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        SCRIPTS[script].main(["--help-all"])
    text = out.getvalue()
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text[text.index("options:"):]))


def resolved(script: str, argv: list[str]):
    """What the script makes of `argv` before it loads a model: its config, resolved as the script
    resolves it, and for train.py the recipe's stages (None where there are none to name)."""
    if script == "train.py":
        config = train_script.resolved_config(argv)[0]
        if config.plot or config.ablations:
            return config, None
        stages = recipe(config)
        select(stages, config.stages)  # an unknown stage name fails here, as in open_run
        return config, stages
    if script == "export.py":  # its checks need the checkpoint on disk: the flags alone here
        return parse_config(export_script.ExportConfig, argv), None
    kind = eval_script.EvalConfig if script == "eval.py" else sample_script.SampleConfig
    config = parse_config(kind, argv, real_defaults=real_defaults())
    if not (getattr(config, "compare", ()) or getattr(config, "rescore", "")):  # eval.py reads files and exits
        resolve(config, argv)
    return config, None


def test_every_command_in_the_docs_uses_flags_its_script_lists():
    """Each flag of each `python train.py|eval.py|sample.py` command in the README and the docs is
    one the script's --help-all lists (argparse would take an abbreviation; a reader would not find it)."""
    commands = all_commands()
    assert sum(doc == "README.md" for doc, _, _ in commands) >= 10  # the premise: the README's commands are found
    listed = {script: help_flags(script) for script in SCRIPTS}
    unknown = [(doc, script, word) for doc, script, argv in commands for word in argv
               if word.startswith("--") and word.split("=")[0] not in listed[script]]
    assert not unknown, unknown


def test_every_command_in_the_docs_resolves_to_valid_stages_without_a_model():
    """The arguments parse, resolve (preset, a real model's defaults, placeholders) and, for
    train.py, name stages the recipe has: what the script does before any model loads."""
    for doc, script, argv in all_commands():
        try:
            resolved(script, argv)
        except (NanoparError, SystemExit) as error:
            pytest.fail(f"{doc}: {script} {shlex.join(argv)}: {error}")


def stage_folders() -> dict[tuple[str, str], tuple]:
    """{(run folder, stage folder): (the run's config, the stage)} of every train.py command in
    the README and the docs."""
    folders = {}
    for _, script, argv in all_commands():
        if script == "train.py":
            config, stages = resolved(script, argv)
            for number, stage in enumerate(stages or [], 1):  # as Runner.folder numbers them
                folders[(config.out, f"{number}-{stage.name}")] = (config, stage)
    return folders


STAGE_PATH = r"(runs/[\w.\-/]+?)/(\d+-[a-z][a-z-]*)/final"


def test_every_stage_folder_the_docs_name_is_one_their_commands_write():
    """A path `runs/<run>/<n>-<stage>/final` in the README or the docs is a stage folder that one
    of their train.py commands writes (a real model's stages are 1-sft, 2-rl-easy, ...: no
    pretrain; a run's folder is its --out)."""
    written = stage_folders()
    named = {(doc.name, *m) for doc in DOCS for m in re.findall(STAGE_PATH, " ".join(doc.read_text().split()))}
    assert any(doc == "README.md" for doc, _, _ in named)  # the premise
    missing = sorted((doc, f"{out}/{folder}") for doc, out, folder in named if (out, folder) not in written)
    assert not missing, f"no command of the docs writes these: {missing}"


def test_an_evaluation_of_a_trained_stage_reads_it_with_the_prompt_it_was_trained_with(tmp_path):
    """eval.py and sample.py commands on a stage's `final/`: with a checkpoint saved as the runner
    saves one, the command resolves to the stage's prompt and attention mode."""
    written, checked = stage_folders(), 0
    for doc, script, argv in all_commands():
        if script in ("train.py", "export.py"):
            continue
        given = parse_config(eval_script.EvalConfig if script == "eval.py" else sample_script.SampleConfig, argv)
        match = re.fullmatch(STAGE_PATH, given.model)  # eval.py's default model is the toy run's last stage
        if getattr(given, "compare", ()) or getattr(given, "rescore", "") or not match or match.groups() not in written:
            continue
        config, stage = written[match.groups()]
        folder = tmp_path / given.model
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run_config.json").write_text(json.dumps(  # as Runner.train saves it with each checkpoint
            vars(config) | {"stage": stage.name, "mode": stage.mode, "instructions": stage.instructions}))
        argv = [str(folder) if word == given.model else word for word in argv]
        argv += [] if str(folder) in argv else ["--model", str(folder)]
        evaluated, _ = resolved(script, argv)
        where = f"{doc}: {script} --model {given.model}"
        assert (evaluated.instructions, evaluated.mode) == (stage.instructions, stage.mode), where
        checked += 1
    assert checked >= 4  # the premise: the README's evaluations of the toy run and a real model's


def test_the_grpo_step_the_readme_shows_is_grpo_steps_own_code_and_names_what_it_uses():
    """Each statement of the README's "loop in one screen" is one of `grpo_step`'s, and every name
    it reads is assigned before it, a module name of grpo.py, or an argument of `grpo_step` that
    the sentence before the code names."""
    text = README.read_text()
    snippet = next(block for block in code_blocks(text, "python") if "grpo_update(" in block)
    head = text[:text.index(snippet)]
    before = head[:head.rindex("```")].strip().rsplit("\n\n", 1)[-1]  # the paragraph that introduces it
    own = {ast.unparse(node) for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(grpo.grpo_step))))
           if isinstance(node, ast.stmt)}
    arguments, assigned = set(inspect.signature(grpo.grpo_step).parameters), set()
    for statement in ast.parse(snippet).body:
        assert ast.unparse(statement) in own, f"not a line of grpo_step: {ast.unparse(statement)}"
        bound = {n.id for c in ast.walk(statement) if isinstance(c, ast.comprehension) for n in ast.walk(c.target)
                 if isinstance(n, ast.Name)}  # a comprehension's own variables
        if isinstance(statement, ast.FunctionDef):  # a helper written inside grpo_step: its arguments and locals
            bound |= {a.arg for a in statement.args.args} | {n.id for n in ast.walk(statement)
                                                              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        read = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for name in read - bound - assigned - set(vars(grpo)) - set(dir(builtins)):
            assert name in arguments, f"the README's GRPO step reads {name!r} and never defines it"
            assert f"`{name}`" in before, f"the README's GRPO step reads the argument {name!r} and does not name it"
        assigned |= {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assigned |= {statement.name} if isinstance(statement, ast.FunctionDef) else set()


def test_the_readmes_reward_example_pays_on_the_toy_what_accuracy_does_not(tmp_path, registry):
    """The reward the README prototypes, loaded from its code as `--reward-file` loads it and
    scored on the toy teacher's correct traces: unlike `accuracy` (and unlike a length cap the toy's
    short answers never reach) it tells them apart, and it pays what the README says it pays."""
    text = README.read_text()
    (code,) = [block for block in code_blocks(text, "python") if "@register(" in block]
    (tmp_path / "my_rewards.py").write_text(code)
    (name,) = load_reward_file(str(tmp_path / "my_rewards.py"))
    assert f"--reward {name}" in text and re.search(rf'--easy-reward "[^"]*\b{name}:', text)  # the commands use it
    rng, paid = random.Random(0), {sequential_trace: [], parallel_trace: []}
    for problem in heldout("easy", 40):
        for write in paid:
            response = write(problem, rng)
            result = score(name, response, parse_trace(response), problem)
            assert result.grade.correct  # the premise: the teacher's answers are right
            paid[write].append(result.total)
    assert set(paid[sequential_trace]) == {0.0} and min(paid[parallel_trace]) > 0
    said = re.search(r"teacher's kind of block ~(\d\.\d+), one at rl-easy's mean acceleration \((\d\.\d+)\) ~(\d\.\d+)",
                     " ".join(prose(text).split()))
    assert said, "the README no longer says what the reward pays"
    teacher, acceleration, there = map(float, said.groups())
    assert abs(statistics.median(paid[parallel_trace]) - teacher) < 0.05
    table = markdown_table(text, "held-out, T = 1")
    assert float(table["easy acceleration of responses with a block"]["rl-easy"]) == acceleration
    assert round(1 - 1 / acceleration, 1) == there


# ------------------------------------------------------------------ figures that must agree

def same(cell: str) -> str:
    """A table cell as a value: signs, dashes and bold made alike."""
    return cell.replace("**", "").replace("−", "-").replace("—", "-").strip()


def test_the_readmes_table_is_the_results_table_and_the_shipped_bases_evaluation():
    """The README's headline rows are docs/results.md's table, cell for cell (where a model has no
    block the README writes —, the table - or 1.00), and the base's accuracy cells are its shipped
    eval.json's."""
    ours = markdown_table(README.read_text(), "held-out, T = 1")
    results = boxed_table(RESULTS.read_text(), "easy: accuracy ")
    rows = {f"{level}{ours_row}": f"{level}: {results_row}" for level in ("easy", "hard") for ours_row, results_row in
            ((" accuracy", "accuracy"), (": vs its start", "vs its start"), (": vs baseline", "vs baseline"),
             (" parallel ratio", "parallel ratio"),
             (" acceleration of responses with a block", "accel. with block"))}
    compared = 0
    for row, cells in ours.items():
        for column, cell in cells.items():
            theirs = same(results[rows[row]][column])
            assert same(cell) == theirs or (same(cell) == "-" and "accel" in rows[row] and theirs == "1.00"), (row, column)
            compared += 1
    assert compared >= 40
    shipped = json.loads((ROOT / "nanopar" / "toy" / "bases" / "parallel-r1" / "eval.json").read_text())["results"]
    for level in ("easy", "hard"):
        assert same(ours[f"{level} accuracy"]["pretrain (shipped)"]) == f"{shipped[f'toy:{level}:heldout']['accuracy']:.1%}"


def test_the_shipped_bases_accuracy_is_given_with_the_problems_it_is_over():
    """Wherever the docs give the Parallel-R1 base's easy and hard accuracy, the held-out count
    nearest to it (256: a run's evaluation, the base's shipped eval.json; 560: every problem, the
    bases' README) says which it is, and the figures are that source's."""
    shipped = json.loads((ROOT / "nanopar" / "toy" / "bases" / "parallel-r1" / "eval.json").read_text())["results"]
    row = next(line for line in (ROOT / "nanopar" / "toy" / "bases" / "README.md").read_text().splitlines()
               if line.startswith("| `parallel-r1`"))
    source = {"256": tuple(f"{shipped[f'toy:{level}:heldout']['accuracy']:.1%}"[:-1] for level in ("easy", "hard")),
              "560": tuple(re.findall(r"(\d+\.\d)% ±", row))}
    said = 0
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        for m in re.finditer(r"(\d+\.\d)% (?:of the )?easy and (\d+\.\d)% (?:of the )?hard", text):
            start = max(0, m.start() - 120)
            counts = sorted((m.start() - at if at < m.start() else at - m.end(), c[1])  # (characters away, count)
                            for c in re.finditer(r"\b(256|560)\b", text[start:m.end() + 120]) for at in [start + c.start()])
            assert counts, f"{doc.name}: {m[0]} without the problems it is over"
            nearest = counts[0][1]
            assert m.groups() == source[nearest], f"{doc.name}: {m[0]} over {nearest} problems; the source says {source[nearest]}"
            said += doc == README
    assert said  # the README explains its 50.9% against the 45.2% found elsewhere


def test_where_the_block_goes_in_the_results_prose_is_what_its_table_says():
    text = RESULTS.read_text()
    table = boxed_table(text, "easy: accuracy ")
    bullet = " ".join(text[text.index("**where the block goes**"):].split("\n- ")[0].split("\n\n")[0].split())
    said = re.findall(r"\b0\.\d\d\b", bullet)[:6]
    assert said == [table[f"{level}: block position"][stage] for level in ("easy", "hard")
                    for stage in ("sft", "rl-easy", "rl-hard")]


def test_the_docs_give_the_logits_chunk_the_library_uses(monkeypatch):
    """Every "N positions" of the docs is the chunked head's default on Qwen's vocabulary (with
    the six tags), as bench/memory.py computes it from nanopar.head.CHUNK_BYTES."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as `python bench/memory.py` has it: its helpers beside it
    spec = importlib.util.spec_from_file_location("memory_docs", ROOT / "bench" / "memory.py")
    plan = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (dataclasses look their module up)
    spec.loader.exec_module(plan)
    given = [(doc.name, int(n)) for doc in DOCS for n in re.findall(r"\b(\d+) positions", " ".join(doc.read_text().split()))]
    assert given  # the premise: docs/gpu.md gives it
    assert all(n == plan.DEFAULT_CHUNK for _, n in given), (plan.DEFAULT_CHUNK, given)


def test_every_figure_the_readme_gives_is_in_the_docs_it_summarises():
    """A net, not a proof: each decimal figure of the README's prose and tables occurs in docs/,
    bench/README.md or the bases' README, so the README adds no figure of its own."""
    text = prose(README.read_text()).replace("−", "-")
    record = " ".join(p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
                                               ROOT / "nanopar" / "toy" / "bases" / "README.md"]).replace("−", "-")
    figures = set(re.findall(r"(?<![\w.])\d+(?:,\d{3})*\.\d+(?![\w.])", text))
    assert len(figures) > 30  # the premise
    assert not sorted(f for f in figures if f not in record)


def test_the_seed_tables_means_are_its_rows_and_its_seed_0_is_the_documented_default_run():
    """docs/results.md "Across seeds": each run's "mean (SD)" row is the mean and the standard
    deviation of its seed rows, column by column (accuracies: the mean of each level), and the
    default's seed 0 is the run of the boxed table, "vs baseline" cell for cell."""
    text = RESULTS.read_text()
    table = markdown_table(text, "run, seed")
    numbers = lambda cell: [float(x) for x in re.findall(r"-?\d+\.\d+", same(cell))]
    runs: dict[str, dict] = {}
    for label, cells in table.items():
        run = runs.setdefault(same(label).split(",")[0], {"seeds": [], "mean": None})
        if "mean (SD)" in label:
            run["mean"] = cells
        else:
            run["seeds"].append(cells)
    assert set(runs) == {"default", "long", "committed"} and all(run["mean"] for run in runs.values())
    checked = 0
    for name, run in runs.items():
        for column in ("final easy / hard", "baseline easy / hard"):  # two accuracies a cell, each averaged
            for level in (0, 1):
                mean = statistics.fmean(numbers(cells[column])[level] for cells in run["seeds"])
                assert abs(numbers(run["mean"][column])[level] - mean) < 0.051, (name, column, level)
                checked += 1
        for column in ("vs baseline, easy", "vs baseline, hard", "rl-easy vs its start, easy"):  # "x ± se" a seed
            values = [numbers(cells[column])[0] for cells in run["seeds"]]
            mean, sd = numbers(run["mean"][column])
            assert abs(mean - statistics.fmean(values)) < 0.051 and abs(sd - statistics.stdev(values)) < 0.051, (name, column)
            checked += 1
    assert checked == 3 * 7
    boxed = boxed_table(text, "easy: accuracy ")
    seed_0 = table["default, 0"]
    assert same(seed_0["vs baseline, easy"]) == same(boxed["easy: vs baseline"]["rl-hard"])
    assert same(seed_0["vs baseline, hard"]) == same(boxed["hard: vs baseline"]["rl-hard"])
