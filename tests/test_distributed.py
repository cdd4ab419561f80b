"""Data parallelism (nanopar/distributed.py) on this CPU: two processes in one gloo group against
one process doing all of the work.

- One GRPO step (scripted rollouts, the sampler stood in) and one SFT step over 2 processes give
  the weights and step metrics of 1 process with every prompt: plain z-score advantages, PAPO
  (drop, then batch-level std over both processes), a token budget per micro-batch, a step in
  which one process keeps nothing, and a KL term to a reference policy. SGD and no clipping, so a gradient off by any factor shows
  (AdamW's first step would hide a scale).
- The gradient sum itself: hand-set gradients, one bucket per gradient and one per dtype, and a
  gradient no process computed stays None.
- A sharded evaluation (and eval.py) returns every (problem, sample) once, the records and
  summary of one process; distillation's sharded sampling keeps the traces of one process.
- A step that does not split over the processes is a one-line error before anything is written;
  processes started with different flags stop with one line from rank 0, the other silent; more
  processes than GPUs, and sample.py under torchrun, are one-line errors.
- `torchrun --nproc_per_node 2 train.py` end to end: one metrics line per step, and a run whose
  rank 1 is killed (SIGKILL) says so in one line, leaves only complete checkpoints, and the same
  command resumes it to the weights of the uninterrupted run.
The processes run one torch thread each.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.multiprocessing

import nanopar.distill
import nanopar.grading
import nanopar.grpo
from conftest import ROOT, read_metrics, text_rollout
from nanopar import NanoparError, distributed
from nanopar.data import Problem, load_problems
from nanopar.evaluation import evaluate, summarize
from nanopar.distill import keep_traces
from nanopar.rewards import is_correct
from nanopar.grpo import GRPOSettings, Reference, grpo_step
from nanopar.model import ModelSettings, load_model
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, stop_ids
from nanopar.sampler import SamplerSettings
from nanopar.sft import sft_step
from nanopar.toy import toy_problems
from nanopar.toy.source import SHIPPED_BASES

# ---------------------------------------------------------------- two processes in one gloo group


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, port: int, world: int = 2) -> dict:
    """What torchrun tells a process (plus one torch thread each, and passive OpenMP waits)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _entry(rank: int, jobs: list, port: int, folder: str) -> None:
    """A spawned process: join the group as torchrun's child would, run every job, save the results."""
    os.environ.update(rank_environment(rank, port))
    torch.set_num_threads(1)
    distributed.init("cpu")
    try:
        results = {name: job(*args) for name, job, args in jobs}
        torch.save(results, Path(folder) / f"rank-{rank}.pt")
    finally:
        distributed.close()


