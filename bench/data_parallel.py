"""Benchmark data parallelism on this CPU: the toy's run in 1 process and in 2 (torchrun), side by side.

    python bench/data_parallel.py                  # the default toy run (python train.py), each way once
    python bench/data_parallel.py --quick          # a short run: 10 SFT + 4 + 2 GRPO steps, 32 held-out problems
    python bench/data_parallel.py --rounds 2       # the two take turns twice; the best of each counts
    python bench/data_parallel.py --no-runs        # the gradient all-reduce alone (seconds)

The two contestants run the same command in a fresh temporary run folder, threads set so that
both use the machine's 2 cores:
  1 process     python train.py ...                             torch threads 2 (OMP_NUM_THREADS=2)
  2 processes   torchrun --nproc_per_node 2 train.py ...        1 thread each (OMP_NUM_THREADS=1), gloo
Measured, from the launch and the run's metrics.jsonl (rank 0's lines, the step's):
  whole run       launch to exit, imports and model loads included
  training, evaluation   the stages' "done" seconds, the held-out evaluations' seconds
  GRPO step       sample + score + update (sample_seconds + train_seconds), mean over the RL steps
  SFT step        train_seconds, mean over the sft stage's steps
  communication   time inside collectives per step (2 processes: communication_seconds, its mean):
                  the transfer *and* the wait for the slower process
  gradient all-reduce   `distributed.all_reduce_gradients` alone on the toy's trainable gradients,
                  2 gloo processes after a barrier: the median of 50 (the transfer, no waiting);
                  beside it one all-reduce per gradient tensor, launched together, the way it
                  was first written (what the flat buckets replaced)
No speed-up is expected here: two processes of one thread share the same 2 cores one process's
two threads use; the table is the overhead of the second process (a second model, imports,
collectives, the slower process waited for). On N GPUs each process has its own device.
The load average is printed beside each contestant: on a shared machine another job's load moves
a run's time far more than by its share. Every timing changes with a re-run: the measured table
lives in docs/distributed.md and bench/README.md, not here.
Not here: GPUs and NCCL (none on this machine), several nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from nanopar.config import parse_config

ROOT = Path(__file__).resolve().parent.parent  # where train.py lives
QUICK = ["--sft-steps", "10", "--rl-easy-steps", "4", "--rl-hard-steps", "2", "--eval-problems", "32",
         "--eval-batch", "16"]  # two sampler calls per evaluated set: one per process
CONTESTANTS = {  # name -> (command before train.py's flags, OMP_NUM_THREADS)
    "1 process x 2 threads": ([sys.executable, "train.py"], "2"),
    "2 processes x 1 thread": ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], "1"),
}


@dataclass
class DistributedBenchConfig:
    quick: bool = False  # a short run instead of the default one (QUICK's flags)
    rounds: int = 1  # runs of each contestant, taking turns; the best whole-run time counts
    flags: str = ""  # more train.py flags, space-separated (e.g. "--baseline")
    keep: str = ""  # a folder to keep the runs in ("" = a temporary one, removed)
    runs: bool = True  # the two runs (--no-runs: the gradient all-reduce alone)


def run_once(command: list[str], threads: str, flags: list[str], out: Path) -> dict:
    """One contestant's run. -> its numbers (seconds), the load average before and after"""
    before = os.getloadavg()[0]
    env = os.environ | {"OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    done = subprocess.run([*command, "--out", str(out), *flags], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    grpo = [m for m in lines if "step" in m and "sample_seconds" in m]
    sft = [m for m in lines if "step" in m and m["stage"] == "sft"]
    mean = lambda values: statistics.fmean(values) if values else None  # noqa: E731
    return {
        "whole run": wall,
        "training": sum(m["seconds"] for m in lines if m.get("event") == "done"),
        "evaluation": sum(m["seconds"] for m in lines if m.get("event") == "eval"),
        "GRPO step": mean([m["sample_seconds"] + m["train_seconds"] for m in grpo]),
        "  of which sampling": mean([m["sample_seconds"] for m in grpo]),
        "  communication": mean([m.get("communication_seconds", 0.0) for m in grpo]),
        "SFT step": mean([m["train_seconds"] for m in sft]),
        "  communication ": mean([m.get("communication_seconds", 0.0) for m in sft]),
        "steps": f"{len(sft)} SFT + {len(grpo)} GRPO",
        "load": (before, os.getloadavg()[0]),
    }


# ---------------------------------------------------------------- the gradient all-reduce alone


def _reduce_gradients(rank: int, port: int, repeats: int, out: str) -> None:
    """One of 2 gloo processes: time the all-reduce of the toy model's trainable gradients."""
    from nanopar import distributed
    from nanopar.model import ModelSettings, load_model

    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    distributed.init("cpu")
    params = [p for p in load_model(ModelSettings("toy:model"))[0].parameters() if p.requires_grad]

    def per_tensor(params):  # one all-reduce per gradient, launched together, then waited for
        for handle in [torch.distributed.all_reduce(p.grad, async_op=True) for p in params]:
            handle.wait()

    seconds = {}
    for name, reduce in (("buckets", distributed.all_reduce_gradients), ("per tensor", per_tensor)) * 2:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            for p in params:
                p.grad = torch.ones_like(p)
            distributed.barrier()
            started = time.perf_counter()
            reduce(params)
            times.append(time.perf_counter() - started)
        seconds[name] = min(seconds.get(name, float("inf")), statistics.median(times[1:]))  # the better turn
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": seconds["buckets"], "per_tensor_seconds": seconds["per tensor"],
                                         "tensors": len(params),
                                         "bytes": sum(p.numel() * p.element_size() for p in params)}))
    distributed.close()


