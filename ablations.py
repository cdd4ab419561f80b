"""Parallel-R1's ablations as one command: `python train.py --ablations`.

Eight arms, each an ordinary run of the Parallel-R1 recipe in its own folder under
`<out>/ablations/<arm>/` (config.json, metrics.jsonl, numbered stage folders), all from one
pretrained base and the same RL budget. An arm that starts where another left off points its
`--model` at that arm's stage `final/` and leaves the recipe's stages up to it out (`--skip`),
so a stage is trained once and shared, never retrained:

    arm                     mode        rl-easy  rl-hard reward      positions  starts from
    unseen                  structured  yes      accuracy            shared     --model (its own pretrain, sft)
    unseen-parallel-strict  structured  yes      parallel-strict     shared     unseen's rl-easy
    unseen-parallel         structured  yes      parallel            shared     unseen's rl-easy
    unseen-alternating      structured  yes      alternating (20%)   shared     unseen's rl-easy
    unseen-no-rl-easy       structured  no       accuracy            shared     unseen's sft
    seen                    causal      yes      accuracy            -          unseen's pretrain (its own sft)
    seen-no-rl-easy         causal      no       accuracy            -          seen's sft
    unseen-disjoint         structured  yes      accuracy            disjoint   unseen's pretrain (its own sft)

and three tables, one per ablation, each column an arm's last stage (rl-hard) as train.py's
table shows a stage (`nanopar.show.stage_table`: held-out accuracy on easy and hard, parallel ratio,
block position, acceleration, ...), with the paper's numbers beside ours where it gives them:
(a) the rl-hard reward (unseen, unseen-parallel-strict, unseen-parallel, unseen-alternating; the
paper's parallel ratio 13.6% / 80.3% / 63.0%, its 80.3% beside the released `parallel`, whose code it ran), (b) stage-1 RL for Seen and Unseen (the paper: without it Seen loses 2.3
points of final accuracy; with it Unseen loses 8.6), (c) shared vs disjoint path positions.
Every run is resumable as any run is (`Runner.run` skips a stage whose `final/` exists, resumes
one from its last checkpoint; `HeldOut.evaluate` reuses an eval.json whose key matches): killed at any
moment, the same command continues where it stopped. Every arm is checked (`RunInputs.check`)
before any model loads. The tables read only the arms' saved files (`results.py`).

Its measured time and results: docs/results.md.

Where it departs from the papers:
- The alternating schedule is Parallel-R1's 8-of-10 as its released code runs it (accuracy for 8
  steps, `accuracy_parallel_bonus` for 2: 1.2 correct with a block its format check passes, 1.0
  correct without one, -1 otherwise) scaled to rl-hard's steps so that both rewards occur and
  alternate: the same 20% share, in windows of 10 when the stage holds two of them, else of 5
  (one parallel step), else of the whole stage (its last step parallel): `alternating_spec`.
- The reward ablation runs in Unseen (structured), as the paper's does: its parallel ratios
  13.6% (accuracy) and 63.0% (alternating) are its Parallel-R1-Unseen (S1) and (S2) results. Those
  runs start RL on DAPO from the cold start (verl/training_scripts/rl_exp_s1.sh, rl_exp_s2.sh); the
  arms here start rl-hard from unseen's rl-easy model, so that all four share one stage 1 (the
  released start is `--preset unseen`, docs/recipes.md), and the table's caption says so. The
  paper's numbers come from its math benchmarks (AIME, AMC, MATH); ours are the toy's held-out
  sets, the paper's beside our hard set.
- Shared vs disjoint positions is not an ablation of either paper (Multiverse's, NPR's and
  Parallel-R1's released code share positions, the Parallel-R1 write-up gives each path its
  own); positions are learnt in SFT, so
  the disjoint arm has its own cold start (sft, rl-easy, rl-hard) from the same pretrained
  base. So have the Seen arms: SFT trains in the run's mode.
What it leaves out: the NPR recipe, --baseline, --stages; a cold start distilled by the run
(--sft-data ""): each mode's SFT would distil its own traces, not share them (give ready traces).
Several seeds: one seed; each table's title gives the largest standard error of its accuracy
cells (a measured run's: docs/results.md), and a difference under about two of them is noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nanopar import NanoparError
from nanopar.config import flags_given
from nanopar.curriculum import TrainConfig, recipe
from nanopar.data import read_jsonl
from nanopar.evaluation import paired_difference
from nanopar.results import saved_evaluation, stage_result
from nanopar.runner import Runner, open_run
from nanopar.show import metric_cell, set_label, stage_table


@dataclass(frozen=True)
class Arm:
    """One run of the ablations: the flags it changes and the stage it starts after."""

    name: str  # its run folder under <out>/ablations/
    what: str  # one line for the plan
    changes: dict = field(default_factory=dict)  # TrainConfig fields set over the command's flags
    after: tuple[str, str] | None = None  # (arm, stage): start from that stage's final/, leaving the
    #                                       recipe's stages up to it out; None = the command's --model


def arms(config: TrainConfig) -> list[Arm]:
    """The arms, each after the arm it starts from (the order they run in). The alternating
    schedule and the disjoint stride follow the config's sizes."""
    unseen = {"mode": "structured", "path_stride": 0, "hard_reward": "accuracy"}
    disjoint = config.max_path_tokens + 2  # a path's sampled tokens and its two tags: no two paths share a position
    alternating = alternating_spec(config.rl_hard_steps)  # "alternating:WINDOW:PARALLEL_STEPS"
    return [
        Arm("unseen", "the curriculum: pretrain, sft, rl-easy, rl-hard (accuracy); Unseen, shared positions",
            unseen),
        Arm("unseen-parallel-strict", "rl-hard rewarded `parallel-strict` (correct in a valid parallel trace: "
                                      "the write-up)", unseen | {"hard_reward": "parallel-strict"}, after=("unseen", "rl-easy")),
        Arm("unseen-parallel", "rl-hard rewarded `parallel` (correct, a block the released format check passes: "
                               "the released code)", unseen | {"hard_reward": "parallel"}, after=("unseen", "rl-easy")),
        Arm("unseen-alternating", f"rl-hard rewarded `{alternating}` (accuracy; `accuracy_parallel_bonus` on "
                                  f"the last {alternating.split(':')[2]} of every {alternating.split(':')[1]} steps)",
            unseen | {"hard_reward": alternating}, after=("unseen", "rl-easy")),
        Arm("unseen-no-rl-easy", "no stage-1 RL: rl-hard right after sft",
            unseen | {"skip": "rl-easy"}, after=("unseen", "sft")),
        Arm("seen", "Seen (causal): its own sft, rl-easy, rl-hard", unseen | {"mode": "causal"},
            after=("unseen", "pretrain")),
        Arm("seen-no-rl-easy", "Seen, no stage-1 RL: rl-hard right after its sft",
            unseen | {"mode": "causal", "skip": "rl-easy"}, after=("seen", "sft")),
        Arm("unseen-disjoint", f"disjoint positions (stride {disjoint}): its own sft, rl-easy, rl-hard",
            unseen | {"path_stride": disjoint}, after=("unseen", "pretrain")),
    ]


