"""What a training step reports: structure and reward statistics, a JSON Lines log, and its plot.

`structure_metrics` averages responses' structures (`rollouts.response_structure`, read once from
a response's token ids: valid blocks, paths per block, relative position of each `<Parallel>`,
length, critical-path length, finish) into the numbers the papers track: parallel ratio (valid
parallel traces, `format.check_parallel`), mean relative position of `<Parallel>` (Parallel-R1
reports it drifting from ~0.4 to ~0.8), blocks per response, paths per block, the share of each
branch count (NPR: the plans the model chose), acceleration (tokens / critical-path tokens),
length and truncation rate. A GRPO step (`rollout_metrics`) and an evaluation
(`evaluation.summarize`) both call it, so the two cannot count differently; `rollout_metrics`
adds the rewards, accuracy, answer-parse failures and the share of groups whose rewards are all
equal (they teach GRPO nothing: `group_signal`, which `eval.py --rescore` reports too). `MetricsLog` appends a run's lines; `plot_metrics` draws them,
each logged reward component in its own panel, and `plot_folders` several runs in one picture
(train.py --plot a,b).
Not here: the loss-side numbers (grpo.py returns them), the tables (show.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
import statistics
from statistics import fmean

from . import NanoparError, distributed
from .data import read_jsonl, write_jsonl
from .rollouts import response_structure
from .trace import acceleration


def structure_metrics(responses: list[dict]) -> dict:
    """Means over responses (`response_structure` dicts, or evaluation records, which hold them).

    `relative_position`, `paths_per_block` and `branches_per_block` are means over blocks (None
    when there is none), `branch_counts` the share of blocks with each branch count ({"2": 0.75,
    "3": 0.25}; under NPR the plans of each guideline, the model's choice: in structured sampling
    the engine forks that many steps); acceleration is total tokens / total critical-path tokens,
    `block_acceleration` the same over the responses that open at least one block (None without
    one): what the blocks a model writes save, undiluted by the responses that write none.

    >>> plain = {"has_parallel": False, "blocks": 0, "paths_per_block": [], "branches_per_block": [], "relative_positions": [],
    ...          "new_tokens": 10, "critical_path": 10, "finish": "length"}
    >>> block = plain | {"has_parallel": True, "blocks": 1, "paths_per_block": [3], "branches_per_block": [3], "relative_positions": [0.5],
    ...                  "new_tokens": 30, "critical_path": 15, "finish": "eos"}
    >>> m = structure_metrics([block, plain])
    >>> m["parallel_ratio"], m["paths_per_block"], m["acceleration"], m["response_length"], m["truncation_rate"]
    (0.5, 3.0, 1.6, 20.0, 0.5)
    >>> m["branch_counts"], m["block_acceleration"]
    ({'3': 1.0}, 2.0)
    """
    positions = [p for r in responses for p in r["relative_positions"]]
    paths = [n for r in responses for n in r["paths_per_block"]]
    branches = [n for r in responses for n in r["branches_per_block"]]
    counts = Counter(branches)
    with_block = [r for r in responses if r["blocks"]]
    return {
        "parallel_ratio": fmean(r["has_parallel"] for r in responses),
        "relative_position": fmean(positions) if positions else None,
        "blocks_per_response": fmean(r["blocks"] for r in responses),
        "paths_per_block": fmean(paths) if paths else None,
        "branches_per_block": fmean(branches) if branches else None,
        "branch_counts": {str(n): counts[n] / len(branches) for n in sorted(counts)} if branches else None,
        "acceleration": _acceleration(responses),
        "block_acceleration": _acceleration(with_block) if with_block else None,
        "response_length": fmean(r["new_tokens"] for r in responses),
        "truncation_rate": fmean(r["finish"] == "length" for r in responses),
    }


def _acceleration(responses: list[dict]) -> float:
    """`trace.acceleration` over the responses together: their tokens / their critical paths."""
    return acceleration(sum(r["new_tokens"] for r in responses), sum(r["critical_path"] for r in responses))


TIE = 1e-9  # rewards closer than this count as equal (float sums of the same components)


def group_signal(values: list[float], correct: list[bool], groups: list) -> dict:
    """What GRPO sees of a reward, over the groups of two or more responses (`groups[i]` names
    response i's): `groups`, their number; `no_gradient`, the share of them whose rewards are all
    equal (every advantage 0: GRPO learns nothing from them); `group_std`, the mean over them of
    the rewards' population std (the spread GRPO compares within, beside the overall std);
    `agreement`, over the responses whose accuracy advantage (c - group mean of c, c = 0/1) is not
    0, the share whose reward advantage (r - group mean of r) has the same sign: how often the
    reward pushes a response the way accuracy would (a response the reward leaves at 0 disagrees).
    All None without a group of two (one response per problem), `agreement` None without a group
    that holds a right and a wrong answer.

    >>> s = group_signal([1, 0, 0, 0, 2, 2], [True, False, False, True, True, True], ["a", "a", "b", "b", "c", "c"])
    >>> # a: the reward ranks as accuracy does (2 agree); b: flat reward, mixed accuracy (2 disagree); c: all right
    >>> s["groups"], round(s["no_gradient"], 3), s["agreement"], round(s["group_std"], 3)
    (3, 0.667, 0.5, 0.167)
    """
    members: dict = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    chosen = [rows for rows in members.values() if len(rows) >= 2]
    if not chosen:
        return {"groups": 0, "no_gradient": None, "agreement": None, "group_std": None}
    agree = counted = 0
    for rows in chosen:
        reward_signs = _advantage_signs([values[i] for i in rows])
        for sign, accuracy_sign in zip(reward_signs, _advantage_signs([float(correct[i]) for i in rows])):
            if accuracy_sign:
                counted += 1
                agree += sign == accuracy_sign
    return {
        "groups": len(chosen),
        "no_gradient": statistics.fmean(max(values[i] for i in rows) - min(values[i] for i in rows) <= TIE
                                        for rows in chosen),
        "agreement": agree / counted if counted else None,
        "group_std": statistics.fmean(statistics.pstdev([values[i] for i in rows]) for rows in chosen),
    }


def _advantage_signs(values: list[float]) -> list[int]:
    """The sign of each value's advantage over its group's mean (-1, 0, 1; within TIE of it: 0)."""
    mean = statistics.fmean(values)
    return [0 if abs(v - mean) <= TIE else (1 if v > mean else -1) for v in values]


def rollout_metrics(rollouts, results, group_size: int) -> dict:
    """Means over one step's rollouts; `results[i]` is rewards.score's result for rollouts[i]."""
    totals = [res.total for res in results]
    groups = [i // group_size for i in range(len(totals))]  # prompt-major: a prompt's G rollouts
    metrics = {
        "reward": fmean(totals),
        "accuracy": fmean(res.grade.correct for res in results),
        "parse_failures": fmean(res.grade.error is not None for res in results),
        **structure_metrics([response_structure(r) for r in rollouts]),
        "zero_variance_groups": group_signal(totals, [res.grade.correct for res in results], groups)["no_gradient"],
    }
    for name in results[0].components if results else []:
        metrics[f"reward/{name}"] = fmean(res.components[name] for res in results)
    return metrics


class MetricsLog:
    """Append one JSON object per line, flushed, so a crash loses at most the current step. Under
    torchrun only rank 0 writes (its lines are the step's: distributed.py), the others skip."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if not distributed.is_main():
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def drop_after(self, stage: str, step: int) -> None:
        """On resume: forget lines of `stage` past `step` (written after the last checkpoint)."""
        if not self.path.exists() or not distributed.is_main():
            return
        records = read_jsonl(self.path)
        kept = [r for r in records if not (r.get("stage") == stage and r.get("step", 0) > step)]
        write_jsonl(self.path, kept)  # atomic: a kill part-way keeps the whole log


PLOTTED = ("reward", "accuracy", "parallel_ratio", "relative_position")  # then each "reward/<name>" logged
STYLES = ("-", "--", ":", "-.")  # one per run of an overlay


def plot_metrics(jsonl: str | Path, png: str | Path) -> Path:
    """Reward, accuracy, parallel ratio, relative position of <Parallel> and each reward component a
    multi-reward spec logged ("reward/<name>"), over steps, by stage."""
    return plot_runs({"": jsonl}, png)


def plot_runs(runs: dict[str, str | Path], png: str | Path) -> Path:
    """`plot_metrics` of several runs ({name: metrics.jsonl}) in the same panels, a line per
    "<run>/<stage>" (a run named "" labels its stages alone), a line style per run. A component
    panel is drawn when some run logged it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = {name: [r for r in read_jsonl(jsonl) if "reward" in r] for name, jsonl in runs.items()}  # RL steps
    keys = panels(logs.values())
    columns = min(len(keys), 4)
    rows_of_panels = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(4 * columns, 3.2 * rows_of_panels), squeeze=False)
    axes = list(axes.flat)
    for number, (name, records) in enumerate(logs.items()):
        _plot_run(axes, keys, records, name, STYLES[number % len(STYLES)])
    for ax, key in zip(axes, keys):
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("RL step (stages in sequence)")
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.axis("off")
    if any(logs.values()):  # a run of SFT stages alone has no RL step to plot
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Path(png)


def panels(logs) -> list[str]:
    """The keys `plot_runs` draws a panel of: PLOTTED, then each "reward/<name>" some line logged.

    >>> panels([[{"reward": 1, "reward/accuracy": 1}], [{"reward": 0, "reward/format": 0, "reward/accuracy": 0}]])[4:]
    ['reward/accuracy', 'reward/format']
    """
    logged = dict.fromkeys(k for records in logs for r in records for k in r if k.startswith("reward/"))
    return list(PLOTTED) + list(logged)


def _plot_run(axes, keys: list[str], records: list[dict], name: str, style: str) -> None:
    """One run's lines, a line per stage, its stages one after another along the x axis."""
    offset = 0
    for stage in dict.fromkeys(r["stage"] for r in records):
        rows = [r for r in records if r["stage"] == stage]
        x = [offset + r["step"] for r in rows]
        for ax, key in zip(axes, keys):
            points = [(xi, r[key]) for xi, r in zip(x, rows) if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), style, label=f"{name}/{stage}" if name else stage, linewidth=1.2)
        offset = max(x, default=offset)


def plot_folders(folders: list[str | Path]) -> Path:
    """train.py --plot: one run folder's metrics.jsonl as <folder>/metrics.png; several in one
    picture, written to the first as metrics-vs-<the others' names joined by '-'>.png."""
    folders = [Path(f) for f in folders]
    if not folders:
        raise NanoparError("--plot needs a run folder (or several, comma-separated)")
    for folder in folders:
        if not (folder / "metrics.jsonl").is_file():
            raise NanoparError(f"{folder}: no metrics.jsonl there (not a train.py run folder, or nothing logged yet)")
    if len(folders) == 1:
        return plot_metrics(folders[0] / "metrics.jsonl", folders[0] / "metrics.png")
    names = [f.resolve().name for f in folders]
    png = folders[0] / f"metrics-vs-{'-'.join(names[1:])}.png"
    return plot_runs({name: f / "metrics.jsonl" for name, f in zip(_unique(names), folders)}, png)


def _unique(names: list[str]) -> list[str]:
    """Run labels: the folder names, a repeated one numbered (two runs/x/out folders: out, out#2).

    >>> _unique(["a", "b", "a"])
    ['a', 'b', 'a#2']
    """
    seen: Counter = Counter()
    labels = []
    for name in names:
        seen[name] += 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels
