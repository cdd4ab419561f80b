"""Show a rollout as a rich tree: main chain -> parallel block -> paths -> summary.

Used by sample.py, and by training to print a sample trace now and then. Text is decoded span by
span from the token ids, so what you see is exactly what the sampler and the layout read.
Also `rollout_record`, the machine-readable form of a rollout (sample.py --json, eval files),
and the two things every script's display shares: the progress bar and how a metric is written
in a table (`metric_cell`).
"""

from __future__ import annotations

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.tree import Tree

from .trace import trace_stats


def _text(tokenizer, ids: list[int], limit: int) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    text = text if len(text) <= limit else text[: limit // 2] + " … " + text[-limit // 2 :]
    return escape(text.replace("\n", "⏎ "))


def trace_tree(rollout, tokenizer, title: str = "response", limit: int = 400) -> Tree:
    """A rich Tree of one rollout, with per-block statistics."""
    ids, trace = rollout.ids, rollout.trace
    stats = trace_stats(trace)
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
        node = tree.add(
            f"[bold cyan]parallel block[/] at {item.open / max(len(ids), 1):.2f} of the response · "
            f"{len(item.paths)} paths · lengths {lengths} · {'valid' if item.valid else '[red]not valid[/]'}"
        )
        for k, path in enumerate(item.paths):
            node.add(f"[green]path {k + 1}[/] ({len(path)} tok) {_text(tokenizer, ids[path.start:path.end], limit)}")
        if item.summary is not None:
            s = item.summary
            node.add(f"[magenta]summary[/] ({len(s)} tok) {_text(tokenizer, ids[s.start:s.end], limit)}")
    if trace.error:
        tree.add(f"[yellow]reading:[/] {trace.error}")
    return tree


def rollout_record(rollout, tokenizer) -> dict:
    """A JSON-ready dict: ids, text, sampled mask, log-probs, structure (token offsets), stats."""
    trace = rollout.trace
    return {
        "prompt": tokenizer.decode(rollout.prompt_ids, skip_special_tokens=False),
        "prompt_ids": rollout.prompt_ids,
        "ids": rollout.ids,
        "text": tokenizer.decode(rollout.ids, skip_special_tokens=False),
        "sampled": rollout.sampled,
        "logprobs": rollout.logprobs,
        "finish": rollout.finish,
        "structure": {
            "main": [[m.start, m.end] for m in trace.main],
            "blocks": [
                {
                    "open": b.open,
                    "close": b.close,
                    "paths": [[p.start, p.end] for p in b.paths],
                    "summary": None if b.summary is None else [b.summary.start, b.summary.end],
                    "valid": b.valid,
                }
                for b in trace.blocks
            ],
            "stray": trace.stray,
            "truncated": trace.truncated,
        },
        "stats": vars(rollout.stats),
    }


def progress(console=None) -> Progress:
    """The progress bar of every long job: description, bar, done/total, elapsed time."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


def metric_cell(value, kind: str) -> str:
    """A metric as a table shows it: kind "rate" (a percentage), "number" or "count"; "-" if absent.

    >>> metric_cell(0.125, "rate"), metric_cell(1.5, "number"), metric_cell(6619.4, "count"), metric_cell(None, "rate")
    ('12.5%', '1.50', '6,619', '-')
    """
    if not isinstance(value, (int, float)):
        return "-"
    return {"rate": f"{value:.1%}", "number": f"{value:.2f}", "count": f"{value:,.0f}"}[kind]