def alternating_spec(steps: int) -> str:
    """Parallel-R1's released alternating reward (2 of every 10 steps parallel) scaled to a stage of
    `steps` steps, so that both rewards occur and alternate: windows of 10 when two fit, else of
    5, else the whole stage with its last step parallel.

    >>> alternating_spec(40), alternating_spec(15), alternating_spec(3)
    ('alternating:10:2', 'alternating:5:1', 'alternating:3:1')
    """
    if steps < 2:
        raise NanoparError(f"--ablations needs --rl-hard-steps >= 2 (the alternating arm has two rewards), not {steps}")
    window = 10 if steps >= 20 else 5 if steps >= 5 else steps
    return f"alternating:{window}:{max(1, window // 5)}"


@dataclass(frozen=True)
class Ablation:
    """One table: its arms as columns, and the paper's numbers for them."""

    title: str  # the table's title
    columns: tuple[tuple[str, str], ...]  # (head, arm)
    note: str  # the caption's first sentence: what the paper's row is, or that there is none
    paper: dict = field(default_factory=dict)  # arm -> the paper's number in the row `paper_row`
    paper_row: str = ""  # the name of the paper's row
    paper_kind: str = "rate"  # "rate" (a share) or "points" (an accuracy difference)
    differences: dict = field(default_factory=dict)  # "with" arm -> "without" arm: our accuracy difference rows


