"""What the scripts show: a rollout as a rich tree, progress bars, and the tables of metrics.

`trace_tree`: main chain -> block -> (plans) -> branches side by side -> summary, decoded span by
span from the token ids (exactly what the sampler and the layout read); the same as JSON is
`rollouts.rollout_record`. `progress`: the bar of every long job (plain lines when the output is not a terminal).
`METRIC_ROWS`: the one list of metric rows (name, kind) every table takes its rows from;
`stage_table`: the table of stages of train.py and --ablations, drawn from plain results
(`results.StageResult`); `markdown`: such a table's cells as Markdown (train.py's results.md). Not here: computing metrics or evaluating a model (evaluation.py, heldout.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich import box
from rich.table import Table
from rich.tree import Tree

from .data import source_for
from .trace import trace_stats


def _text(tokenizer, ids: list[int], limit: int) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    text = text if len(text) <= limit else text[: limit // 2] + " … " + text[-limit // 2 :]
    return escape(text.replace("\n", "⏎ "))


def trace_tree(rollout, tokenizer, title: str = "response", limit: int = 400) -> Tree:
    """A rich Tree of one rollout, with per-block statistics: main chain, then each block with its
    plans (NPR), its branches side by side, numbered, and its summary, each named after its tag."""
    ids, trace = rollout.ids, rollout.trace
    schema, stats = trace.schema, trace_stats(trace)
    name = {role: tag.strip("</>") for role, tag in schema.roles().items()}  # "Path", "step", ...
    tree = Tree(
        f"[bold]{title}[/] · {len(ids)} tokens · {stats.blocks} block(s) · "
        f"critical path {stats.critical_path} · acceleration {stats.acceleration:.2f}x · finish {rollout.finish}"
    )
    events = [(m.start, "main", m) for m in trace.main] + [(b.open, "block", b) for b in trace.blocks]
    for _, kind, item in sorted(events, key=lambda e: e[0]):
        if kind == "main":
            tree.add(f"[dim]main[/] {_text(tokenizer, ids[item.start:item.end], limit)}")
            continue
        lengths = [len(p) for p in item.paths]
        plans = "" if item.plans is None else f"{len(item.plans)} plan(s) · "
        verdict = "valid" if item.valid else "well formed, sequential" if item.well_formed else "[red]not valid[/]"
        node = tree.add(
            f"[bold cyan]{name['block_open']} block[/] at {item.open / max(len(ids), 1):.2f} of the response · "
            f"{plans}{len(item.paths)} {name['path_open']}(s) · lengths {lengths} · {verdict}"
        )
        for k, plan in enumerate(item.plans or []):
            node.add(f"[yellow]{name['plan_open']} {k + 1}[/] {_text(tokenizer, ids[plan.start:plan.end], limit)}")
        if item.paths:  # the branches side by side, one column each, as they were decoded
            columns = Table(box=box.ROUNDED, show_lines=False, padding=(0, 1))
            for k, path in enumerate(item.paths):
                columns.add_column(f"[green]{name['path_open']} {k + 1}[/] ({len(path)} tok)", overflow="fold")
            columns.add_row(*[_text(tokenizer, ids[path.start:path.end], limit) for path in item.paths])
            node.add(columns)
        if item.summary is not None:
            s = item.summary
            node.add(f"[magenta]{name['summary_open']}[/] ({len(s)} tok) {_text(tokenizer, ids[s.start:s.end], limit)}")
    if trace.error:
        tree.add(f"[yellow]reading:[/] {trace.error}")
    return tree


def progress(console=None) -> Progress:
    """The progress bar of every long job: description, bar, done/total, elapsed time. When the
    console is not a terminal (output to a log file or a pipe, where rich draws the bars only
    once, at the end) it also prints a plain line per task as it goes (`LoggedProgress`)."""
    return LoggedProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console)


class LoggedProgress(Progress):
    """rich's Progress, plus, on a console that is not a terminal, a plain line per task when it is
    added, each time it passes another tenth of its total (the end included) and, in between, at an
    update `every_s` seconds or more after its last line: "gsm8k: 64/150 (42%), 95 s"."""

    every_s = 30.0

    def __init__(self, *columns, **kwargs):
        super().__init__(*columns, **kwargs)
        self._last_lines: dict = {}  # task id -> (tenth, time, completed) of its last plain line

    def add_task(self, description, *args, **kwargs):
        task_id = super().add_task(description, *args, **kwargs)
        self._line(task_id)
        return task_id

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._line(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._line(task_id)

    def _line(self, task_id) -> None:
        if self.console.is_terminal:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        tenth = int(10 * task.completed / task.total) if task.total else None
        now, last = self.get_time(), self._last_lines.get(task_id)
        new_tenth = last is None or (tenth is not None and tenth != last[0])
        overdue = last is not None and now - last[1] >= self.every_s and task.completed != last[2]
        if not (new_tenth or overdue):
            return
        self._last_lines[task_id] = (tenth, now, task.completed)
        done = f"{task.completed:g}/{task.total:g} ({task.completed / task.total:.0%})" if task.total else f"{task.completed:g}"
        self.console.print(f"{task.description}: {done}, {task.elapsed or 0:.0f} s", markup=False, highlight=False,
                           soft_wrap=True)


def metric_cell(value, kind: str) -> str:
    """A metric as a table shows it: kind "rate" (a percentage), "number", "count" or "shares" (a
    dict of shares, "count:percent" pairs); "-" if absent.

    >>> metric_cell(0.125, "rate"), metric_cell(1.5, "number"), metric_cell(6619.4, "count"), metric_cell(None, "rate")
    ('12.5%', '1.50', '6,619', '-')
    >>> metric_cell({"0": 0.001, "1": 0.25, "2": 0.749}, "shares")
    '0:<1 1:25 2:75'
    """
    if kind == "shares" and isinstance(value, dict):
        return " ".join(f"{n}:{share * 100:.0f}" if share >= 0.005 else f"{n}:<1" for n, share in value.items())
    if not isinstance(value, (int, float)):
        return "-"
    return {"rate": f"{value:.1%}", "number": f"{value:.2f}", "fine": f"{value:.3f}", "count": f"{value:,.0f}"}[kind]


@dataclass(frozen=True)
class Row:
    """One metric as the tables show it."""

    key: str  # its key in evaluation.summarize's dict (or in eval.py's speed numbers)
    name: str  # row name in eval.py's results table and --compare ("@k" becomes the k used)
    kind: str  # how metric_cell writes it: "rate", "number", "fine" (3 decimals), "count" or "shares"
    stage: str = ""  # row name in train.py's table of stages ("" = not there)
    brief: str = ""  # column head in eval.py's line per finished benchmark ("" = not there)
    optional: bool = False  # train.py's table shows it only where some stage has a value


METRIC_ROWS = [  # in the order every table shows them
    Row("problems", "problems", "count"),
    Row("samples", "responses", "count"),
    Row("accuracy", "mean@k (accuracy)", "rate", stage="accuracy", brief="mean@k"),  # the strict reading
    Row("accuracy_se", "  standard error", "rate", stage="accuracy SE"),  # problems as the unit
    Row("accuracy_between", "  variance between problems", "fine"),  # of one grade: variance.split
    Row("accuracy_within", "  variance within a problem", "fine"),
    Row("accuracy_flexible", "  flexible reading", "rate", brief="flexible"),  # + "#### N", the last number
    Row("answers_found", "answers found (strict)", "rate", stage="answers found"),
    Row("answers_found_flexible", "answers found (flexible)", "rate"),
    Row("pass_at_k", "pass@k", "rate", brief="pass@k"),
    Row("parallel_ratio", "parallel ratio", "rate", stage="parallel ratio", brief="parallel"),
    Row("relative_position", "block position", "number", stage="block position"),
    Row("blocks_per_response", "blocks / response", "number"),
    Row("branches_per_block", "branches / block", "number", stage="branches/block"),
    Row("branch_counts", "  blocks by branch count", "shares", stage="branch counts"),
    Row("format_valid", "format valid", "rate", brief="format"),
    Row("parse_failures", "answer parse failures", "rate"),
    Row("parse_failures_flexible", "  flexible reading", "rate"),
    Row("acceleration", "acceleration (x)", "number", stage="acceleration", brief="accel."),
    Row("block_acceleration", "  responses with a block", "number", stage="accel. with block"),
    Row("response_length", "length (tokens)", "number"),
    Row("truncation_rate", "truncated", "rate", stage="truncated"),
    Row("tokens_per_second", "decode tokens/s", "count", brief="tok/s"),
    Row("parallel_tokens_per_second", "  parallel (speedup batches)", "count"),
    Row("sequential_tokens_per_second", "  sequential, same prompts", "count"),
    Row("speedup", "speedup (x)", "number", brief="speedup"),
    Row("seconds", "seconds", "count"),
    # sets whose records carry a reference response (parallel-gsm8k:heldout): its mean log-prob per token
    Row("reference_logprob", "reference log-prob / token", "number", stage="reference log-prob", optional=True),
]
STAGE_ROWS = [row for row in METRIC_ROWS if row.stage]  # train.py's held-out rows, per evaluation set
# and after "accuracy SE": accuracy minus that of the stage it started from, ± the standard error of
# the difference taken problem by problem (points; results.change_over_start)
CHANGE_ROW = "vs its start"
# and after it, with --baseline: a GRPO stage's accuracy minus that of accuracy-only GRPO from the same base
# with the same RL steps (its twin, curriculum.baseline_of), paired the same way: the papers' headline comparison
BASELINE_ROW = "vs baseline"
# and after it: a GRPO stage's own reward, its held-out mean (its change over its start's, paired)
REWARD_ROW = "its reward (vs start)"


def stage_table(title: str, columns: list[tuple], extra: dict[str, list[str]] | None = None,
                caption: str | None = None) -> Table:
    """Stages as columns, each `(head, results.StageResult)` (several runs may share a table): their
    training numbers, then the held-out results of each stage's model, then the `extra` rows, one
    cell per column, as a section of their own (--ablations: the papers' numbers). The title ends
    with the largest standard error of an accuracy cell, so a reader knows which differences are noise."""
    table = Table(title=title, caption=caption)
    table.add_column("", no_wrap=True)
    for head, _ in columns:
        table.add_column(head, justify="right", overflow="fold")
    rows: dict[str, list[str]] = {}
    errors = [result["accuracy_se"] for _, stage in columns for result in stage.results.values()
              if result.get("accuracy_se") is not None]  # the accuracy cells' standard errors
    for _, stage in columns:
        for name, cell in _stage_column(stage).items():
            rows.setdefault(name, []).append(cell)
    optional = {f"{set_label(spec)}: {name}" for _, stage in columns for spec in stage.sets
                for name in [row.stage for row in STAGE_ROWS if row.optional] + [BASELINE_ROW]}
    rows = {name: cells for name, cells in rows.items() if name not in optional or set(cells) != {"-"}}
    last = list(rows)[-1] if rows and extra else None  # the extra rows are a section of their own
    for name, cells in rows.items():
        table.add_row(name, *cells, end_section=name in ("seconds", last))
    for name, cells in (extra or {}).items():
        table.add_row(name, *cells)
    if errors:
        table.title = f"{title}; standard error of an accuracy cell <= {100 * max(errors):.1f} points"
    return table


def trial_table(title: str, rows: list[dict], budget: int) -> Table:
    """`trial.projection`'s rows: what the trial measured and the run's projected time, a total
    below; `budget` is --max-new-tokens, beside the trial's response lengths."""
    table = Table(title=title, box=box.SIMPLE_HEAD,
                  caption=f"timed on the trial's own models: a lower bound where they answer shorter than "
                          f"the run's will (tokens: the trial's mean response, of {budget})")
    for header in ("stage", "steps", "s/step", "tokens", "run steps", "stage s", "eval s", "projected"):
        table.add_column(header, justify="left" if header == "stage" else "right")
    clock = lambda seconds: f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
    number = lambda value, form: "-" if value is None else format(value, form)
    for r in rows:
        table.add_row(r["stage"], str(r["trial_steps"]), number(r["seconds_a_step"], ".1f"),
                      number(r["response_tokens"], ".0f"), number(r["run_steps"], "d"), f"{r['stage_seconds']:.0f}",
                      f"{r['eval_seconds']:.0f}", clock(r["projected_seconds"]))
    table.add_row("the run", "", "", "", "", "", "", clock(sum(r["projected_seconds"] for r in rows)), style="bold")
    return table


def markdown(table: Table) -> str:
    """A rich table as a Markdown table, its title above it and its caption below: the cells the
    terminal shows, read back from the table itself, so the file and the screen cannot differ."""
    def row(cells) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    lines = [f"**{table.title}**", ""] if table.title else []
    lines += [row(column.header for column in table.columns), "|---" + "|---:" * (len(table.columns) - 1) + "|"]
    lines += [row(cells) for cells in zip(*(column.cells for column in table.columns))]
    return "\n".join(lines + (["", str(table.caption)] if table.caption else [])) + "\n"


def _stage_column(stage) -> dict[str, str]:
    """{row name: cell} of one stage: steps, mean reward of its last 5 steps, seconds, then
    STAGE_ROWS per evaluation set (and CHANGE_ROW, BASELINE_ROW, REWARD_ROW after the standard error)."""
    column = {"steps": "-" if stage.steps is None else str(stage.steps),
              "reward (last 5 steps)": metric_cell(stage.reward, "number"),
              "seconds": f"{stage.seconds:.0f}"}
    for spec in stage.sets:
        result = stage.results.get(spec, {})
        for row in STAGE_ROWS:
            column[f"{set_label(spec)}: {row.stage}"] = metric_cell(result.get(row.key), row.kind)
            if row.key == "accuracy_se":  # then the change over the stage it started from, paired
                change = stage.changes.get(spec)
                column[f"{set_label(spec)}: {CHANGE_ROW}"] = _points(change)
                column[f"{set_label(spec)}: {BASELINE_ROW}"] = _points(stage.baseline_changes.get(spec))
                column[f"{set_label(spec)}: {REWARD_ROW}"] = _reward_cell(stage, spec, result)
    return column


def _points(change: tuple[float, float] | None) -> str:
    """A paired difference of accuracies in points, "+9.9 ± 1.4"; "-" for none."""
    return f"{100 * change[0]:+.1f} ± {100 * change[1]:.1f}" if change else "-"


def _reward_cell(stage, spec: str, result: dict) -> str:
    """A GRPO stage's own reward, its held-out mean on `spec`, then (its change over the stage it
    started from ± the standard error, paired); "-" for other stages."""
    mean = (result.get("reward_means") or {}).get(stage.own_reward) if stage.own_reward else None
    if mean is None:
        return "-"
    change = stage.reward_changes.get(spec)
    return f"{mean:.2f} ({change[0]:+.2f} ± {change[1]:.2f})" if change else f"{mean:.2f}"


def set_label(spec: str) -> str:
    """A short name for an evaluation set: a registered source's "toy:easy:heldout" -> "easy"."""
    return spec.split(":")[1] if source_for(spec) is not None else Path(spec).stem
