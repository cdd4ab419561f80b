"""The flags a user reaches for on an out-of-memory error change no result, so a run folder resumes with them.

--micro-batch, --micro-batch-tokens, --gradient-checkpointing and --head-read change how a GRPO or
SFT step reads its rows (how many at once, what is kept for backward), never what it computes:
the same loss, the same gradient and, after the optimiser's real step (clipping, AdamW), the same
LoRA weights to float tolerance. So run_folder.py counts them as bookkeeping with --eval-batch (how
many held-out problems are decoded at once): a folder trained at one setting resumes at another
without --restart, while --group-size, --prompts-per-step or --max-new-tokens, which change what
a step samples, are refused (docs/gpu.md, "Out of memory").

Beside test_grpo.py's token-budget test (one step's gradients, packed against one batch),
test_head.py (either head read) and test_model.py (checkpointing on a plain forward), these run a
LoRA model with trainable tag rows, on rollouts with forks, through a whole optimiser step, and
test_run_folder.py's toy resume (--micro-batch 3) with the real-model GPU command's folder.
"""

import dataclasses

import pytest
import torch

import train
from conftest import bias_logits, perturb_trainable
from nanopar import NanoparError
from nanopar.curriculum import recipe, stage_folder
from nanopar.grpo import GRPOSettings, grpo_update
from nanopar.model import ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.run_folder import BOOKKEEPING, check_reuse, stale_stages
from nanopar.runner import Runner
from nanopar.sampler import SamplerSettings, sample
from nanopar.sft import sft_step
from nanopar.tags import TagIds
from nanopar.tiny import char_tokenizer, tiny_qwen_model

# peft 0.21.2 still asks transformers 5 for the deprecated `is_gradient_checkpointing`.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

LR = 1e-3  # AdamW's first step moves each entry by ~LR: a wrong gradient shows as an O(LR) difference
RTOL, ATOL = 1e-5, 1e-7  # float32 sums in another order
CLIP = 0.25  # --max-grad-norm under these steps' gradient norms, so that the clipping takes part


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    """A tiny Qwen3 saved with the char tokenizer (what `conftest.load_char_model` builds)."""
    folder = tmp_path_factory.mktemp("char-qwen3")
    tiny_qwen_model(vocab_size=128, hidden_size=64).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def lora_model(folder, gradient_checkpointing=False):
    """The folder's model with LoRA and trainable tag rows, as train.py loads a real model, with the
    same LoRA weights whatever the flag (LoRA B moved off zero, so every adapter has a gradient)."""
    torch.manual_seed(0)  # LoRA A starts random
    model, tokenizer = load_model(ModelSettings(str(folder), lora=True, gradient_checkpointing=gradient_checkpointing))
    assert model.get_base_model().is_activation_checkpointing == gradient_checkpointing
    perturb_trainable(model)
    return model, tokenizer


@pytest.fixture(scope="module")
def rollouts_and_policy(base_folder):
    """Eight rollouts of two prompts with forked paths (a bias on the tag logits while sampling),
    of different lengths, and the policy that reads them."""
    model, tokenizer = lora_model(base_folder)
    tags = TagIds.from_tokenizer(tokenizer)
    policy = Policy(tags, "structured", 1.0, len(tokenizer))
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("ab", "cdefg")]
    handle = bias_logits(model, dict.fromkeys(tags.all(), 2.5))
    rollouts = sample(model, prompts, policy, SamplerSettings(max_new_tokens=30, max_path_tokens=6, seed=3),
                      [tokenizer.eos_token_id], samples_per_prompt=4)
    handle.remove()
    assert sum(r.stats.forks for r in rollouts) >= 2  # the premise: forked rows, inserted tags
    assert len({len(r.prompt_ids) + len(r.ids) for r in rollouts}) >= 3  # rows of several lengths to pack
    return rollouts, policy, tokenizer.pad_token_id


def longest(rollouts) -> int:
    return max(len(r.prompt_ids) + len(r.ids) for r in rollouts)