ABLATIONS = [  # the paper's numbers: Parallel-R1's, on its math benchmarks (AIME, AMC, MATH)
    Ablation("(a) Parallel-R1's reward ablation: rl-hard's reward, from the same rl-easy model (Unseen)",
             (("accuracy", "unseen"), ("parallel-strict", "unseen-parallel-strict"), ("parallel", "unseen-parallel"),
              ("alternating", "unseen-alternating")),
             "The paper's parallel ratios are its Parallel-R1-Unseen runs (S1 accuracy, S2 alternating), which start "
             "RL on DAPO from the cold start (rl_exp_s1.sh, rl_exp_s2.sh), on its math benchmarks; these arms start "
             "rl-hard from unseen's rl-easy model (--preset unseen runs the released start): compare the direction "
             "with our hard set's",
             paper={"unseen": 0.136, "unseen-parallel": 0.803, "unseen-alternating": 0.630},
             paper_row="paper: parallel ratio"),
    Ablation("(b) with and without stage-1 RL (rl-easy), Seen and Unseen",
             (("Seen", "seen"), ("Seen, no rl-easy", "seen-no-rl-easy"), ("Unseen", "unseen"),
              ("Unseen, no rl-easy", "unseen-no-rl-easy")),
             "The paper's difference is its math benchmarks' average: compare it with our hard set's",
             paper={"seen": 2.3, "unseen": -8.6}, paper_row="paper: with - without stage 1",
             paper_kind="points", differences={"seen": "seen-no-rl-easy", "unseen": "unseen-no-rl-easy"}),
    Ablation("(c) shared vs disjoint path positions (Unseen)",
             (("shared (stride 0)", "unseen"), ("disjoint", "unseen-disjoint")),
             "No paper number: neither paper ablates it (Multiverse's, NPR's and Parallel-R1's released code "
             "share positions, the Parallel-R1 write-up gives each path its own)"),
]

ARM_FLAGS = ("stages", "skip", "mode", "path_stride", "hard_reward", "baseline")  # what the arms decide


def check(config: TrainConfig, argv: list[str]) -> None:
    """Fail on a combination --ablations cannot run, in one line, before anything else."""
    given = sorted(flags_given(argv) & set(ARM_FLAGS))
    if given:
        raise NanoparError(f"--ablations sets --{given[0].replace('_', '-')} arm by arm: leave it out")
    if config.recipe != "parallel-r1":
        raise NanoparError(f"--ablations runs Parallel-R1's ablations: --recipe parallel-r1, not {config.recipe}")
    if not config.sft_data:
        raise NanoparError("--ablations shares one cold start per mode: give ready traces with --sft-data "
                           "(a distilled cold start would be distilled again in each mode)")
    if config.rl_easy_steps < 1:
        raise NanoparError(f"--ablations compares runs with and without rl-easy: --rl-easy-steps >= 1, "
                           f"not {config.rl_easy_steps}")
    if config.eval_problems < 1:
        raise NanoparError("--ablations compares held-out results: --eval-problems >= 1")
    alternating_spec(config.rl_hard_steps)


def open_arms(config: TrainConfig, console: Console | None = None) -> dict[str, tuple[Arm, Runner, list]]:
    """{arm name: (arm, its Runner, the stages it runs)}, every arm's config resolved and checked
    (`open_run`), in the order they run; nothing is trained or written."""
    opened: dict[str, tuple[Arm, Runner, list]] = {}
    for arm in arms(config):
        if arm.after is not None and arm.after[0] not in opened:
            raise NanoparError(f"arm {arm.name} starts after arm {arm.after[0]}, which is not an earlier arm")
        runner, chosen = open_run(arm_config(config, arm, opened), console)
        opened[arm.name] = (arm, runner, chosen)
    return opened