def on_two_processes(jobs: list, folder: Path, timeout: float = 150) -> list[dict]:
    """Run `jobs` ([(name, function, args)]) in 2 spawned processes of one gloo group; a process
    that fails fails the caller, and so do processes that wait on each other past `timeout`
    seconds (mismatched collectives). -> [{name: result} of rank 0, of rank 1]"""
    context = torch.multiprocessing.start_processes(_entry, args=(jobs, free_port(), str(folder)), nprocs=2,
                                                    start_method="spawn", join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two processes were still running after {timeout:.0f} s")
    return [torch.load(folder / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]


def one_thread(job, *args):
    """`job(*args)` in this (single) process at one torch thread, as the two processes run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return job(*args)
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- the jobs (a single process runs them too)

G = 4
BLOCK = "<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>"
# reward format (+1 / -1) + 0.5 accuracy (+1 / -1); "dropped" = the layout cannot lay it out (PAPO)
RESPONSES = {
    "right": lambda p: BLOCK + f"Final Answer: {p.answer}",  # 1.5
    "wrong": lambda p: BLOCK + "Final Answer: 0",  # 0.5
    "plain": lambda p: f"Final Answer: {p.answer}",  # 1.5, sequential, kept
    "stray": lambda p: BLOCK + "<Path>z</Path>" + f"Final Answer: {p.answer}",  # 1.5, dropped
    "cut": lambda p: "<Parallel><Path>x",  # -1.5, dropped
    "one path": lambda p: BLOCK.replace("<Path>y</Path>", "") + f"Final Answer: {p.answer}",  # -0.5, dropped
}
MIXED = [["right", "wrong", "plain", "stray"], ["right", "cut", "wrong", "plain"],
         ["wrong", "wrong", "right", "one path"], ["plain", "wrong", "stray", "right"]]
# prompts 1 and 3 (rank 1's: prompts are dealt round-robin) hold only rollouts PAPO drops
RANK_1_KEEPS_NONE = [MIXED[0], ["cut", "stray", "one path", "cut"], MIXED[2], ["stray", "stray", "cut", "one path"]]
GRPO_CASES = {  # name -> (responses per prompt, settings)
    "zscore": (MIXED, GRPOSettings(group_size=G, micro_batch=3, max_grad_norm=0)),
    "papo": (MIXED, GRPOSettings(group_size=G, drop_invalid=True, advantage="batch", micro_batch=3, max_grad_norm=0)),
    "papo, token budget": (MIXED, GRPOSettings(group_size=G, drop_invalid=True, advantage="batch",
                                               micro_batch_tokens=120, max_grad_norm=0)),
    "papo, rank 1 keeps none": (RANK_1_KEEPS_NONE, GRPOSettings(group_size=G, drop_invalid=True, advantage="batch",
                                                                micro_batch=3, max_grad_norm=0)),
    # a KL term to a reference away from the policy (`moved_reference`): its read and gradient too
    "kl": (MIXED, GRPOSettings(group_size=G, micro_batch=3, max_grad_norm=0, kl_beta=0.5)),
}
LR = 0.1


def trainable(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def grpo_job(case: str) -> tuple[dict, dict]:
    """One GRPO step on 4 toy problems x 4 scripted responses; this process takes its share of the
    prompts (all of them alone). -> (weights after, metrics)"""
    table, settings = GRPO_CASES[case]
    model, tokenizer = load_model(ModelSettings("toy:model"))
    policy = Policy.for_tokenizer(tokenizer)
    problems = toy_problems("toy:easy")[:4]
    prompts = [build_prompt(p, tokenizer, "") for p in problems]
    eos = stop_ids(model, tokenizer)
    scripted = [[text_rollout(prompts[j], tokenizer.encode(RESPONSES[kind](problems[j]), add_special_tokens=False)
                              + [eos[0]], policy.tag_ids) for kind in table[j]] for j in range(len(problems))]
    mine = distributed.share(list(range(len(problems))))  # rank r: prompts r, r + 2
    reference = moved_reference(model) if settings.kl_beta else None
    real = nanopar.grpo.sample
    nanopar.grpo.sample = lambda *args: [r for j in mine for r in scripted[j]]
    try:
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
        _, metrics = grpo_step(model, tokenizer, optimizer, [problems[j] for j in mine], [prompts[j] for j in mine],
                               policy, SamplerSettings(), settings, {"format": 1.0, "accuracy": 0.5}, reference)
    finally:
        nanopar.grpo.sample = real
    return trainable(model), metrics


def moved_reference(model) -> Reference:
    """A reference policy off the model's own: every trainable weight plus seeded noise (the same
    on every process), so the KL term and its gradient are not zero."""
    noise = torch.Generator().manual_seed(0)
    return Reference(model, [p.detach() + 0.05 * torch.randn(p.shape, generator=noise)
                             for p in model.parameters() if p.requires_grad])


def sft_job(micro_batch_tokens: int) -> tuple[dict, dict]:
    """One SFT step on 8 toy parallel traces; this process takes its share. -> (weights after, metrics)"""
    from nanopar.data import load_traces

    model, tokenizer = load_model(ModelSettings("toy:model"))
    traces = load_traces("toy:parallel")[:8]
    prompts = [build_prompt(Problem("", r["question"], r["answer"]), tokenizer, "") for r in traces]
    responses = [tokenizer.encode(r["response"], add_special_tokens=False) + [tokenizer.eos_token_id] for r in traces]
    mine = distributed.share(list(range(len(traces))))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    metrics = sft_step(model, optimizer, [prompts[i] for i in mine], [responses[i] for i in mine],
                       Policy.for_tokenizer(tokenizer), tokenizer.pad_token_id, micro_batch=3, max_grad_norm=0,
                       micro_batch_tokens=micro_batch_tokens)
    return trainable(model), metrics


def evaluation_job() -> list[dict]:
    """The shipped base on 5 held-out problems x 2 samples, 2 problems per sampler call (3 calls).
    -> the records, less the sampler's wall time"""
    model, tokenizer = load_model(ModelSettings(SHIPPED_BASES["parallel-r1"]))
    policy = Policy.for_tokenizer(tokenizer, "causal")
    records = evaluate(model, tokenizer, load_problems("toy:easy:heldout")[:5], policy,
                       SamplerSettings(max_new_tokens=80, seed=0), 2, "", batch_size=2)
    for record in records:
        record["stats"].pop("wall_time")
    return records


def distill_job() -> list[dict]:
    """Distillation's sampling (`keep_traces`) from the shipped base: 7 problems x 2 tries, 2 per
    sampler call (4 calls, call i seeded with its first problem). The base writes no blocks yet, so
    the filter is stood in: a correct final answer is kept. -> the kept traces"""
    model, tokenizer = load_model(ModelSettings(SHIPPED_BASES["parallel-r1"]))
    policy = Policy.for_tokenizer(tokenizer, "causal")
    real = nanopar.distill.keeps
    nanopar.distill.keeps = lambda keep, text, trace, problem: is_correct(text, problem)
    try:
        problems = toy_problems("toy:easy")[:7]
        return keep_traces(model, tokenizer, policy, problems, [build_prompt(p, tokenizer, "") for p in problems],
                           SamplerSettings(max_new_tokens=120, seed=0), stop_ids(model, tokenizer), tries=2,
                           chunk=2).records
    finally:
        nanopar.distill.keeps = real


def eval_script_job(out: str) -> tuple[dict, str]:
    """eval.py on the shipped base: 5 held-out problems x 2 samples, 2 per sampler call.
    -> (its summary, its --out folder)"""
    import eval as eval_script

    return eval_script.main(["--model", SHIPPED_BASES["parallel-r1"], "--mode", "causal", "--benchmarks",
                             "toy:easy:heldout", "--limit", "5", "--samples", "2", "--batch-size", "2",
                             "--max-new-tokens", "80", "--speedup-batches", "0", "--out", out]), out


def rescore_job(out: str) -> tuple[dict, dict]:
    """A stage's held-out evaluation on both processes, then again with other rewards (scored on the
    saved responses), rank 1 arriving late to the second: it must still read the file before rank 0
    rewrites it, and the processes' collectives stay paired (a barrier after both).
    -> (the first results, the second) of this process"""
    import train
    from nanopar.checkpoint import save_checkpoint
    from nanopar.curriculum import recipe
    from nanopar.runner import Runner

    def evaluate_sft(reward: str, rank_1_late: bool = False) -> dict:
        config = train.resolved_config(["--out", out, "--eval-problems", "3", "--eval-samples", "2",
                                        "--max-new-tokens", "8", "--hard-reward", "format", "--easy-reward", reward])[0]
        runner = Runner(config, recipe(config))
        stage = runner.stages[1]
        if distributed.is_main() and not (runner.folder(stage) / "final").exists():
            save_checkpoint(runner.folder(stage) / "final", *load_model(ModelSettings("toy:model")))
        distributed.barrier("the model saved")
        if rank_1_late and distributed.rank() == 1:
            time.sleep(2)  # rank 0 reaches the rescoring first
        return runner.heldout.evaluate(stage)["toy:easy:heldout"]

    first = evaluate_sft("format")
    second = evaluate_sft("accuracy", rank_1_late=True)
    distributed.barrier("after both")
    return first, second


def without_timings(record: dict) -> dict:
    """An eval.py record or benchmark summary less what the clock decides."""
    record = {k: v for k, v in record.items() if k not in ("seconds", "tokens_per_second")}
    if "stats" in record:
        record["stats"] = {k: v for k, v in record["stats"].items() if k != "wall_time"}
    return record


def bad_step_job(folder: str) -> tuple[str, list[str]]:
    """train.main with --prompts-per-step 3 on 2 processes. -> (its error, the files under `folder`)"""
    import train

    try:
        train.main(["--out", folder, "--prompts-per-step", "3", "--device", "cpu"])
        message = "no error"
    except NanoparError as error:
        message = str(error)
    return message, sorted(str(p) for p in Path(folder).rglob("*") if p.is_file())


def gradient_job(bucket_bytes: int) -> list:
    """`all_reduce_gradients` on hand-set gradients, buckets of `bucket_bytes`: a gradient on both
    processes, one on rank 0 only, one on neither, one in another dtype. -> the gradients after"""
    both, rank_0, neither = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    wide = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    both.grad = torch.full((3,), distributed.rank() + 1.0)  # 1 and 2
    wide.grad = torch.full((2,), distributed.rank() + 0.5, dtype=torch.float64)  # 0.5 and 1.5
    if distributed.rank() == 0:
        rank_0.grad = torch.tensor([1.0, 2.0, 3.0])
    real, distributed.BUCKET_BYTES = distributed.BUCKET_BYTES, bucket_bytes
    try:
        distributed.all_reduce_gradients([both, rank_0, neither, wide])
    finally:
        distributed.BUCKET_BYTES = real
    return [both.grad, rank_0.grad, neither.grad, wide.grad]


def sums_job() -> dict:
    """`sum_each` on numbers that differ by rank: a count (0 and 1) and a fraction (0.25 and 1.25)."""
    return distributed.sum_each({"count": distributed.rank(), "fraction": distributed.rank() + 0.25}, "test sums")


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> list[dict]:
    """Every job on two processes, once: [{job name: result} of rank 0, of rank 1]."""
    folder = tmp_path_factory.mktemp("two-processes")
    jobs = [(f"grpo {case}", grpo_job, (case,)) for case in GRPO_CASES]
    jobs += [(f"sft {tokens}", sft_job, (tokens,)) for tokens in (0, 300)]
    jobs += [(f"gradients {size}", gradient_job, (size,)) for size in (12, 2**20)]
    jobs += [("sums", sums_job, ())]
    jobs += [("eval.py", eval_script_job, (str(folder / "eval"),))]
    jobs += [("evaluation", evaluation_job, ()), ("distill", distill_job, ()),
             ("bad step", bad_step_job, (str(folder / "run"),)), ("rescore", rescore_job, (str(folder / "rescore"),))]
    return on_two_processes(jobs, folder)


def assert_same_step(one: tuple[dict, dict], over_two: list[tuple[dict, dict]], keys: tuple[str, ...]) -> None:
    """Two processes end with the same weights, and the step of one process: its weight change and
    the numbers `keys` of its metrics, within float32's summation order."""
    (weights, metrics), ((w0, m0), (w1, m1)) = one, over_two
    start = trainable(load_model(ModelSettings("toy:model"))[0])
    assert all(torch.equal(w0[name], w1[name]) for name in w0)  # every process took the same step
    moved = max((weights[name] - start[name]).abs().max().item() for name in weights)
    assert moved > 1e-4  # the step did move the weights
    for name in weights:  # rtol 1e-4, atol 1e-7, and eps x |weight| (1-2 ulps of the weight the change is read off)
        ulp = torch.finfo(torch.float32).eps * weights[name].abs()
        change = (weights[name] - start[name]).abs()
        assert ((w0[name] - weights[name]).abs() <= 1e-7 + ulp + 1e-4 * change).all(), name
    for key in keys:
        assert m0[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
        assert m1[key] == m0[key], key


# ---------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GRPO_CASES))
def test_a_grpo_step_over_two_processes_is_the_step_of_one(two, case):
    one = one_thread(grpo_job, case)
    over_two = [two[rank][f"grpo {case}"] for rank in range(2)]
    assert_same_step(one, over_two, ("loss", "grad_norm", "entropy", "logprob_gap", "reward", "accuracy",
                                     "parallel_ratio", "zero_variance_groups", "dropped_invalid",
                                     "skipped_no_signal"))
    if case == "papo, rank 1 keeps none":
        assert over_two[1][1]["dropped_invalid"] == 10 and not over_two[1][1]["skipped_no_signal"]


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [0, 300], ids=["rows", "token budget"])
def test_an_sft_step_over_two_processes_is_the_step_of_one(two, tokens):
    one = one_thread(sft_job, tokens)
    assert_same_step(one, [two[rank][f"sft {tokens}"] for rank in range(2)], ("loss", "grad_norm", "tokens"))


@pytest.mark.slow
@pytest.mark.parametrize("size", [12, 2**20], ids=["a bucket per gradient", "one bucket per dtype"])
def test_gradients_are_summed_over_the_processes_and_one_that_none_computed_stays_none(two, size):
    for rank in range(2):
        both, rank_0, neither, wide = two[rank][f"gradients {size}"]
        assert both.tolist() == [3.0] * 3 and rank_0.tolist() == [1.0, 2.0, 3.0]  # rank 1 counted zeros
        assert neither is None  # AdamW leaves it and its state alone, as one process would
        assert wide.dtype == torch.float64 and wide.tolist() == [2.0, 2.0]


@pytest.mark.slow
def test_several_numbers_are_summed_over_the_processes_in_one_call(two):
    assert two[0]["sums"] == two[1]["sums"] == {"count": 1.0, "fraction": 1.5}


@pytest.mark.slow
def test_a_sharded_evaluation_returns_every_problem_once_and_the_records_of_one_process(two):
    one = one_thread(evaluation_job)
    for rank in range(2):
        records = two[rank]["evaluation"]
        assert sorted((r["id"], r["sample"]) for r in records) == sorted((r["id"], r["sample"]) for r in one)
        assert len({(r["id"], r["sample"]) for r in records}) == len(records) == 10  # each exactly once
        assert [r["batch"] for r in records] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]  # in call order
        assert records == one  # the same responses, grades and structure, sample for sample
        assert summarize(records) == summarize(one)