def one_step(model, step, monkeypatch) -> tuple[dict, dict, dict]:
    """Run `step(model, optimizer)` (one grpo_update or sft_step) with AdamW at LR and the real
    clipping, keeping the gradients it applied. -> (metrics, {name: gradient}, {name: weight after})"""
    import nanopar.grpo
    import nanopar.sft

    grads = {}

    def apply(model, *args, **kwargs):  # the real apply_gradients, after a copy of what it applies
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real(model, *args, **kwargs)

    real = nanopar.grpo.apply_gradients
    with monkeypatch.context() as patch:
        patch.setattr(nanopar.grpo, "apply_gradients", apply)
        patch.setattr(nanopar.sft, "apply_gradients", apply)
        metrics = step(model, make_optimizer(model, lr=LR)[0])
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return metrics, grads, weights


def assert_same_step(got, want, keys):
    (metrics, grads, weights), (want_metrics, want_grads, want_weights) = got, want
    for key in keys:
        assert metrics[key] == pytest.approx(want_metrics[key], rel=RTOL, abs=ATOL), key
    assert grads.keys() == want_grads.keys() and any("lora_B" in n for n in grads)
    assert any("trainable_tokens" in n for n in grads)  # the tag rows learn too
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=RTOL, atol=ATOL, msg=name)
    compared = 0
    for name, weight in want_weights.items():
        # AdamW's first step moves an entry by LR x g / (|g| + eps), eps = 1e-8: where |g| <= 1e-5
        # (a thousand eps), a float-rounding difference in g (~1e-9) moves the step by up to ~LR / 100,
        # so those entries (under 1% here) are held to LR / 10; every other to LR / 10^4
        firm = want_grads[name].abs() > 1e-5
        compared += int(firm.sum())
        torch.testing.assert_close(weights[name][firm], weight[firm], rtol=0, atol=LR * 1e-4, msg=name)
        assert (weights[name] - weight).abs().max() <= LR * 0.1, name
    assert compared > 0.95 * sum(w.numel() for w in want_weights.values())


# (what changes, GRPOSettings fields or sft_step keywords, load with --gradient-checkpointing)
MEMORY_SETTINGS = [
    ("--micro-batch 1", dict(micro_batch=1), False),
    ("--micro-batch-tokens", dict(micro_batch=1, micro_batch_tokens=None), False),  # None: twice the longest row
    ("--gradient-checkpointing", dict(micro_batch=3), True),
    ("--head-read chunked", dict(micro_batch=3, head_read="chunked"), False),
]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name, flags, checkpointing", MEMORY_SETTINGS, ids=[s[0] for s in MEMORY_SETTINGS])
def test_a_grpo_step_is_the_same_at_every_memory_setting(name, flags, checkpointing, loss_agg, base_folder,
                                                         rollouts_and_policy, monkeypatch):
    """Every row in one forward/backward against each memory setting: the same loss, entropy,
    sampler-trainer gap, gradient norm, gradients and updated weights."""
    rollouts, policy, pad = rollouts_and_policy
    advantages = torch.linspace(-1.0, 1.0, len(rollouts))
    if flags.get("micro_batch_tokens", 0) is None:
        flags = flags | {"micro_batch_tokens": 2 * longest(rollouts) + 1}

    def run(model, settings):
        return one_step(model, lambda model, optimizer: grpo_update(model, optimizer, rollouts, advantages, policy,
                                                                    settings, pad), monkeypatch)

    want = run(lora_model(base_folder)[0], GRPOSettings(micro_batch=len(rollouts), loss_agg=loss_agg, max_grad_norm=CLIP))
    got = run(lora_model(base_folder, checkpointing)[0], GRPOSettings(loss_agg=loss_agg, max_grad_norm=CLIP, **flags))
    assert want[0]["grad_norm"] > CLIP
    assert_same_step(got, want, ("loss", "entropy", "logprob_gap", "grad_norm"))