def arm_config(config: TrainConfig, arm: Arm, opened: dict) -> TrainConfig:
    """The command's config with the arm's changes, its run folder, and where it starts: after
    `arm.after`, --model is that stage's final/ and the recipe's stages up to it are skipped. A
    stage the source run does not have (no pretraining: a real model) is no start: the arm starts
    from --model, as its source did."""
    arm_config = replace(config, out=str(Path(config.out) / "ablations" / arm.name), ablations=False, **arm.changes)
    if arm.after is None:
        return arm_config
    source, name = arm.after
    source_runner = opened[source][1]
    stage = next((s for s in source_runner.stages if s.name == name), None)
    if stage is None:
        return arm_config
    order = [s.name for s in recipe(replace(arm_config, skip=""))]
    if name not in order:
        raise NanoparError(f"arm {arm.name} starts after stage {name}, which its recipe does not have")
    skipped = order[: order.index(name) + 1] + [s for s in arm_config.skip.split(",") if s.strip()]
    return replace(arm_config, model=str(source_runner.folder(stage) / "final"), skip=",".join(skipped))


def run(config: TrainConfig, argv: list[str], console: Console, resolved: dict | None = None) -> Path:
    """Check, open every arm, run them in order (finished stages skipped), print the tables.
    `resolved`: what `defaults.resolve` changed in the command's config (saved with each arm)."""
    check(config, argv)
    opened = open_arms(config, console)
    console.print(plan(opened))
    for arm, runner, chosen in opened.values():
        runner.write_config(resolved)
        console.rule(f"arm {arm.name}: {arm.what}")
        for stage in chosen:
            runner.run(stage)
    for table in tables(opened):
        console.print(table)
    console.print(seconds(opened))
    return Path(config.out) / "ablations"


def plan(opened: dict) -> Table:
    """The arms: what each changes, the stages it trains, where it starts."""
    table = Table(title="--ablations: the arms (each a run under <out>/ablations/<arm>/)")
    for head in ("arm", "what it changes", "trains", "starts from"):
        table.add_column(head, overflow="fold")
    for arm, runner, chosen in opened.values():
        table.add_row(arm.name, arm.what, ", ".join(s.name for s in chosen), runner.config.model)
    return table


def tables(opened: dict) -> list[Table]:
    """One table per ablation: each column an arm's last stage, as train.py's table shows a
    stage, then our differences and the paper's numbers."""
    c = next(iter(opened.values()))[1].config  # the arms share these sizes
    caption = (f"Each column: the last stage of an arm's run, its model evaluated on the first {c.eval_problems} "
               f"held-out problems of each set, {c.eval_samples} samples at T = {c.temperature:g}. Every arm from the "
               f"same pretrained base, the same RL budget: {c.rl_easy_steps} rl-easy steps (none in a 'no rl-easy' "
               f"arm) and {c.rl_hard_steps} rl-hard steps. One seed: a few points are noise.")
    out = []
    for ablation in ABLATIONS:
        columns = [(head, _last_stage(opened, arm)) for head, arm in ablation.columns]
        out.append(stage_table(ablation.title, columns, extra_rows(ablation, opened),
                               caption=f"{ablation.note}. {caption}"))
    return out