def test_other_rewards_are_scored_on_the_saved_responses_by_every_process_alike(two):
    """Under torchrun the second evaluation samples nothing new (the rescoring path), and both
    processes return the same numbers: the first's with accuracy added, as 2 x correct - 1."""
    (first, second), (first_1, second_1) = two[0]["rescore"], two[1]["rescore"]
    assert first == first_1 and second == second_1 and list(first["rewards"]) == ["format"]
    assert second["rewards"]["format"] == first["rewards"]["format"]
    assert second["rewards"]["accuracy"] == {k: 2 * v - 1 for k, v in first["per_problem"].items()}


@pytest.mark.slow
def test_distillation_over_two_processes_keeps_the_traces_of_one_in_the_same_order(two):
    one = one_thread(distill_job)
    assert 2 <= len(one) < 7 and len({r["id"] for r in one}) == len(one)  # some kept, some not, one per problem
    for rank in range(2):
        assert two[rank]["distill"] == one


@pytest.mark.slow
def test_eval_py_over_two_processes_writes_the_samples_and_summary_of_one(two, tmp_path):
    from nanopar.data import read_jsonl

    one, _ = one_thread(eval_script_job, str(tmp_path))
    out = Path(two[0]["eval.py"][1])  # both processes were given it; rank 0 writes
    written = [without_timings(r) for r in read_jsonl(out / "samples.jsonl")]
    assert written == [without_timings(r) for r in read_jsonl(tmp_path / "samples.jsonl")] and len(written) == 10
    assert json.loads((out / "summary.json").read_text())["benchmarks"].keys() == {"toy:easy:heldout"}
    for rank in range(2):
        got = two[rank]["eval.py"][0]["benchmarks"]["toy:easy:heldout"]
        assert without_timings(got) == without_timings(one["benchmarks"]["toy:easy:heldout"])


