"""What the docs tell a reader, checked against the code: a command they print does what their
words say, and a count they give is the count the code makes."""

import re

import torch

from ablations import alternating_spec
from conftest import A_, EOS, NPR_TAGS, P, ROOT, ST_, TAGS, V, bias_logits, follow_bias, npr_writer
from nanopar.curriculum import TrainConfig
from nanopar.layout import build_layout
from nanopar.policy import Policy
from nanopar.rewards import schedule_from_string
from nanopar.sampler import SamplerSettings, sample
from nanopar.tiny import tiny_qwen_model

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
    """docs/results.md counts the reward ablation's alternating arm: its parallel steps (skipped,
    every reward -1) and the accuracy steps that remain, against the accuracy arm's, at the
    rl-hard steps of the command the docs give (the default's unless it says otherwise)."""
    text = " ".join((ROOT / "docs" / "results.md").read_text().split())
    given = re.search(r"`python train\.py --ablations --rl-hard-steps (\d+)[^`]*`", text)
    steps = int(given.group(1)) if given else TrainConfig().rl_hard_steps
    spec = alternating_spec(steps)
    kinds = [next(iter(schedule_from_string(spec).spec(k))) for k in range(steps)]
    assert f"`{spec}`" in text  # the table's column is this schedule
    said = re.search(r"the alternating arm's (\d+) parallel steps.*? (\d+) accuracy steps to the accuracy arm's (\d+)", text)
    assert said, "docs/results.md does not count the alternating arm's steps"
    assert tuple(map(int, said.groups())) == (kinds.count("parallel"), kinds.count("accuracy"), steps)
