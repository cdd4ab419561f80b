"""nanopar's GRPO step against TRL's GRPOTrainer: one model, one batch, one update, taking turns.

How nanopar's hand-written GRPO step (`grpo_step`: its sampler, its training read) compares in speed
and memory with TRL 1.16's `GRPOTrainer` (transformers' `generate`, its own loss) on the same work,
in one process on this CPU.

    python bench/trl_grpo.py                              # Qwen2.5-Coder-0.5B, 2 x 8 x 128 tokens, 3 rounds
    python bench/trl_grpo.py --quick                      # 2 x 2 x 16 tokens, one round
    python bench/trl_grpo.py --quick --model tiny:qwen2   # the same code on a random tiny model: seconds

Needs TRL (`pip install -e .[bench]`: trl==1.16.0). The same work on both sides:
  - the model: --model (pypi:qwen2.5-coder-0.5b) loaded twice by `load_model`, in --dtype (auto:
    `defaults.cpu_dtype`, bfloat16 on a CPU with bfloat16 instructions), LoRA r16, alpha 32, no
    dropout on the seven projections (`model.QWEN_PROJECTIONS`), B = 0 at the start. nanopar's
    copy loads as train.py loads it (`lora=True`: the LoRA and the trainable tag rows); TRL's
    without LoRA, which TRL adds itself from a `peft_config` of those numbers, so TRL trains the
    LoRA alone (nanopar's 6 tag rows, d values each, come with nanopar's row-wise forward: handing
    TRL nanopar's model would hand it nanopar's forwards too);
  - the batch: the first --prompts GSM8K train questions with Qwen's one-line answer request
    (`instructions_named("answer")`), in the chat template (TRL gets the messages and applies it
    itself; a tokenizer without a template, tiny:qwen2's, the plain text `build_prompt` writes;
    the script checks that TRL's prompt ids are nanopar's), --group-size responses each, T
    = 1, no top-k / top-p, exactly --max-new-tokens tokens a response (nanopar: no stop ids;
    TRL: generation_kwargs min_new_tokens = max_completion_length), no tags (nanopar's plain
    policy: nothing forks, as in `generate`);
  - the reward: the response's place among all those scored (`bench_order`, as bench/qwen.py's;
    TRL gets it through `rewards.as_trl_reward`): never equal in a group, so every group has a
    signal and the update always runs;
  - the update: one AdamW step (torch's, lr --lr, no weight decay, a constant rate, the gradient
    norm clipped to 1) over every row in one forward and backward, on-policy (ratio 1, no second
    read of pi_old), token-mean loss (nanopar's "token-mean", TRL's "dapo"), z-scored group
    advantages, no KL and no reference model (beta = 0), no gradient checkpointing. TRL:
    num_iterations = 1, gradient_accumulation_steps = 1, per_device_train_batch_size =
    generation_batch_size = prompts x group, use_cpu, no vLLM, no hub, report_to "none", its
    output_dir a temporary folder; --trl-autocast auto sets its bf16 flag (accelerate's CPU
    autocast, TRL's default) where the model is bfloat16; nanopar runs no autocast.
Each optimiser is made once and keeps its state across the steps.
How a step is split:
  - nanopar: `grpo_step`'s own clock: generate = its sampler call (`sample_seconds`), step = the
    wall time of the whole call, update = step - generate (scoring, advantages, the training read
    forward + backward, clipping, AdamW). `grpo_step` takes its stop ids from `prompts.stop_ids`;
    the script swaps that for [] inside the call;
  - TRL: each turn is one `trainer.train()` with max_steps = 1 (the same trainer, optimiser and
    model every time). step = a TrainerCallback's on_step_begin -> on_step_end (the generation
    batch made, scored and trained on, clipping, AdamW, scheduler); generate = the wall time of
    the trainer's `_generate_single_turn`, wrapped on the instance (padding, `model.generate`,
    the cut at EOS); update = step - generate (rewards, advantages, the loss's forward and
    backward, clipping, AdamW). "TRL call" is the whole `train()` call: the data loader, accelerate's
    prepare and the end of training around the step, paid once per step here only because the
    turns take one step each.
Peak memory: the peak resident-set rise of each call (`common.peak_rise`: the nanopar step, TRL's
whole train() call), from what the process held before it (both models stay loaded).
Rounds: a warm-up step of each (nanopar, then TRL), then --rounds rounds of nanopar, then TRL.
A row a round, each cell nanopar / TRL = ratio (below 1: nanopar takes less), the 1-minute load
average before -> after it; the last row: the fastest round of each time, the largest memory rise.
--quick: --prompts 2, --group-size 2, --max-new-tokens 16, --rounds 1 (it overrides those flags).
Not here: a GPU, vLLM, 4-bit weights, gradient checkpointing, forking (bench/sampler.py,
bench/qwen.py), whether either side learns (lr 1e-6, one step; eval.py), several processes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning threads crawl on a shared CPU

import contextlib
import tempfile
import time
import warnings

import torch
from rich.console import Console
from rich.table import Table

from common import MB, bench_args, bench_order, bench_parser, peak_rise, write_report

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError:
    raise SystemExit("bench/trl_grpo.py needs TRL, which is not installed: pip install -e .[bench]") from None

import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402

from nanopar import grpo  # noqa: E402
from nanopar.data import load_problems  # noqa: E402
from nanopar.defaults import cpu_dtype, on_cpu  # noqa: E402
from nanopar.grpo import GRPOSettings, grpo_step  # noqa: E402
from nanopar.model import QWEN_PROJECTIONS, ModelSettings, cpu_bf16_instructions, load_model  # noqa: E402
from nanopar.optim import make_optimizer  # noqa: E402
from nanopar.policy import Policy  # noqa: E402
from nanopar.prompts import build_prompt, instructions_named  # noqa: E402
from nanopar.rewards import as_trl_reward, register  # noqa: E402
from nanopar.sampler import SamplerSettings  # noqa: E402

# transformers 5.24 renames gradient checkpointing; TRL 1.16 still reads and sets the old names
warnings.filterwarnings("ignore", message=".*gradient_checkpointing.* is deprecated", category=FutureWarning)
register("bench_order", replace=True)(bench_order)  # both contestants' reward
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}  # ModelSettings' defaults, written out for TRL's peft_config




def load(name: str, dtype: str, lora: bool):
    """(model, tokenizer) as train.py loads them (lora=True: LoRA with B = 0 and the tag rows)."""
    torch.manual_seed(0)
    return load_model(ModelSettings(name, dtype=dtype, lora=lora, lora_rank=LORA["r"], lora_alpha=LORA["lora_alpha"],
                                    lora_dropout=LORA["lora_dropout"], lora_target_modules=QWEN_PROJECTIONS))


def lora_moved(model) -> bool:
    """Whether any LoRA B matrix left 0: an update ran."""
    return any(p.detach().ne(0).any().item() for n, p in model.named_parameters() if "lora_B" in n)


class Nanopar:
    """nanopar's side: `grpo_step` on its own copy of the model, one micro-batch of every row."""

    name = "nanopar"

    def __init__(self, args, dtype: str, problems, instructions: str):
        self.model, self.tokenizer = load(args.model, dtype, lora=True)
        self.problems, self.tokens = problems, args.max_new_tokens
        self.prompts = [build_prompt(p, self.tokenizer, instructions) for p in problems]
        self.policy = Policy(None, temperature=1.0, vocab_size=len(self.tokenizer))  # no tags: nothing forks
        self.settings = GRPOSettings(group_size=args.group_size, micro_batch=len(problems) * args.group_size,
                                     max_grad_norm=1.0, loss_agg="token-mean", advantage="zscore")
        self.optimizer, _ = make_optimizer(self.model, args.lr)  # AdamW, no weight decay, a constant rate
        self.steps = 0

    def step(self) -> dict:
        sampling = SamplerSettings(max_new_tokens=self.tokens, seed=self.steps)
        self.steps += 1
        with no_stop_ids():
            started = time.perf_counter()
            rollouts, metrics = grpo_step(self.model, self.tokenizer, self.optimizer, self.problems, self.prompts,
                                          self.policy, sampling, self.settings, {"bench_order": 1.0})
            seconds = time.perf_counter() - started
        assert not metrics["skipped_no_signal"]  # the update ran (bench_order: every group has a signal)
        assert [r.stats.new_tokens for r in rollouts] == [self.tokens] * len(rollouts), [r.stats.new_tokens for r in rollouts]
        return {"generate": metrics["sample_seconds"], "update": seconds - metrics["sample_seconds"], "step": seconds,
                "rows": len(rollouts), "tokens": sum(r.stats.new_tokens for r in rollouts)}


