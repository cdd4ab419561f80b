"""Data parallelism over processes: who this process is, sums over every process, one voice.

    torchrun --nproc_per_node 8 train.py --model Qwen/Qwen2.5-1.5B-Instruct --load-in-4bit
    torchrun --nproc_per_node 2 train.py --device cpu        # the same on a CPU, two processes

`torchrun` starts N copies of a script and tells each its rank (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR / MASTER_PORT in the environment); `init` joins them into one process group: NCCL
when the model is on a GPU (one GPU per process, cuda:LOCAL_RANK), gloo on a CPU. Every process
holds a whole model replica and works on its share of a step: GRPO's prompts (whole groups),
SFT's traces, an evaluation's sampler calls; what must be the step's, not the share's, goes
through the helpers here: `all_reduce` (a sum; `sum_each`: several numbers in one),
`all_reduce_gradients` (the optimiser step), `share` / `unshare` (deal a list out round-robin,
gather it back in its order), `gather` (every rank's object), `barrier`. Rank 0 alone writes
files and prints (`is_main`, `console`, `error_exit`).

Without torchrun (WORLD_SIZE unset or 1) nothing here starts a process group and every helper
returns its input untouched: a single process runs exactly the code and numbers it always did.
This is the one file that imports torch.distributed.

The gradients are summed by an explicit all-reduce in `optim.apply_gradients`, not by wrapping
the model in DDP: the sampler drives the bare model with its own KV cache, micro-batches would
need DDP's `no_sync`, and a process whose rollouts were all dropped runs no backward at all,
which DDP cannot wait out; the cost is a sum that starts after the last backward instead of
overlapping it (docs/distributed.md).

A collective that fails (another process died, or hung up) becomes a one-line NanoparError on the
processes still alive, which the scripts print on rank 0 alone; torchrun's SIGTERM (it ends every
process when one fails) stops a process with the same kind of line. Files are written by rank 0
only, and checkpoints are complete or absent (checkpoint.py), so the same command resumes.
`seconds_communicating` totals the time spent inside collectives (transfer and waiting for the
slowest process), for the step metrics.
Not here: several model replicas per process, sharding one model over GPUs (FSDP, tensor
parallelism: verl or TRL for models that do not fit one GPU), several nodes (torchrun's own
flags do that; nothing here assumes one node except a shared run folder).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import torch
import torch.distributed as dist
from rich.console import Console

from . import NanoparError

_seconds = 0.0  # time spent inside collectives since the process started


def launched_world_size() -> int:
    """How many processes the launcher started (WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(device: str = "auto") -> None:
    """Join the process group torchrun describes; nothing in a single process (or when joined).
    The backend follows the device: NCCL on GPUs (this process on cuda:LOCAL_RANK), gloo on a CPU."""
    if launched_world_size() == 1 or active():
        return
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        local, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local >= gpus:
            raise NanoparError(f"process {local} of this node needs a GPU of its own and torch sees {gpus}: "
                               f"give --nproc_per_node {gpus} or fewer (or --device cpu)")
        torch.cuda.set_device(local)  # "cuda" now means this process's GPU
    dist.init_process_group("nccl" if cuda else "gloo")
    signal.signal(signal.SIGTERM, _stopped_by_the_launcher)


def _stopped_by_the_launcher(signum, frame):
    """torchrun ends every process with SIGTERM when one fails (or when it is stopped itself): stop
    with one line on rank 0 (status 1 on the others) instead of vanishing. Raised wherever the
    process is; a checkpoint being written stays a temporary folder (checkpoint.py), never a
    half-written checkpoint. A SystemExit, not a NanoparError: code that turns any Exception into a
    counted failure (grading's call into math-verify) must not swallow the stop and run on."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already: another SIGTERM must not cut the line short
    raise error_exit(f"rank {rank()} of {world_size()}: stopped by torchrun (SIGTERM: another process failed, "
                     "or the run was stopped); the same command resumes from the last checkpoint")


def error_exit(message) -> SystemExit:
    """How a script stops on an error: one `error: ...` line, said by rank 0 alone (or the only
    process), and status 1 on every process."""
    return SystemExit(f"error: {message}" if is_main() else 1)


def close() -> None:
    """Leave the process group (at the end of a script); nothing in a single process."""
    if active():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    """This process's rank: 0 in a single process (before `init`, the launcher's RANK)."""
    return dist.get_rank() if active() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Whether this process writes files and prints: rank 0, or the only process."""
    return rank() == 0


def console() -> Console:
    """A rich Console that prints on rank 0 and is silent on the others."""
    return Console(quiet=not is_main())


def seconds_communicating() -> float:
    """Seconds spent inside collectives so far (0 in a single process)."""
    return _seconds


def _collective(what: str, call):
    """Run a collective, timed; a failure (a process gone) becomes a one-line NanoparError."""
    global _seconds
    started = time.perf_counter()
    try:
        return call()
    except RuntimeError as error:  # DistBackendError and gloo's connection errors are RuntimeErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise NanoparError(f"rank {rank()} of {world_size()}: {what} failed ({reason}); another process stopped "
                           "or hung up: the run stops here, and the same command resumes from its last "
                           "checkpoint") from None
    finally:
        _seconds += time.perf_counter() - started