@pytest.mark.slow
def test_a_step_that_does_not_split_over_the_processes_is_a_one_line_error_before_anything_is_written(two):
    for rank in range(2):
        message, files = two[rank]["bad step"]
        assert message.startswith("--prompts-per-step 3 does not split over 2 processes: give a multiple of 2")
        assert "\n" not in message and files == []  # no config, no checkpoint: it stopped before any model loaded


def test_each_process_samples_from_its_own_seed_stream_and_rank_0_from_the_single_process_one(monkeypatch):
    import random

    import train
    from nanopar.curriculum import recipe
    from nanopar.stage_steps import sampling_seed

    config = train.resolved_config([])[0]
    stage = recipe(config)[-1]
    single = sampling_seed(config.seed, stage, 3)
    assert single == random.Random(f"0/{stage.name}/sample/3").randrange(2**31)  # as before processes
    seeds = []
    for rank in range(4):
        monkeypatch.setattr(distributed, "rank", lambda rank=rank: rank)
        seeds.append(sampling_seed(config.seed, stage, 3))
    assert seeds[0] == single and len(set(seeds)) == 4


def test_sample_py_says_it_is_single_process_under_torchrun(monkeypatch):
    import sample

    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun tells each of 2 processes
    with pytest.raises(NanoparError, match="sample.py is single-process: run it with python, not torchrun"):
        sample.main(["--model", "toy:model", "--prompt", "numbers 3 4 5 target 17"])


