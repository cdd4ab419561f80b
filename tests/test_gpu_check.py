"""bench/gpu_check.py: its --quick run on a CPU (every check of the GPU run, on a tiny Qwen2 with the real
tokenizer and vocabulary) passes with every check run; a broken check makes the verdict FAIL with
exit status 1; the memory rows the CPU cannot measure judge the plan as they should; without a GPU
the full run refuses in one line."""

import json
import sys

import pytest
import torch

from conftest import ROOT
from nanopar.rewards import REWARDS

sys.path.append(str(ROOT / "bench"))  # as `python bench/gpu_check.py` has it: its helpers beside it
import gpu_check  # noqa: E402
import memory  # noqa: E402

NAME = "tiny-qwen2"
QUICK_CHECKS = ["pre-flight",  # the rows of a --quick run, in order
                f"{NAME}: log-probs, sampler vs training read, float32", f"{NAME}: lazy and plain lane caches",
                f"{NAME}: head reads' gradients, chunked vs plain, float32", f"{NAME}: the float32 model freed without gc.collect()",
                f"{NAME}: 4-bit + LoRA + tag rows loaded", f"{NAME}: log-probs, sampler vs training read, float32, 4-bit",
                f"{NAME}: head reads' gradients, chunked vs plain, float32, 4-bit",
                f"{NAME}: cycle 1, sample -> update", f"{NAME}: cycle 1, peak memory vs the memory plan",
                f"{NAME}: cycle 2, sample -> update", f"{NAME}: cycle 2, peak memory vs the memory plan",
                f"{NAME}: an evaluation batch of 4", f"{NAME}: attention kernel", f"{NAME}: prefill vs the floor",
                f"{NAME}: decode step vs the floor", f"{NAME}: training micro-batch vs the floor",
                "train.py --trial 2 --checkpoint-every 1, stopped and resumed", "run time"]


@pytest.mark.slow
def test_quick_run_passes_with_every_check_run(tmp_path, capsys):
    """`python bench/gpu_check.py --quick` is `sys.exit(main(["--quick"]))`: run here, its imports paid once."""
    out, rewards = tmp_path / "quick.json", dict(REWARDS)
    status = gpu_check.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert status == 0, report["verdict"]
    assert [c["name"] for c in report["checks"]] == QUICK_CHECKS
    assert report["verdict"].startswith("PASS") and report["failed"] == []
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["verdict"]  # the verdict is the last line printed
    assert REWARDS == rewards  # the cycles' reward was registered for them only
    # every check measured something; only the memory rows are n/a, and they say why
    not_applicable = [name for name, c in checks.items() if c["ok"] is None]
    assert not_applicable == [f"{NAME}: cycle 1, peak memory vs the memory plan", f"{NAME}: cycle 2, peak memory vs the memory plan"]
    assert all("a CPU has no memory fraction" in checks[name]["value"] for name in not_applicable)
    assert all(c["ok"] is True for name, c in checks.items() if name not in not_applicable)
    exact = checks[f"{NAME}: log-probs, sampler vs training read, float32"]["figures"]
    assert exact["blocks"] > 0 and exact["tokens"] > 0 and exact["max"] <= 1e-4  # forked, read back, exact
    caches = checks[f"{NAME}: lazy and plain lane caches"]["figures"]
    assert caches["same"] == caches["responses"] > 0
    for k in (1, 2):  # two GRPO steps: each updated, and its sampler's caches were watched and gone on return
        cycle = checks[f"{NAME}: cycle {k}, sample -> update"]["figures"]
        assert cycle["caches"] > 0 and cycle["alive"] == 0 and not cycle["metrics"]["skipped_no_signal"]
        assert cycle["metrics"]["grad_norm"] > 0 and cycle["blocks"] > 0
    trial = checks["train.py --trial 2 --checkpoint-every 1, stopped and resumed"]["figures"]
    assert trial["stopped"] and trial["resumed"] and trial["projected"] and trial["steps"] == [1, 2]


def test_a_broken_check_fails_the_verdict_with_status_1(monkeypatch, tmp_path, capsys):
    """The trainer's read off by 0.5 a token: the log-prob checks fail and name themselves, the others hold."""
    read = gpu_check.training_read
    monkeypatch.setattr(gpu_check, "training_read", lambda *args: (lambda r: (r[0] + 0.5, r[1]))(read(*args)))
    out = tmp_path / "broken.json"
    status = gpu_check.main(["--quick", "--only", "exactness", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 1
    assert report["failed"] == [f"{NAME}: log-probs, sampler vs training read, float32"]
    assert report["verdict"].startswith("FAIL: 1 of") and report["failed"][0] in report["verdict"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["verdict"]


def test_the_memory_rows_judge_the_plan(monkeypatch):
    """What a GPU run's memory row decides, from figures (no GPU here): within 15% of the plan passes,
    20% over it fails, reserved memory above the plan's slack fails."""
    monkeypatch.setattr(gpu_check, "CUDA", True)
    config = gpu_check.CheckConfig()
    shape = dict(prompts=8, micro_batch=2, checkpointing=False, longest_prompt=300)
    plan = memory.predict("qwen2.5-1.5b", prompts=8, samples=8, new_tokens=1024, prompt_tokens=300, paths=2,
                          micro_batch=2, checkpointing=False)
    cache = plan["kv_cache"] * 0.8  # the sampler held 80% of the bound

    def judged(scale: float, reserved: float = 1.05) -> bool:
        sampling = (plan["sampling_peak"] - plan["kv_cache"] + cache) * scale
        figures = dict(shape, cache=cache, sampling_peak=(sampling, sampling * reserved),
                       training_peak=(plan["training_peak"] * scale, plan["training_peak"] * scale * reserved))
        return gpu_check.check_cycle_memory("qwen2.5-1.5b", figures, config)[0]

    assert judged(1.0) and judged(0.9) and judged(1.1, reserved=1.0)
    assert not judged(1.2) and not judged(0.8) and not judged(1.0, reserved=1.2)


def test_without_a_gpu_the_full_run_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main([])
    message = str(stop.value.code)
    assert message.startswith("error:") and message.endswith("use --quick on a CPU") and "\n" not in message
