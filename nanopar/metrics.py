"""What a training step reports: rollout statistics, a JSON Lines log, and the plot of a run.

`rollout_metrics` turns a step's rollouts and rewards into the numbers the papers track:
reward (total and by component), accuracy, answer-parse failures, parallel ratio (responses
with at least one valid block), mean relative position of `<Parallel>` (Parallel-R1's drift
from ~0.4 to ~0.8), blocks and paths per response, response length, truncation rate, the
fraction of groups whose rewards are all equal (they teach GRPO nothing), and acceleration
(total tokens / critical-path tokens). `plot_metrics` draws a metrics file as a PNG.
Not here: the loss-side numbers (grpo.py returns them).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

from .trace import trace_stats


def rollout_metrics(rollouts, results, group_size: int) -> dict:
    """Means over one step's rollouts; `results[i]` is rewards.score's result for rollouts[i]."""
    stats = [trace_stats(r.trace) for r in rollouts]
    positions = [p for s in stats for p in s.relative_positions]
    paths = [n for s in stats for n in s.paths_per_block]
    totals = [res.total for res in results]
    groups = [totals[i : i + group_size] for i in range(0, len(totals), group_size)]
    metrics = {
        "reward": fmean(totals),
        "accuracy": fmean(res.grade.correct for res in results),
        "parse_failures": fmean(res.grade.error is not None for res in results),
        "parallel_ratio": fmean(s.has_parallel for s in stats),
        "relative_position": fmean(positions) if positions else None,
        "blocks_per_response": fmean(s.blocks for s in stats),
        "paths_per_block": fmean(paths) if paths else None,
        "response_length": fmean(len(r.ids) for r in rollouts),
        "truncation_rate": fmean(r.finish == "length" for r in rollouts),
        "zero_variance_groups": fmean(max(g) == min(g) for g in groups),
        "acceleration": sum(len(r.ids) for r in rollouts) / max(sum(s.critical_path for s in stats), 1),
    }
    for name in results[0].components if results else []:
        metrics[f"reward/{name}"] = fmean(res.components[name] for res in results)
    return metrics


class MetricsLog:
    """Append one JSON object per line, flushed, so a crash loses at most the current step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def drop_after(self, stage: str, step: int) -> None:
        """On resume: forget lines of `stage` past `step` (written after the last checkpoint)."""
        if not self.path.exists():
            return
        records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        kept = [r for r in records if not (r.get("stage") == stage and r.get("step", 0) > step)]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))


PLOTTED = ("reward", "accuracy", "parallel_ratio", "relative_position")


def plot_metrics(jsonl: str | Path, png: str | Path) -> Path:
    """Reward, accuracy, parallel ratio and relative position of <Parallel> over steps, by stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(jsonl).read_text().splitlines() if line.strip()]
    records = [r for r in records if "reward" in r]  # RL steps
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4 * len(PLOTTED), 3.2))
    offset, stages = 0, list(dict.fromkeys(r["stage"] for r in records))
    for stage in stages:
        rows = [r for r in records if r["stage"] == stage]
        x = [offset + r["step"] for r in rows]
        for ax, key in zip(axes, PLOTTED):
            points = [(xi, r[key]) for xi, r in zip(x, rows) if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), label=stage, linewidth=1.2)
        offset = max(x, default=offset)
    for ax, key in zip(axes, PLOTTED):
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("RL step (stages in sequence)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Path(png)