def _device() -> torch.device:
    """Where collectives' tensors live: this process's GPU under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(tensor: torch.Tensor, what: str = "a sum over processes") -> torch.Tensor:
    """The sum of `tensor` over every process (a new tensor on its device); `tensor` itself in a
    single process."""
    if not active():
        return tensor
    summed = tensor.detach().to(_device(), copy=True)
    _collective(what, lambda: dist.all_reduce(summed))
    return summed.to(tensor.device)


def sum_over_ranks(value: float, what: str = "a sum over processes") -> float:
    """A Python number summed over every process (in float64); `value` itself in a single process."""
    if not active():
        return value
    return all_reduce(torch.tensor(float(value), dtype=torch.float64), what).item()


def sum_each(values: dict[str, float], what: str = "sums over processes") -> dict[str, float]:
    """Each number of `values` summed over every process, all in one all-reduce (float64);
    `values` itself in a single process.

    >>> sum_each({"tokens": 12, "loss": 0.5})  # one process: its numbers are the sums
    {'tokens': 12, 'loss': 0.5}
    """
    if not active():
        return values
    summed = all_reduce(torch.tensor([float(v) for v in values.values()], dtype=torch.float64), what)
    return dict(zip(values, summed.tolist()))


def any_rank(flag: bool, what: str = "a vote of the processes") -> bool:
    """Whether `flag` holds on some process; `flag` itself in a single process."""
    if not active():
        return flag
    return sum_over_ranks(float(bool(flag)), what) > 0


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the processes, in place, before the optimiser step.

    A gradient that no process computed stays None (AdamW then leaves that parameter and its
    state alone, as a single process would); one that some processes did not compute (a process
    whose rollouts were all dropped) counts as zeros there. One small vote of which gradients
    exist, then the gradients flattened into buckets of at most BUCKET_BYTES (one dtype each) and
    one all-reduce per bucket: many small collectives cost far more than one large one."""
    if not active():
        return
    exists = all_reduce(torch.tensor([p.grad is not None for p in params], dtype=torch.float32),
                        "the vote on which gradients exist")  # [params] processes that hold each
    grads = []
    for p, holders in zip(params, exists.tolist()):
        if holders > 0:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)

    def reduce_all():
        for bucket in _buckets(grads):
            flat = torch.cat([g.flatten() for g in bucket])  # [sum of numels]
            dist.all_reduce(flat)
            for g, summed in zip(bucket, flat.split([g.numel() for g in bucket])):
                g.copy_(summed.view_as(g))

    _collective("the all-reduce of the gradients", reduce_all)


BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: a bounded extra copy of the gradients, few collectives


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive gradients grouped by dtype and device, each group under BUCKET_BYTES (a larger
    gradient alone)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        last = buckets[-1] if buckets else None
        if last and (last[0].dtype, last[0].device) == (g.dtype, g.device) and size + nbytes <= BUCKET_BYTES:
            last.append(g)
            size += nbytes
        else:
            buckets.append([g])
            size = nbytes
    return buckets


def gather(value, what: str = "a gather of every process's results") -> list:
    """[every process's `value`] in rank order (any picklable object); [value] in a single process."""
    if not active():
        return [value]
    values = [None] * world_size()
    _collective(what, lambda: dist.all_gather_object(values, value))
    return values


def share(items: list) -> list:
    """This process's items of a list dealt round-robin (item i to rank i % N); the whole list
    in a single process. Every process must deal the same list."""
    return items[rank():: world_size()]


def unshare(mine: list, what: str = "a gather of every process's share") -> list:
    """Every process's `share` of a list (each item replaced by a result), gathered back in the
    order of the dealt list; `mine` itself in a single process.

    >>> unshare(["a", "b"])  # one process: its share is the whole list
    ['a', 'b']
    """
    if not active():
        return mine
    shares = gather(mine, what)  # shares[r] = results of items r, r + N, r + 2N, ...
    N = len(shares)
    return [shares[i % N][i // N] for i in range(sum(map(len, shares)))]


def check_divides(count: int, what: str) -> None:
    """A one-line error when `count` items (e.g. "--prompts-per-step") do not split evenly over the processes."""
    N = world_size()
    if count % N:
        raise NanoparError(f"{what} {count} does not split over {N} processes: give a multiple of {N} "
                           "(each process takes an equal share of every step)")


def barrier(what: str = "waiting for every process") -> None:
    """Wait until every process gets here (after rank 0 wrote a file the others read next)."""
    if active():
        _collective(what, dist.barrier)


def check_same_config(config) -> None:
    """A one-line error unless every process was started with the same config (a dataclass of
    flags): rank 0's is the run's. torchrun gives every process one command line; separate
    launches (several nodes) can differ."""
    if not active():
        return
    configs = gather(dataclasses.asdict(config), "the comparison of every process's flags")
    for other, theirs in enumerate(configs[1:], 1):
        differing = [name for name in configs[0] if theirs.get(name) != configs[0][name]]
        if differing:
            name = differing[0]
            raise NanoparError(f"the processes were started with different flags: --{name.replace('_', '-')} is "
                               f"{configs[0][name]!r} on rank 0 and {theirs[name]!r} on rank {other}"
                               + (f" (and {len(differing) - 1} more)" if len(differing) > 1 else "")
                               + "; start every process with the same command")