def test_more_processes_than_gpus_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))  # one past the last GPU (none on a CPU)
    with pytest.raises(NanoparError, match=r"needs a GPU of its own and torch sees \d+: give --nproc_per_node"):
        distributed.init("cuda")
    assert not distributed.active()


def test_the_launchers_stop_ends_the_process_even_inside_code_that_counts_any_exception(monkeypatch):
    """torchrun's SIGTERM lands wherever the process is: inside grading's call into math-verify,
    whose exceptions become counted parse failures, it must still stop the process, once."""
    def parse_interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode: inside the parse
        return []

    monkeypatch.setattr(nanopar.grading, "parse", parse_interrupted)
    previous = signal.signal(signal.SIGTERM, distributed._stopped_by_the_launcher)  # as `init` installs it
    try:
        with pytest.raises(SystemExit) as stopped:
            nanopar.grading.grade("Final Answer: 42", Problem("test:1", "What is 6 x 7?", "42"))
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a second SIGTERM cannot cut the line short
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert str(stopped.value.code).startswith("error: rank 0 of 1: stopped by torchrun (SIGTERM")


def test_a_single_process_starts_no_group_and_every_helper_returns_its_input():
    assert not distributed.active() and distributed.world_size() == 1 and distributed.is_main()
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce(t) is t and distributed.sum_over_ranks(2.5) == 2.5
    assert distributed.any_rank(False) is False and distributed.gather("x") == ["x"]
    numbers = {"tokens": 12, "loss": 0.5}
    assert distributed.sum_each(numbers) is numbers
    items = [1, 2, 3]
    assert distributed.share(items) == items and distributed.unshare(items) is items
    distributed.check_divides(3, "--prompts-per-step")  # anything splits over one process
    assert distributed.seconds_communicating() == 0.0


