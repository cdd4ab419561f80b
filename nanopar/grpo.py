"""GRPO, written out: one step from sampling to the optimiser, top to bottom (`grpo_step`).

    sample G responses per prompt -> reward each -> drop invalid -> group advantages -> update

"GRPO" as nanopar runs it, nothing hidden:
  - G responses per prompt (the sampler), one reward per response (rewards.py); PAPO's rule (NPR,
    `drop_invalid`) drops the rollouts the layout cannot lay out *before* the advantages;
  - advantage (`group_advantages`): (r - group mean) / (group std + eps) "zscore", r - group mean
    "mean", or over the std of the batch's rewards "batch" (PAPO); an all-equal group's are 0;
  - the loss (`policy_loss`): -A * ratio over *sampled* tokens only (prompt and inserted tags
    excluded), divided by the whole batch's sampled tokens or responses (`loss_agg`); on-policy by
    default, so the ratio is 1 and pi_old is the training read detached; with `updates > 1` the
    PPO-style clipped ratio; optional KL (k3) to a frozen `Reference`, the stage's starting policy;
  - the update (`grpo_update`): forward -> loss -> backward over micro-batches, gradient-norm
    clipping, a non-finite step skipped; a row whose advantage is 0 is not read (without a KL term
    its gradient is exactly 0);
  - under torchrun (distributed.py) each process samples whole groups of the step's prompts; what
    belongs to the step (PAPO's batch std, the update's denominators, the gradients, the metrics)
    is summed over the processes, so the step is the one a single process would take.
Where this departs from the papers' released codes (inserted tags untrained, no mini-batches or
dual clip, NPR's format RL not DAPO, the group std over n): docs/recipes.md, "Simplifications".
Not here: how the sampler or a reward works (sampler.py, rewards.py), DAPO's dynamic sampling
(dynamic_sampling.py), the optimiser (optim.py), which problems a step takes (stage_steps.py),
logging and checkpoints (runner.py).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import NanoparError, distributed
from .data import Problem
from .dynamic_sampling import Drawn, fill_with_signal
from .forward import TokenBatch, head_read_for, make_batch, micro_batches, trace_logprobs
from .metrics import rollout_metrics
from .optim import apply_gradients, backward
from .out_of_memory import SAMPLING, phase
from .policy import Policy
from .prompts import stop_ids
from .rewards import response_text, score
from .sampler import Rollout, SamplerSettings, sample


LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")  # GRPOSettings.loss_agg, named as verl names them


def check_loss_agg(agg: str) -> None:
    """A one-line error for a loss aggregation that is not one of `LOSS_AGGREGATIONS`."""
    if agg not in LOSS_AGGREGATIONS:
        raise NanoparError(f"unknown loss aggregation {agg!r}: use {' or '.join(map(repr, LOSS_AGGREGATIONS))}")


@dataclass
class GRPOSettings:
    group_size: int = 8  # G: responses sampled per prompt; advantages are relative within a group
    drop_invalid: bool = False  # drop rollouts the layout cannot lay out (malformed, cut inside a block) before the advantages (PAPO)
    advantage: str = "zscore"  # "zscore" (r - mean) / (std + eps), "mean" (r - mean) or "batch" (PAPO)
    unbiased_std: bool = False  # std over n - 1 (torch.std, both released codes) instead of n (the population's)
    updates: int = 1  # optimiser steps per rollout batch; 1 = on-policy, ratio = 1 (PAPO: 1 only)
    clip: float = 0.2  # PPO clip range of the ratio, below (and above unless clip_high); matters only when updates > 1
    clip_high: float | None = None  # upper clip range: a positive advantage's ratio held under 1 + this (clip-higher); None = clip
    loss_agg: str = "token-mean"  # "token-mean" (every sampled token of the batch alike) or "seq-mean-token-mean" (each response alike)
    kl_beta: float = 0.0  # weight of the KL to the reference policy (0 = no reference)
    micro_batch: int = 8  # rows per forward/backward (gradient accumulation over them)
    micro_batch_tokens: int = 0  # instead: rows sorted by length, packed so that rows x longest row <= this (0 = off)
    max_grad_norm: float = 1.0  # clip the gradient norm to this (0 = no clipping)
    head_read: str = "auto"  # training read of the LM head: "plain" (log_softmax of full logits), "chunked" (head.py), "auto" (chunked from a large vocabulary)
    filter_groups: bool = False  # DAPO's dynamic sampling: train on groups with two different rewards, drawing more prompts for them
    max_draws: int = 4  # with filter_groups: sampler calls a step may make, its own prompts' included

    def __post_init__(self):
        head_read_for(self.head_read, 0)  # a clear error now for an unknown read, not at the first update
        check_loss_agg(self.loss_agg)
        if self.updates < 1:
            raise NanoparError(f"a step makes at least one update: --updates {self.updates} is below 1")
        if self.max_draws < 1:
            raise NanoparError(f"a step makes at least one draw: --max-draws {self.max_draws} is below 1")
        # PAPO is on-policy (ratio 1, no clip); NPR's released code pins its ratio to 1 whatever its
        # mini-batches (npr-rl/verl/workers/actor/dp_actor.py, update_policy: on_policy = True). A
        # second update here would read pi_old from before the first and clip the ratio.
        if self.drop_invalid and self.updates != 1:
            raise NanoparError(f"PAPO (a stage that drops invalid rollouts) is on-policy, ratio 1 and no clip: "
                               f"it needs --updates 1, not {self.updates}")

    @property
    def upper_clip(self) -> float:
        """The ratio's upper clip range: `clip_high`, or `clip` when unset."""
        return self.clip if self.clip_high is None else self.clip_high

    @classmethod
    def from_flags(cls, config, stage) -> "GRPOSettings":
        """A GRPO stage's settings in a run: a field the stage sets itself (`drop_invalid`,
        `advantage`: curriculum.Stage) from the stage, every other from train.py's flag of the same
        name. The defaults above serve direct callers (tests, benchmarks); a run takes none of them."""
        return cls(**{name: getattr(stage if hasattr(stage, name) else config, name) for name in cls.__dataclass_fields__})