@contextlib.contextmanager
def no_stop_ids():
    """Inside: `grpo_step` samples with no stop ids (it asks `prompts.stop_ids`, imported into grpo.py)."""
    original = grpo.stop_ids
    grpo.stop_ids = lambda model, tokenizer: []
    try:
        yield
    finally:
        grpo.stop_ids = original


class StepClock(TrainerCallback):
    """Wall time of each optimiser step of a Trainer: on_step_begin -> on_step_end."""

    def __init__(self):
        self.seconds, self.started = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


class TRL:
    """TRL's side: one GRPOTrainer, whose train() runs one step (max_steps = 1) each turn."""

    name = "TRL"

    def __init__(self, args, dtype: str, problems, instructions: str, expected: list[list[int]], out_dir: str):
        model, tokenizer = load(args.model, dtype, lora=False)
        tokenizer.padding_side = "left"  # what TRL asks of its processing class
        self.tokens, self.group = args.max_new_tokens, args.group_size
        contents = [f"{instructions}\n\n{p.question}" if instructions else p.question for p in problems]  # build_prompt's
        chat = bool(getattr(tokenizer, "chat_template", None))  # a tiny model's tokenizer has no template: plain text
        prompts = [[{"role": "user", "content": c}] for c in contents] if chat else [c + "\n" for c in contents]
        dataset = Dataset.from_dict({"prompt": prompts, "answer": [p.answer for p in problems]})
        rows = len(problems) * args.group_size
        self.bf16 = bf16 = {"auto": dtype == "bfloat16", "on": True, "off": False}[args.trl_autocast]
        config = GRPOConfig(
            output_dir=out_dir, report_to="none", use_cpu=True, bf16=bf16, fp16=False, seed=0,
            max_steps=1, logging_strategy="no", save_strategy="no", disable_tqdm=True,
            learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            optim="adamw_torch", max_grad_norm=1.0, gradient_checkpointing=False,
            per_device_train_batch_size=rows, generation_batch_size=rows, gradient_accumulation_steps=1,
            num_generations=args.group_size, num_iterations=1, beta=0.0, loss_type="dapo", scale_rewards="group",
            mask_truncated_completions=False,  # every completion is cut at the budget: masking them would train nothing
            max_completion_length=args.max_new_tokens, generation_kwargs={"min_new_tokens": args.max_new_tokens},
            temperature=1.0, top_p=1.0, top_k=0, shuffle_dataset=False, use_vllm=False,
        )
        self.clock = StepClock()
        peft_config = LoraConfig(**LORA, target_modules=list(QWEN_PROJECTIONS), task_type="CAUSAL_LM")
        self.trainer = GRPOTrainer(model=model, reward_funcs=as_trl_reward("bench_order", tokenizer), args=config,
                                   train_dataset=dataset, processing_class=tokenizer, callbacks=[self.clock],
                                   peft_config=peft_config)
        self.trainer.remove_callback(PrinterCallback)  # it prints every train() call's metrics
        self.model = self.trainer.model
        self.expected = sorted(tuple(p) for p in expected for _ in range(args.group_size))
        self.generate_seconds = []
        generate = self.trainer._generate_single_turn  # the bound method: padding, model.generate, the cut at EOS

        def timed_generate(prompt_ids, *rest, **kwargs):
            assert sorted(map(tuple, prompt_ids)) == self.expected, "TRL's prompt ids are not nanopar's"
            started = time.perf_counter()
            completion_ids, logprobs = generate(prompt_ids, *rest, **kwargs)
            self.generate_seconds.append(time.perf_counter() - started)
            assert [len(c) for c in completion_ids] == [self.tokens] * len(completion_ids), [len(c) for c in completion_ids]
            self.last_tokens = sum(map(len, completion_ids))
            return completion_ids, logprobs

        self.trainer._generate_single_turn = timed_generate

    def step(self) -> dict:
        steps, generations = len(self.clock.seconds), len(self.generate_seconds)
        started = time.perf_counter()
        self.trainer.train()
        call = time.perf_counter() - started
        assert len(self.clock.seconds) == steps + 1 and len(self.generate_seconds) == generations + 1
        step, generate = self.clock.seconds[-1], self.generate_seconds[-1]
        return {"generate": generate, "update": step - generate, "step": step, "call": call,
                "rows": self.trainer.args.per_device_train_batch_size, "tokens": self.last_tokens}