# ---------------------------------------------------------------- the scripts, launched


def start(script_args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *script_args], cwd=ROOT, env=os.environ | env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a process once it ends; past `timeout` seconds it and its children are
    killed and the test fails."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(process.pid).children(recursive=True) + [psutil.Process(process.pid)]:
            child.kill()
        pytest.fail(f"{' '.join(process.args)} still ran after {timeout:.0f} s")


@pytest.mark.slow
def test_processes_started_with_different_flags_stop_with_one_line_from_rank_zero(tmp_path):
    """Two processes launched by hand, as torchrun launches them, one with another --lr."""
    port = free_port()
    short = ["--stages", "pretrain", "--eval-problems", "0", "--device", "cpu"]  # a moment's run, were it allowed
    ranks = [start(["train.py", "--out", str(tmp_path / "run"), *short, "--lr", lr], rank_environment(rank, port))
             for rank, lr in enumerate(["1e-3", "2e-3"])]
    (out0, err0), (out1, err1) = (finish(p, 120) for p in ranks)
    assert [p.returncode for p in ranks] == [1, 1]
    assert err0.splitlines() == ["error: the processes were started with different flags: --lr is 0.001 on rank 0 "
                                 "and 0.002 on rank 1; start every process with the same command"], err0
    assert err1 == "" and out1 == ""
    assert not (tmp_path / "run").exists()  # failed before anything was written