def grpo_step(model, tokenizer, optimizer, problems: list[Problem], prompts: list[list[int]], policy: Policy,
              sampling: SamplerSettings, settings: GRPOSettings, reward: dict[str, float],
              reference: Reference | None = None, scheduler=None, scaler=None,
              more: Callable[[int], tuple[list[Problem], list[list[int]], SamplerSettings]] | None = None,
              ) -> tuple[list[Rollout], dict]:
    """One GRPO step on a batch of problems (with their prompt ids); `scaler` a float16 model's loss
    scaler (optim.loss_scaler). With `settings.filter_groups` (DAPO's dynamic sampling,
    dynamic_sampling.py) `more(d)` gives the problems, prompt ids and sampler settings of the step's
    d-th extra draw, and the step trains on the first len(problems) groups that carry a signal.
    -> (every rollout sampled, draw after draw; metrics)"""
    if settings.filter_groups and more is None:
        raise NanoparError("a step that filters its groups needs the problems of its further draws (`more`)")
    G = settings.group_size
    eos = stop_ids(model, tokenizer)
    started = time.perf_counter()

    def sample_scored(problems, prompts, sampling) -> Drawn:  # G responses to each prompt, each scored
        with phase(SAMPLING):
            rollouts = sample(model, prompts, policy, sampling, eos, G)  # [B * G], prompt-major, forked at <Parallel>
        owners = [problem for problem in problems for _ in range(G)]  # [B * G]
        return Drawn(problems, rollouts, [score(reward, response_text(r, tokenizer, eos), r.trace, p)
                                          for r, p in zip(rollouts, owners)])

    drawn = trained = sample_scored(problems, prompts, sampling)
    filtered = {}
    if settings.filter_groups:  # DAPO's dynamic sampling: drop the groups of one reward, draw more prompts
        trained, drawn, filtered = fill_with_signal(drawn, lambda d: sample_scored(*more(d)), len(problems), G,
                                                    settings.max_draws, settings.drop_invalid)
    sampled = time.perf_counter()
    rollouts, results = trained.rollouts, trained.results  # [B * G] (fewer groups: a filter's cap reached)
    rewards = torch.tensor([result.total for result in results])  # [B * G]
    kept = torch.tensor([result.layout_ok or not settings.drop_invalid for result in results], dtype=bool)  # PAPO
    advantages = group_advantages(rewards, G, settings.advantage, kept, settings.unbiased_std)  # [B * G], 0 where dropped
    keep = kept.nonzero().flatten().tolist()
    # every kept advantage 0 and no KL term: the loss and its gradient are 0, so skip the forward and
    # backward (the scheduler still steps, so the learning-rate schedule keeps its place)
    signal = bool(advantages[keep].ne(0).any()) or has_kl_term(reference, settings)
    # under torchrun every process updates if any has something to learn (the gradients are summed
    # over all of them), a process that kept nothing with zeros; in one process: keep and signal
    learn = distributed.any_rank(bool(keep) and signal, "the vote on whether the step learns")
    update = {}
    if learn:
        update = grpo_update(model, optimizer, [rollouts[i] for i in keep], advantages[keep], policy, settings,
                             tokenizer.pad_token_id or 0, reference, scheduler, scaler)
    elif scheduler is not None:
        with warnings.catch_warnings():  # torch warns when a schedule moves before any optimiser step: here it is meant
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            scheduler.step()
    updated = time.perf_counter()
    # the step's numbers are over everything sampled (every draw is a random batch of problems), under
    # torchrun every process's rollouts
    every_rollout, every_result = whole_step(drawn.rollouts, drawn.results, G)
    tokens = sum(r.stats.new_tokens for r in every_rollout)  # under torchrun: over rank 0's sampling time
    return drawn.rollouts, rollout_metrics(every_rollout, every_result, G) | update | filtered | {
        "reward_spec": reward, "dropped_invalid": sum(settings.drop_invalid and not res.layout_ok for res in every_result),
        "skipped_no_signal": not learn,  # no update: nothing kept, or every advantage 0
        "paid": [result.total for result in drawn.results],  # each rollout's reward (--save-rollouts saves it: stage_steps.py)
        "sample_seconds": sampled - started, "train_seconds": updated - sampled,  # sampling with its scoring
        "tokens_per_second": tokens / max(sampled - started, 1e-9),
        "kv_cache_mb": max(r.stats.peak_cache_bytes for r in every_rollout) / 2**20,  # the sampler's batched cache
    }