def gradient_all_reduce(folder: Path, repeats: int = 50) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = folder / "all-reduce.json"
    torch.multiprocessing.start_processes(_reduce_gradients, args=(port, repeats, str(out)), nprocs=2,
                                          start_method="spawn")
    return json.loads(out.read_text())


# ---------------------------------------------------------------- the table


def cell(value) -> str:
    return "-" if value is None else value if isinstance(value, str) else f"{value:.3f} s" if value < 10 else f"{value:.0f} s"


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(DistributedBenchConfig, argv, description=__doc__.split("\n")[0])
    console = Console()
    flags = (QUICK if config.quick else []) + config.flags.split()
    folder = Path(config.keep) if config.keep else Path(tempfile.mkdtemp(prefix="nanopar-distributed-"))
    console.print(f"{'train.py ' + (' '.join(flags) or '(the default run)') if config.runs else 'no runs'}; "
                  f"{os.cpu_count()} CPUs; load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    best: dict[str, dict] = {}
    for round_ in range(config.rounds if config.runs else 0):
        for name, (command, threads) in CONTESTANTS.items():
            out = folder / f"{name.split()[0]}-processes-{round_}"
            shutil.rmtree(out, ignore_errors=True)
            numbers = run_once(command, threads, flags, out)
            console.print(f"round {round_ + 1}, {name}: {numbers['whole run']:.0f} s (load "
                          f"{numbers['load'][0]:.1f} -> {numbers['load'][1]:.1f})")
            if name not in best or numbers["whole run"] < best[name]["whole run"]:
                best[name] = numbers
    reduce = gradient_all_reduce(folder)
    console.print(f"gradient all-reduce, {reduce['tensors']} tensors, {reduce['bytes'] / 2**20:.2f} MB, 2 gloo "
                  f"processes: flat buckets {reduce['seconds'] * 1e3:.2f} ms, one per tensor "
                  f"{reduce['per_tensor_seconds'] * 1e3:.2f} ms (medians of 50, the better of 2 turns)")
    if not config.runs:
        console.print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if not config.keep:
            shutil.rmtree(folder)
        return {"all_reduce": reduce}
    names = list(CONTESTANTS)
    table = Table(title=f"the toy's {'quick' if config.quick else 'default'} run, 1 vs 2 processes on "
                        f"{os.cpu_count()} cores (best of {config.rounds})")
    table.add_column("")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("2 / 1", justify="right")
    for key in [k for k in best[names[0]] if k != "load"]:
        one, two = best[names[0]][key], best[names[1]][key]
        ratio = f"{two / one:.2f}" if isinstance(one, float) and isinstance(two, float) and one > 0 else ""
        table.add_row(key, cell(one), cell(two), ratio)
    table.add_row("gradient all-reduce", "-", f"{reduce['seconds'] * 1e3:.2f} ms", "")
    table.add_row("load average (1 min)", *[f"{best[n]['load'][0]:.1f} -> {best[n]['load'][1]:.1f}" for n in names], "")
    console.print(table)
    console.print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not config.keep:
        shutil.rmtree(folder)
    return {"runs": best, "all_reduce": reduce}


if __name__ == "__main__":
    main()
