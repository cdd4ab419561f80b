"""bench/gpu_check.py: its --quick run on a CPU (the GPU run's code path on a tiny Qwen2 with the real
tokenizer and vocabulary) measures what its JSON says, and without a GPU the full run refuses in one line."""

import json
import sys

import pytest
import torch

from conftest import ROOT, run_script
from nanopar.policy import Policy
from nanopar.trace import parse_ids

sys.path.append(str(ROOT / "bench"))  # as `python bench/gpu_check.py` has it: its helpers beside it
import gpu_check  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The --quick run: (its JSON, its printed tables)."""
    out = tmp_path_factory.mktemp("gpu-check") / "quick.json"
    done = run_script("bench/gpu_check.py", "--quick", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_quick_run_forks_samples_and_trains(quick, qwen_tokenizer):
    report, printed = quick
    config, model = report["config"], report["models"]["tiny-qwen2"]
    B, G, N, K = config["prompts"], config["samples"], config["new_tokens"], config["paths"]
    runs, ids = model["runs"], model["forked_ids"]
    assert len(ids) == B * G
    # the forked responses, read back from their ids with the real tokenizer's tags: blocks of K paths, no stray tag
    tags = Policy.for_tokenizer(qwen_tokenizer).tag_ids
    traces = [parse_ids(response, tags) for response in ids]
    blocks = [block for trace in traces for block in trace.blocks]
    assert sum(len(block.paths) >= 2 for block in blocks) >= B * G  # about 2 blocks a response at --quick's bias
    assert all(len(block.paths) == K for block in blocks) and not any(trace.stray for trace in traces)
    assert runs["forked"]["blocks"] == len(blocks) and runs["forked"]["blocks_2_paths"] == len(blocks)
    # the token counts are the rollouts' own: every response spent its budget (no EOS), tags inserted on top
    assert runs["forked"]["tokens"] == sum(map(len, ids)) > runs["forked"]["sampled"] == B * G * N
    assert runs["sequential"]["tokens"] == runs["generate"]["tokens"] == B * G * N
    assert 0 < runs["forked"]["critical_path"] < runs["forked"]["tokens"] / (B * G)  # paths side by side
    for run in ("forked", "sequential", "generate"):
        assert runs[run]["tokens_per_second"] == pytest.approx(runs[run]["tokens"] / runs[run]["seconds"])
        assert runs[run]["tokens_per_second"] > 0
    # the GRPO step moved every LoRA B (A's gradient is 0 while B is 0) and the tag rows, and nothing else
    step = model["grpo"]
    layers = 7 * gpu_check.MODELS["tiny-qwen2"]["num_hidden_layers"]  # LoRA'd projections
    assert step["lora_tensors"] == 2 * layers + 1
    assert step["lora_tensors_changed"] == layers + 1 and step["lora_max_change"] > 0
    assert step["read_backward_s"] > 0 and step["optimizer_s"] > 0 and step["reward_s"] > 0
    assert step["update_s"] == pytest.approx(step["read_backward_s"] + step["optimizer_s"])
    assert model["plan"] is None and step["peak_mb"] is None  # no plan for the tiny model, no CUDA peak on CPU
    assert printed.count("tiny-qwen2") >= 3  # its progress lines and a row of each table
    # the floor part on the 4-bit model: every phase timed against its floor (the 4-bit layers' own)
    phases = model["floor"]["phases"]
    assert [p["phase"].split(",")[0] for p in phases] == ["prefill", "prefill", "decode step", "decode step",
                                                          "training micro-batch"]
    assert all(p["floor_seconds"] > 0 and p["ratio"] == pytest.approx(p["seconds"] / p["floor_seconds"]) for p in phases)
    assert phases[-1]["seconds"] > 0  # the training read's, timed directly (the others are differences of two calls)
    assert "0b. nanopar against the floor" in printed


def test_without_a_gpu_the_full_run_refuses_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main([])
    message = str(stop.value.code)
    assert message.startswith("error:") and message.endswith("use --quick on a CPU") and "\n" not in message