def whole_step(rollouts: list[Rollout], results: list, group_size: int) -> tuple[list[Rollout], list]:
    """The step's rollouts and their reward results: under torchrun every process's, gathered group
    by group in the order of the step's prompts (`distributed.share` dealt them); in one process
    its own, untouched."""
    if not distributed.active():
        return rollouts, results
    pairs = list(zip(rollouts, results))
    groups = [pairs[j: j + group_size] for j in range(0, len(pairs), group_size)]  # one per prompt
    everyone = [pair for group in distributed.unshare(groups, "the gather of the step's rollouts") for pair in group]
    return [rollout for rollout, _ in everyone], [result for _, result in everyone]


def group_advantages(rewards: torch.Tensor, group_size: int, kind: str = "zscore", kept: torch.Tensor | None = None,
                     unbiased: bool = False, eps: float = 1e-6):
    """One advantage per response. rewards [N] (N = prompts x G, prompt-major), kept [N] bool -> [N]

    Only kept responses count (None: all): a group is its surviving members, so its mean and std
    are theirs; a dropped response gets 0. "batch" divides by the std of every kept reward in the
    batch, and a group left with one member is measured against 0 (advantage r / batch std), as
    NPR's released PAPO does, unless every kept reward is equal (std 0: then 0, not r / eps);
    "zscore" and "mean" give a lone member 0 (nothing to compare it with: Parallel-R1 never
    drops, so its groups are whole). Stds are population stds (divide by n), or with `unbiased`
    divide by n - 1 as both released codes do (`torch.std`): with whole groups of G that scales
    every advantage by sqrt((G - 1) / G) alike, which AdamW's normalised step all but cancels.

    >>> [round(a, 3) for a in group_advantages(torch.tensor([1., -1., 1., 1.]), 2).tolist()]
    [1.0, -1.0, 0.0, 0.0]
    >>> group_advantages(torch.tensor([3., 1., 1., 1.]), 2, "mean").tolist()
    [1.0, -1.0, 0.0, 0.0]
    >>> kept = torch.tensor([False, True, True, True])  # PAPO dropped the first response
    >>> [round(a, 3) for a in group_advantages(torch.tensor([1., 1., 1., -1.]), 4, "zscore", kept).tolist()]
    [0.0, 0.707, 0.707, -1.414]
    """
    if rewards.numel() % group_size:
        raise NanoparError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if kind not in ("zscore", "mean", "batch"):
        raise NanoparError(f"unknown advantage {kind!r}: use 'zscore', 'mean' or 'batch'")
    kept = torch.ones_like(rewards, dtype=torch.bool) if kept is None else kept
    groups = rewards.view(-1, group_size)  # [P, G]
    weight = kept.view(-1, group_size).to(rewards.dtype)  # [P, G] 1 = kept
    members = weight.sum(-1, keepdim=True).clamp(min=1)  # [P, 1]
    mean = (groups * weight).sum(-1, keepdim=True) / members  # [P, 1] over the kept members
    # a group whose kept rewards are all equal gets exactly 0: its mean is not always exactly its
    # reward (6 x 0.3 / 6), and (r - mean) / (std + eps) would turn that rounding into an advantage
    low = torch.where(kept.view(-1, group_size), groups, groups.new_tensor(float("inf"))).amin(-1, keepdim=True)
    high = torch.where(kept.view(-1, group_size), groups, groups.new_tensor(float("-inf"))).amax(-1, keepdim=True)
    centred = torch.where(low == high, 0.0, groups - mean) * weight  # [P, G] 0 where dropped or all equal
    if kind == "mean":
        return centred.flatten()
    if kind == "zscore":
        std = (centred.square().sum(-1, keepdim=True) / (members - int(unbiased)).clamp(min=1)).sqrt()  # [P, 1]
    else:  # batch
        std = batch_std(rewards[kept], unbiased)  # []
        # NPR's released PAPO gives a group of one the mean 0, so its advantage is r / batch std
        # (npr-rl/verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage). Its std there
        # is torch.std (n - 1) taken inside the loop that overwrites the scores, so each response
        # sees another std; nanopar takes the population std of the kept rewards once. A batch of
        # equal rewards (std 0) would give r / eps, +-1e6 there: here its lone members get 0, as
        # every other member of that batch does.
        alone = (weight.sum(-1, keepdim=True) == 1) & (std > 0)  # [P, 1]
        centred = torch.where(alone, groups * weight, centred)  # [P, G]
    return (centred / (std + eps)).flatten()