def extra_rows(ablation: Ablation, opened: dict) -> dict[str, list[str]]:
    """The rows under an ablation's table: our held-out accuracy with - without rl-easy on each
    set, in points (stage 1), then the paper's number for each arm it reports."""
    arms_ = [arm for _, arm in ablation.columns]
    rows = {}
    if ablation.differences:
        for spec in opened[arms_[0]][1].inputs.eval_sets():
            rows[f"{set_label(spec)}: with - without rl-easy"] = [
                _difference(opened, arm, ablation.differences[arm], spec) if arm in ablation.differences else ""
                for arm in arms_]
    if ablation.paper and ablation.paper_kind == "rate":  # ours beside the paper's, with its standard error
        for spec in opened[arms_[0]][1].inputs.eval_sets():
            rows[f"{set_label(spec)}: parallel ratio ± SE"] = [_ratio(opened, arm, spec) for arm in arms_]
        rows["rl-hard steps with a signal"] = [_signal_steps(opened, arm) for arm in arms_]
    if ablation.paper:
        rows[ablation.paper_row] = [
            "" if arm not in ablation.paper else _points(ablation.paper[arm] / 100)
            if ablation.paper_kind == "points" else metric_cell(ablation.paper[arm], ablation.paper_kind)
            for arm in arms_]
    return rows


def _difference(opened: dict, arm: str, other: str, spec: str) -> str:
    """Held-out accuracy of `arm`'s last stage minus `other`'s on one set (their eval.json), with
    the standard error of the per-problem differences (both see the same problems); without it
    when either result predates per-problem accuracies."""
    with_, without = (_last_evaluation(opened, a)[spec] for a in (arm, other))
    paired = paired_difference(without, with_)
    if paired is None:
        return _points(with_["accuracy"] - without["accuracy"])
    return _points(*paired)


def _ratio(opened: dict, arm: str, spec: str) -> str:
    """An arm's held-out parallel ratio on one set ± its standard error over problems."""
    result = _last_evaluation(opened, arm)[spec]
    error = result.get("parallel_ratio_se")  # None in an eval.json written before it was kept
    return f"{100 * result['parallel_ratio']:.1f}%" + (f" ± {100 * error:.1f}" if error is not None else "")


def _signal_steps(opened: dict, arm: str) -> str:
    """"n of N": the arm's last-stage GRPO steps whose rewards were not all equal in every group
    (a step without a signal is skipped: its reward was never paid, or always)."""
    runner = opened[arm][1]
    name = runner.stages[-1].name
    steps = [r for r in read_jsonl(runner.out / "metrics.jsonl") if r.get("stage") == name and "step" in r]
    return f"{sum(not r.get('skipped_no_signal') for r in steps)} of {len(steps)}"


def _last_stage(opened: dict, arm: str):
    """An arm's last stage as the table shows it (`results.stage_result`: from its files)."""
    runner = opened[arm][1]
    return stage_result(runner.config, runner.stages, runner.stages[-1])


def _last_evaluation(opened: dict, arm: str) -> dict:
    """{data spec: results} of an arm's last stage, from its eval.json ({} without one)."""
    runner = opened[arm][1]
    return saved_evaluation(runner.config, runner.stages, runner.stages[-1]) or {}


def _points(difference: float, error: float | None = None) -> str:
    return f"{100 * difference:+.1f}" + (f" ± {100 * error:.1f}" if error is not None else "") + " pts"


def seconds(opened: dict) -> Table:
    """Seconds of each arm's own stages, from its metrics.jsonl: training (its "done" line), then
    its latest evaluation (a change of evaluation flags evaluates again; that one counts)."""
    table = Table(title="seconds per arm (its own stages; shared ones are counted in the arm that trained them)")
    table.add_column("arm")
    table.add_column("stages: training s (+ evaluation s)", overflow="fold")
    table.add_column("total", justify="right")
    for arm, runner, _ in opened.values():
        log = read_jsonl(runner.out / "metrics.jsonl")
        cells, total = [], 0.0
        for stage in runner.stages:
            train = sum(r["seconds"] for r in log if r.get("stage") == stage.name and r.get("event") == "done")
            evaluation = [r["seconds"] for r in log if r.get("stage") == stage.name and r.get("event") == "eval"][-1:]
            evaluation = evaluation[0] if evaluation else 0.0
            cells.append(f"{stage.name} {train:.0f} (+{evaluation:.0f})")
            total += train + evaluation
        table.add_row(arm.name, ", ".join(cells), f"{total:.0f}")
    return table