@pytest.mark.parametrize("name, flags, checkpointing", MEMORY_SETTINGS, ids=[s[0] for s in MEMORY_SETTINGS])
def test_an_sft_step_is_the_same_at_every_memory_setting(name, flags, checkpointing, base_folder,
                                                         rollouts_and_policy, monkeypatch):
    """The cold start's step on the same traces (tags, forks): every row at once against each setting."""
    rollouts, policy, pad = rollouts_and_policy
    prompts, responses = [r.prompt_ids for r in rollouts], [r.ids for r in rollouts]
    if flags.get("micro_batch_tokens", 0) is None:
        flags = flags | {"micro_batch_tokens": 2 * longest(rollouts) + 1}

    def run(model, **kwargs):
        return one_step(model, lambda model, optimizer: sft_step(model, optimizer, prompts, responses, policy, pad,
                                                                 max_grad_norm=CLIP, **kwargs), monkeypatch)

    want = run(lora_model(base_folder)[0], micro_batch=len(rollouts))
    got = run(lora_model(base_folder, checkpointing)[0], **flags)
    assert got[0]["tokens"] == want[0]["tokens"] and want[0]["grad_norm"] > CLIP
    assert_same_step(got, want, ("loss", "grad_norm"))


# ---------------------------------------------------------------- the run folder

GPU_COMMAND = ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--load-in-4bit"]  # docs/gpu.md's, less its memory flag
MEMORY_FLAGS = [["--micro-batch", "4"], ["--micro-batch-tokens", "2048"], ["--gradient-checkpointing"],
                ["--eval-batch", "8"], ["--head-read", "chunked"],
                ["--micro-batch", "2", "--micro-batch-tokens", "2736", "--gradient-checkpointing", "--eval-batch", "8"]]
RESULT_FLAGS = [["--group-size", "4"], ["--prompts-per-step", "4"], ["--max-new-tokens", "512"]]


@pytest.fixture
def gpu_run(tmp_path):
    """The GPU command's folder as a run that began every stage leaves it: its config.json (saved
    by the runner, with --micro-batch 16) and a final/ in each stage's folder. No model is loaded."""
    out = tmp_path / "qwen2.5-1.5b"
    config = train.resolved_config([*GPU_COMMAND, "--micro-batch", "16", "--out", str(out)])[0]
    stages = recipe(config)
    Runner(config, stages).write_config()
    for stage in stages:
        (stage_folder(config.out, stages, stage) / "final").mkdir(parents=True, exist_ok=True)
    return out


def rerun(out, flags):
    config = train.resolved_config([*GPU_COMMAND, *flags, "--out", str(out)])[0]
    return config, recipe(config)


@pytest.mark.parametrize("flags", MEMORY_FLAGS, ids=" ".join)
def test_a_memory_flag_resumes_the_folder_without_restart(flags, gpu_run):
    config, stages = rerun(gpu_run, flags)
    assert all(flag[2:].replace("-", "_") in BOOKKEEPING for flag in flags if flag.startswith("--"))
    assert stale_stages(config, stages) == ([], [])
    assert check_reuse(config, stages) == []  # neither refused nor anything deleted
    assert sorted(p.name for p in gpu_run.iterdir() if (p / "final").is_dir()) == ["1-sft", "2-rl-easy", "3-rl-hard"]


@pytest.mark.parametrize("flags", RESULT_FLAGS, ids=" ".join)
def test_a_result_flag_is_refused_without_restart(flags, gpu_run):
    """What a GRPO step samples changes: both GRPO stages are stale, the cold start is kept."""
    config, stages = rerun(gpu_run, flags)
    stale, named = stale_stages(config, stages)
    assert [s.name for s in stale] == ["rl-easy", "rl-hard"]
    flag = flags[0]
    assert len(named) == 1 and named[0].startswith(f"{flag} ")
    with pytest.raises(NanoparError) as refused:
        check_reuse(config, stages)
    message = str(refused.value)
    assert "2-rl-easy, 3-rl-hard" in message and "1-sft" not in message and "--restart" in message
    assert check_reuse(dataclasses.replace(config, restart=True), stages) == ["2-rl-easy", "3-rl-hard"]
    assert (gpu_run / "1-sft" / "final").is_dir() and not (gpu_run / "2-rl-easy").exists()


def test_the_two_models_of_a_comparison_start_equal(base_folder):
    """lora_model loads the same weights with and without checkpointing (seeded LoRA, seeded noise)."""
    one, two = lora_model(base_folder)[0], lora_model(base_folder, True)[0]
    for (name, a), (_, b) in zip(one.named_parameters(), two.named_parameters()):
        assert torch.equal(a, b), name