def batch_std(survivors: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """The population std of a step's kept rewards [n] -> [] (0 for none; `unbiased`: over n - 1,
    0 for one). Under torchrun the step's rewards are spread over the processes: its std comes from
    their all-reduced count and sum (the mean), then their all-reduced squared deviations from that
    mean, in float64."""
    if distributed.world_size() == 1:
        return survivors.std(unbiased=unbiased) if survivors.numel() > unbiased else survivors.new_zeros(())
    count, total = distributed.all_reduce(torch.tensor([survivors.numel(), survivors.double().sum()],
                                                       dtype=torch.float64), "the count and sum of the step's rewards").tolist()
    mean = total / max(count, 1)
    squares = distributed.sum_over_ranks((survivors.double() - mean).square().sum().item(),
                                         "the spread of the step's rewards")
    return survivors.new_tensor((squares / (count - unbiased)) ** 0.5 if count > unbiased else 0.0)


def rollout_batch(rollouts, pad_id: int, device="cpu") -> TokenBatch:
    """prompt + response rows; the loss weight is 1 on sampled tokens, 0 on inserted ones (both
    released codes weigh inserted tags 1 too: docs/recipes.md, "Simplifications")."""
    return make_batch([r.prompt_ids for r in rollouts], [r.ids for r in rollouts],
                      [[float(s) for s in r.sampled] for r in rollouts], pad_id, device,
                      recorded=[r.logprobs for r in rollouts])


def policy_loss(new: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                total: float, clip: float, ref: torch.Tensor | None = None, kl_beta: float = 0.0,
                clip_high: float | None = None, agg: str = "token-mean"):
    """The GRPO loss of a micro-batch: new/old/ref [b, T-1] log-probs, advantages [b], mask [b, T-1].

    `total` is what the whole batch's loss is divided by: its sampled tokens ("token-mean") or its
    responses ("seq-mean-token-mean": each row first averaged over its own sampled tokens). The
    ratio is clipped to [1 - clip, 1 + clip_high] (clip_high None: clip)."""
    check_loss_agg(agg)
    high = clip if clip_high is None else clip_high
    ratio = torch.exp(new - old)  # [b, T-1] exactly 1 on the first update
    A = advantages[:, None]  # [b, 1]
    per_token = -torch.min(ratio * A, ratio.clamp(1 - clip, 1 + high) * A)  # [b, T-1] no dual clip (verl's)
    if ref is not None and kl_beta > 0:
        per_token = per_token + kl_beta * (torch.exp(ref - new) - (ref - new) - 1)  # k3 >= 0
    if agg == "seq-mean-token-mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / total  # [b] row means, summed
    return (per_token * mask).sum() / total


class Reference:
    """The policy as it was when this object was made: a snapshot of its trainable parameters.

    With LoRA that is only the adapter (and tag rows), so it is cheap and works with 4-bit bases;
    inside `with reference.active():` the model computes the reference policy. After SFT it is
    the SFT adapter (what the KL should hold on to), never the bare base model.
    """

    def __init__(self, model, values: list[torch.Tensor] | None = None):
        """Snapshot `model`'s trainable parameters now, or take `values` (in the same order),
        e.g. those of the stage's input model when a run resumes from a later checkpoint."""
        params = [p for p in model.parameters() if p.requires_grad]
        values = values if values is not None else [p.detach().clone() for p in params]
        if len(values) != len(params) or any(v.shape != p.shape for p, v in zip(params, values)):
            raise NanoparError("reference values do not match the model's trainable parameters")
        self.pairs = list(zip(params, values))

    @contextlib.contextmanager
    def active(self):
        with torch.no_grad():
            current = [p.detach().clone() for p, _ in self.pairs]
            for p, frozen in self.pairs:
                p.copy_(frozen)
        try:
            yield
        finally:
            with torch.no_grad():
                for (p, _), value in zip(self.pairs, current):
                    p.copy_(value)


def has_kl_term(reference: Reference | None, settings: GRPOSettings) -> bool:
    """Whether the loss holds the KL term: a reference to pull towards and beta > 0. Without it a row
    whose advantage is 0 adds nothing to the loss or its gradient."""
    return reference is not None and settings.kl_beta > 0


@dataclass
class Denominators:
    """What `grpo_update` divides by, counted once before it reads a row: over every process's
    rollouts under torchrun (a process may hold none), its own in one process."""
    loss: torch.Tensor  # [] the loss's: sampled tokens ("token-mean") or responses ("seq-mean-token-mean"), >= 1
    tokens_read: float  # sampled tokens of the rows the update reads: the logged entropy and gap are means over them
    rows_read: float  # the share of the batch's responses the update reads (`read_rows`)


def denominators(batch: TokenBatch, micros: list[TokenBatch], agg: str) -> Denominators:
    """The update's denominators from its whole batch and the micro-batches it reads, in one sum
    over the processes."""
    counts = distributed.sum_each({"tokens": batch.target_mask.sum().item(), "responses": len(batch),
                                   "tokens_read": sum(micro.target_mask.sum().item() for micro in micros),
                                   "rows_read": sum(map(len, micros))}, "the count of the step's rows and tokens")
    loss = counts["tokens"] if agg == "token-mean" else counts["responses"]
    return Denominators(torch.tensor(float(max(loss, 1)), device=batch.target_mask.device),
                        max(counts["tokens_read"], 1), counts["rows_read"] / counts["responses"])


def rows_to_read(advantages: torch.Tensor, kl: bool) -> list[int]:
    """The rows the update reads, advantages [N] -> indices: all of them with a KL term, else those
    whose advantage is not 0. A row whose advantage is 0 adds exactly 0 to the loss's gradient
    (-min(r A, clip(r) A) = 0) unless a KL term holds it (a group of one reward, a reward equal to
    its group's mean); the loss's divisor still counts its tokens, so the gradient is the one of
    every row, up to rounding."""
    return list(range(len(advantages))) if kl else advantages.ne(0).nonzero().flatten().tolist()


def grpo_update(model, optimizer, rollouts: list[Rollout], advantages: torch.Tensor, policy: Policy,
                settings: GRPOSettings, pad_id: int, reference: Reference | None = None, scheduler=None,
                scaler=None) -> dict:
    """`settings.updates` optimiser steps on one rollout batch. -> metrics of the last step"""
    device = next(model.parameters()).device
    batch = rollout_batch(rollouts, pad_id, device)
    kl = has_kl_term(reference, settings)
    read, lengths = rows_to_read(advantages, kl), batch.lengths()  # rows of the batch; tokens of each row
    groups = [[read[j] for j in rows] for rows in micro_batches([lengths[i] for i in read], settings.micro_batch,
                                                                settings.micro_batch_tokens)]
    micros = [batch.rows(rows) for rows in groups]
    denominator = denominators(batch, micros, settings.loss_agg)  # the whole step's, before any row is read
    advantages = advantages.to(device)  # [N]
    model.train()
    logprobs = lambda micro: trace_logprobs(model, micro, policy, head_read=settings.head_read)[0]  # [b, T-1]
    with torch.no_grad():  # pi_old (only off-policy: on-policy it is the training read) and the reference, once
        old = [logprobs(micro) for micro in micros] if settings.updates > 1 else None
        ref = None
        if kl:
            with reference.active():
                ref = [logprobs(micro) for micro in micros]
    gap = 0.0
    for update in range(settings.updates):  # each over the whole batch (the released codes: one mini-batch each)
        optimizer.zero_grad(set_to_none=True)
        loss_sum, entropy_sum = 0.0, 0.0
        for j, (rows, micro) in enumerate(zip(groups, micros)):
            new, entropy = trace_logprobs(model, micro, policy, with_entropy=True,  # forward: [b, T-1] each
                                           head_read=settings.head_read)
            before = new.detach() if old is None else old[j]  # [b, T-1] pi_old
            loss = policy_loss(new, before, advantages[rows], micro.target_mask, denominator.loss, settings.clip,
                               None if ref is None else ref[j], settings.kl_beta, settings.upper_clip, settings.loss_agg)
            backward(loss, scaler)
            loss_sum += loss.item()
            entropy_sum += (entropy * micro.target_mask).sum().item()
            if update == 0:  # how far the trainer's reading is from the sampler's log-probs (~0 on-policy in fp32)
                gap += ((before - micro.recorded) * micro.target_mask).abs().sum().item()
        norm, skipped = apply_gradients(model, optimizer, settings.max_grad_norm, scheduler, scaler)  # summed over processes
    sums = distributed.sum_each({"loss": loss_sum, "entropy": entropy_sum, "gap": gap},
                                "the sum of the step's loss, entropy and gap")  # the last update's loss and entropy
    return {"loss": sums["loss"], "grad_norm": norm, "skipped_step": skipped,
            "entropy": sums["entropy"] / denominator.tokens_read, "logprob_gap": sums["gap"] / denominator.tokens_read,
            "read_rows": denominator.rows_read}