def measure(contestant) -> dict:
    rise, result = peak_rise(contestant.step)
    return result | {"peak_rise_mb": rise / MB}


def cell(ours: float, theirs: float, digits: int = 2) -> str:
    return f"{ours:,.{digits}f} / {theirs:,.{digits}f} = {ours / theirs:.2f}"


def main(argv: list[str] | None = None) -> dict:
    parser = bench_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=2, help="GSM8K train questions a step")
    parser.add_argument("--group-size", type=int, default=8, help="responses a question (G)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens a response, exactly (no stop)")
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate of both optimisers")
    parser.add_argument("--trl-autocast", choices=("auto", "on", "off"), default="auto",
                        help="TRL's bf16 flag (accelerate's CPU autocast); auto: on when the model is bfloat16")
    args = bench_args(parser, argv, (3, "timed rounds after the warm-up (nanopar, then TRL)"),
                      dict(prompts=2, group_size=2, max_new_tokens=16, rounds=1), "tiny sizes, one round")
    dtype = cpu_dtype(False) if args.dtype == "auto" and on_cpu("auto") else args.dtype
    console = Console(width=160)
    console.print(f"{args.model}, dtype {dtype} (bfloat16 instructions: {cpu_bf16_instructions()}), "
                  f"{torch.get_num_threads()} threads, trl {trl.__version__}, transformers {transformers.__version__}, "
                  f"load average {os.getloadavg()[0]:.1f}", highlight=False)
    started = time.perf_counter()
    instructions = instructions_named("answer")
    problems = load_problems("gsm8k_train", limit=args.prompts)
    ours = Nanopar(args, dtype, problems, instructions)
    with tempfile.TemporaryDirectory(prefix="trl_grpo-") as out_dir:
        theirs = TRL(args, dtype, problems, instructions, ours.prompts, out_dir)
        rows = []
        for round_ in range(args.rounds + 1):  # round 0: the warm-up
            before = os.getloadavg()[0]
            pair = {c.name: measure(c) for c in (ours, theirs)}
            if round_ == 0:
                assert lora_moved(ours.model) and lora_moved(theirs.model), "a warm-up step left LoRA's B at 0"
            rows.append({"round": round_ or "warm-up", **pair, "load_before": before, "load_after": os.getloadavg()[0]})
    timed = rows[1:]
    best = {"round": f"best of {len(timed)}", "load_before": timed[0]["load_before"], "load_after": timed[-1]["load_after"]}
    for name in ("nanopar", "TRL"):
        best[name] = {key: min(r[name][key] for r in timed) for key in ("generate", "update", "step")}
        best[name]["peak_rise_mb"] = max(r[name]["peak_rise_mb"] for r in timed)
    best["TRL"]["call"] = min(r["TRL"]["call"] for r in timed)
    P, G, N = args.prompts, args.group_size, args.max_new_tokens
    table = Table(title=f"nanopar's grpo_step vs TRL {trl.__version__}'s GRPOTrainer: {P} prompts x {G} responses x "
                        f"{N} tokens, {dtype}, TRL autocast {'on' if theirs.bf16 else 'off'}")
    for column in ("round", "generate s", "update s", "step s", "peak MB added", "TRL call s", "load (1 min)"):
        table.add_column(column, justify="right")
    for r in [*rows, best]:
        a, b = r["nanopar"], r["TRL"]
        table.add_row(str(r["round"]), cell(a["generate"], b["generate"]), cell(a["update"], b["update"]),
                      cell(a["step"], b["step"]), cell(a["peak_rise_mb"], b["peak_rise_mb"], 0), f"{b['call']:.2f}",
                      f"{r['load_before']:.1f} -> {r['load_after']:.1f}")
    table.caption = ("each cell: nanopar / TRL = ratio (below 1: nanopar takes less); the last row: the fastest "
                     "timed round of each, the largest memory rise; TRL call: its whole train() around the step")
    console.print(table)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(),
              "bf16_instructions": cpu_bf16_instructions(), "trl": trl.__version__,
              "transformers": transformers.__version__, "rows": rows, "best": best,
              "seconds": time.perf_counter() - started}
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