# a short toy run: the shipped base, 2 SFT steps, 4 GRPO steps (rank r samples prompt r of each
# step's 2), a held-out evaluation of 2 problems (one sampler call per process) after each stage
RUN = ["--skip", "rl-hard", "--sft-steps", "2", "--sft-lr", "1e-4", "--sft-batch", "4", "--rl-easy-steps", "4",
       "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "100", "--easy-reward", "accuracy",
       "--checkpoint-every", "1", "--keep-checkpoints", "0", "--eval-problems", "2", "--eval-samples", "1",
       "--eval-batch", "1", "--device", "cpu"]


def torchrun(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py",
                             "--out", str(out), *RUN, *flags], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=os.environ | {"OMP_NUM_THREADS": "1",
                                                                      "OMP_WAIT_POLICY": "PASSIVE"})


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(next((run / "3-rl-easy" / "final").glob("*.safetensors")))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The short run under torchrun, uninterrupted. -> its folder"""
    out = tmp_path_factory.mktemp("straight")
    process = torchrun(out)
    _, err = finish(process, 300)
    assert process.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
def test_a_torchrun_run_writes_one_metrics_line_per_step_and_evaluates_each_stage_once(straight):
    lines = read_metrics(straight)
    steps = [(m["stage"], m["step"]) for m in lines if "step" in m]
    assert steps == [("sft", 1), ("sft", 2), *[("rl-easy", k) for k in range(1, 5)]]  # rank 0's lines only
    assert all(m["communication_seconds"] >= 0 for m in lines if "step" in m)
    assert [m["stage"] for m in lines if m.get("event") == "eval"] == ["pretrain", "sft", "rl-easy"]
    for stage in ("1-pretrain", "2-sft", "3-rl-easy"):
        results = json.loads((straight / stage / "eval.json").read_text())["results"]
        assert [len(r["per_problem"]) for r in results.values()] == [2, 2]  # both problems, one from each process
    config = json.loads((straight / "config.json").read_text())
    assert config["prompts_per_step"] == 2 and (straight / "metrics.png").is_file()


def rank_process(out: Path, rank: int) -> psutil.Process | None:
    """The running train.py process of rank `rank` writing to `out`, or None."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(out) in " ".join(process.info["cmdline"] or []) and process.environ().get("RANK") == str(rank):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.mark.slow
def test_a_run_whose_rank_is_killed_says_so_in_one_line_and_resumes_to_the_same_weights(straight, tmp_path):
    out = tmp_path / "run"
    process = torchrun(out, "--eval-problems", "0")  # evaluations change no weights: left out here, for time
    deadline, rank_1 = time.monotonic() + 240, None
    while not (out / "3-rl-easy" / "checkpoint-1").is_dir():  # complete once named (checkpoint.py)
        if process.poll() is not None or time.monotonic() > deadline:
            finish(process, 0)
            pytest.fail("the run ended or stalled before rl-easy's first checkpoint")
        rank_1 = rank_1 or rank_process(out, 1)
        time.sleep(0.05)
    assert rank_1 is not None
    # Steps 2-4 take a few seconds: stop rank 1 at once, so that the kill lands inside the stage (the
    # stage cannot end without it), not in a run that already ended, which a busy machine once did.
    rank_1.suspend()
    assert not (out / "3-rl-easy" / "final").exists(), "the stage ended before rank 1 was stopped"
    rank_1.kill()  # SIGKILL: no chance to clean up
    _, err = finish(process, 120)
    assert process.returncode != 0
    said = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and said[0].startswith("error: rank 0 of 2: "), err[-3000:]
    assert "the same command resumes" in said[0]
    checkpoints = sorted((out / "3-rl-easy").glob("checkpoint-*"))
    assert checkpoints and all((c / "trainer_state.pt").is_file() and list(c.glob("*.safetensors"))
                               for c in checkpoints)  # complete, or not named a checkpoint
    assert not (out / "3-rl-easy" / "final").exists()
    resumed = torchrun(out, "--eval-problems", "0")
    printed, err = finish(resumed, 300)
    assert resumed.returncode == 0, err[-3000:]
    assert printed.count("rl-easy: resumed from checkpoint-") == 1  # rank 0 prints, every rank resumes
    a, b = final_weights(straight), final_weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    assert [m["step"] for m in read_metrics(out) if m.get("stage") == "rl-easy" and "step" in m] == [1, 2, 3, 4]
