"""GRPO (grpo.py), SFT (sft.py) and the shared training forward against hand-written formulas."""

import copy
import statistics
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import PAD, TAGS, V, bias_logits, load_char_model
from nanopar import NanoparError
from nanopar.forward import make_batch, trace_logprobs
from nanopar.grpo import GRPOSettings, Reference, group_advantages, grpo_update, policy_loss
from nanopar.optim import make_optimizer
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.sft import response_loglikelihood, sft_step
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model


def test_advantages_follow_their_definition():
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0, 0.0, 1.0, -3.0])
    got = group_advantages(rewards, 4)
    for g in range(3):
        group = rewards[4 * g : 4 * g + 4].tolist()
        mean, std = statistics.fmean(group), statistics.pstdev(group)
        expected = [(r - mean) / (std + 1e-6) for r in group]
        assert got[4 * g : 4 * g + 4].tolist() == pytest.approx(expected, abs=1e-5)
    assert group_advantages(rewards, 4, "mean")[8:].tolist() == pytest.approx([2.0, 0.0, 1.0, -3.0])
    with pytest.raises(Exception, match="do not split into groups of 5"):
        group_advantages(rewards, 5)


def test_papo_drops_before_the_advantages():
    """The group [1, 1, 1, -1] with its first response dropped. Normalising first and dropping
    after (the wrong order) would leave kept advantages 0.577 + 0.577 - 1.732 = -0.577."""
    rewards, kept = torch.tensor([1.0, 1.0, 1.0, -1.0]), torch.tensor([False, True, True, True])
    # the kept group [1, 1, -1]: mean 1/3, centred [2/3, 2/3, -4/3], std sqrt((4/9 + 4/9 + 16/9) / 3) = sqrt(8/9)
    std = (8 / 9) ** 0.5
    expected = [0.0, (2 / 3) / std, (2 / 3) / std, (-4 / 3) / std]  # [0, 0.7071, 0.7071, -1.4142]
    got = group_advantages(rewards, 4, "zscore", kept)
    assert got.tolist() == pytest.approx(expected, abs=1e-5) and got[kept].sum().item() == pytest.approx(0, abs=1e-6)
    assert group_advantages(rewards, 4, "mean", kept).tolist() == pytest.approx([0, 2 / 3, 2 / 3, -4 / 3])
    # a group left with one member has nothing to be compared with: advantage 0
    alone = group_advantages(torch.tensor([5.0, 1.0, 2.0, 0.0]), 2, "zscore", torch.tensor([True, False, True, True]))
    assert alone.tolist() == pytest.approx([0.0, 0.0, 1.0, -1.0], abs=1e-5)


def test_batch_advantage_divides_by_the_std_of_the_kept_batch():
    """PAPO: reward minus its group mean, over the std of every kept reward in the batch."""
    rewards = torch.tensor([1.0, 0.0, -1.0, 2.0, 2.0, 5.0])  # groups of 3: [1, 0, -1] and [2, 2, 5]
    # means 0 and 3: centred [1, 0, -1, -1, -1, 2]; the batch [1, 0, -1, 2, 2, 5] has mean 1.5,
    # squared deviations 0.25 + 2.25 + 6.25 + 0.25 + 0.25 + 12.25 = 21.5, std sqrt(21.5 / 6) = 1.8930
    std = (21.5 / 6) ** 0.5
    assert group_advantages(rewards, 3, "batch").tolist() == pytest.approx(
        [1 / std, 0.0, -1 / std, -1 / std, -1 / std, 2 / std], abs=1e-5)
    # drop the 5: group 2 is [2, 2] (centred 0, 0); the kept batch [1, 0, -1, 2, 2] has mean 0.8,
    # squared deviations 0.04 + 0.64 + 3.24 + 1.44 + 1.44 = 6.8, std sqrt(6.8 / 5) = 1.1662
    kept = torch.tensor([True, True, True, True, True, False])
    std = (6.8 / 5) ** 0.5
    assert group_advantages(rewards, 3, "batch", kept).tolist() == pytest.approx(
        [1 / std, 0.0, -1 / std, 0.0, 0.0, 0.0], abs=1e-5)
    with pytest.raises(Exception, match="unknown advantage 'group'"):
        group_advantages(rewards, 3, "group")


def test_npr_parallel_rl_uses_batch_advantages_and_other_stages_the_flag():
    import train
    from nanopar.curriculum import recipe

    config = train.resolved_config(["--recipe", "npr", "--advantage", "mean"])[0]
    stages = {stage.name: stage for stage in recipe(config)}
    settings = {name: GRPOSettings.from_flags(config, stage) for name, stage in stages.items() if stage.kind == "grpo"}
    assert {name: (s.advantage, s.drop_invalid) for name, s in settings.items()} == {
        "format-rl": ("mean", False), "parallel-rl": ("batch", True)}


def test_policy_loss_equals_the_hand_written_formula():
    g = torch.Generator().manual_seed(0)
    new, old, ref = (torch.randn(3, 5, generator=g) * 0.3 - 1 for _ in range(3))
    adv = torch.tensor([1.5, -0.5, 0.0])
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float)
    total, clip, beta = 11.0, 0.2, 0.05
    expected = 0.0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                r = float(torch.exp(new[b, t] - old[b, t]))
                clipped = min(max(r, 1 - clip), 1 + clip)
                kl = float(torch.exp(ref[b, t] - new[b, t]) - (ref[b, t] - new[b, t]) - 1)
                expected += -min(r * adv[b].item(), clipped * adv[b].item()) + beta * kl
    got = policy_loss(new, old, adv, mask, total, clip, ref, beta)
    assert got.item() == pytest.approx(expected / total, rel=1e-5)
    # on-policy (old = new): the loss is -A log pi per token, its gradient the policy gradient
    x = new.clone().requires_grad_()
    policy_loss(x, x.detach(), adv, mask, total, clip).backward()
    assert torch.allclose(x.grad, -adv[:, None] * mask / total)


def structured_rollouts(model, seed=0, keep_bias=False):
    """Rollouts with forks: a bias on the tag logits (left on the model when `keep_bias`)."""
    handle = bias_logits(model, dict.fromkeys(TAGS.all(), 2.5))
    settings = SamplerSettings(max_new_tokens=30, max_path_tokens=6, seed=seed)
    rollouts = sample(model, [[1, 2, 3], [4, 5, 6, 7]], Policy(TAGS), settings, eos_ids=[7], samples_per_prompt=4)
    if not keep_bias:
        handle.remove()
    return rollouts


def test_inserted_tokens_and_prompts_get_no_gradient():
    model = tiny_qwen_model(vocab_size=V)
    rollouts = structured_rollouts(model)
    assert any(not all(r.sampled) for r in rollouts)  # the premise: some tokens were inserted
    batch = make_batch([r.prompt_ids for r in rollouts], [r.ids for r in rollouts],
                       [[float(s) for s in r.sampled] for r in rollouts], PAD)
    captured = {}  # the final hidden states (the final norm is per position: only its own head read reaches it)
    model.model.norm.register_forward_hook(lambda m, a, out: captured.setdefault("hidden", out).retain_grad())
    new, _ = trace_logprobs(model, batch, Policy(TAGS, "structured"))
    policy_loss(new, new.detach(), torch.ones(len(rollouts)), batch.target_mask, 1.0, 0.2).backward()
    grad = captured["hidden"].grad[:, :-1].abs().sum(-1)  # [B, T-1] gradient reaching each position
    assert (grad[batch.target_mask == 0] == 0).all()
    assert (grad[batch.target_mask == 1] > 0).all()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_one_grpo_step_raises_the_probability_of_the_rewarded_token(lora, tmp_path):
    model, tokenizer = load_char_model(tmp_path, lora=lora)
    tags = TagIds.from_tokenizer(tokenizer)
    prompt = tokenizer.encode("ab", add_special_tokens=False)
    good = tokenizer.convert_tokens_to_ids("x")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def p_good():
        with torch.no_grad():
            return torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1, : len(tokenizer)], -1)[good].item()

    start = p_good()
    policy = Policy(tags, "structured", 1.0, len(tokenizer))
    settings = SamplerSettings(max_new_tokens=4, seed=0)
    rollouts = sample(model, [prompt], policy, settings, [tokenizer.eos_token_id], samples_per_prompt=16)
    # reward: the first token is "x"; make sure both outcomes are in the group
    rollouts[0].ids[0], rollouts[0].logprobs[0] = good, 0.0
    rewards = torch.tensor([1.0 if r.ids[0] == good else -1.0 for r in rollouts])
    optimizer, _ = make_optimizer(model, lr=1e-2)
    metrics = grpo_update(model, optimizer, rollouts, group_advantages(rewards, 16), policy, GRPOSettings(),
                          tokenizer.pad_token_id)
    assert p_good() > start * 1.2 and metrics["grad_norm"] > 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    if lora:
        assert changed and all("lora_" in n or "trainable_tokens" in n for n in changed)
    else:
        assert "model.embed_tokens.weight" in changed


def test_grpo_update_reads_the_rollouts_as_the_sampler_did():
    model = tiny_qwen_model(vocab_size=V)
    rollouts = structured_rollouts(model, seed=1, keep_bias=True)  # the policy that sampled them
    assert sum(r.stats.forks for r in rollouts) >= 2
    optimizer, _ = make_optimizer(model, lr=0.0)
    metrics = grpo_update(model, optimizer, rollouts, torch.linspace(-1, 1, len(rollouts)), Policy(TAGS),
                          GRPOSettings(micro_batch=3), PAD)
    assert metrics["logprob_gap"] < 1e-5 and metrics["entropy"] > 0


def test_equal_rewards_give_exactly_zero_advantages():
    """A group whose kept rewards are all equal teaches nothing, in every advantage kind, whatever
    the rounding of its mean: 6 x 0.3 / 6 is not 0.3 in float32, and (r - mean) / (std + eps) made
    that rounding an advantage of ~0.03 for every member."""
    for value, size in ((0.3, 6), (0.1, 7), (0.2, 7), (1 / 3, 5)):
        group = torch.full((size,), value)
        assert group.sum() / size != value or value == 1 / 3  # the premise: the mean is off by its rounding
        other = torch.linspace(-1, 1, size)  # a group with signal beside it
        for kind in ("zscore", "mean", "batch"):
            got = group_advantages(torch.cat([group, other]), size, kind)
            assert got[:size].eq(0).all() and got[size:].ne(0).sum() >= size - 1, (value, size, kind)
    kept = torch.tensor([True] * 6 + [False])  # the dropped member differs: the six kept are equal
    rewards = torch.tensor([0.3] * 6 + [1.0])
    assert group_advantages(rewards, 7, "zscore", kept).eq(0).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rows_with_advantage_zero_are_not_read_and_the_gradient_is_the_one_of_every_row(monkeypatch, agg):
    """Without a KL term a row whose advantage is 0 adds exactly 0 to the gradient, so the update
    does not read it; the loss still divides by the tokens (or responses) of every row, so the
    gradient equals the two-read step over all of them, and the entropy is the mean over the rows
    read. Off-policy (updates = 2) pi_old is read for those rows only. With a KL term every row is
    read (the KL pulls on each)."""
    import nanopar.grpo
    from nanopar.grpo import rollout_batch

    model = tiny_qwen_model(vocab_size=V)
    rollouts = structured_rollouts(model, seed=1, keep_bias=True)
    advantages = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.2, -0.4, -0.4, -0.4])  # the first group all equal
    settings = GRPOSettings(micro_batch=2, loss_agg=agg)
    want_loss, want_grads = two_read_update(copy.deepcopy(model), rollouts, advantages, Policy(TAGS), settings)
    batch = rollout_batch(rollouts[4:], PAD)  # the rows with signal: their entropy, read by hand
    with torch.no_grad():
        _, entropy = trace_logprobs(copy.deepcopy(model).train(), batch, Policy(TAGS), with_entropy=True)
    want_entropy = ((entropy * batch.target_mask).sum() / batch.target_mask.sum()).item()
    grads = {}
    monkeypatch.setattr(nanopar.grpo, "apply_gradients", lambda model, *_: grads.update(
        {n: p.grad.clone() for n, p in model.named_parameters()}) or (0.0, False))
    rows = []
    model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: rows.append((kwargs.get("input_ids") if kwargs.get("input_ids") is not None
                                                  else kwargs["inputs_embeds"]).shape[0]), with_kwargs=True)
    metrics = grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS), settings, PAD)
    assert sum(rows) == 4 and metrics["read_rows"] == 0.5 and metrics["logprob_gap"] < 1e-5
    assert metrics["entropy"] == pytest.approx(want_entropy, rel=1e-5)
    assert metrics["loss"] == pytest.approx(want_loss, rel=1e-6)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-9)
    rows.clear()
    grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS),
                GRPOSettings(micro_batch=2, loss_agg=agg, updates=2), PAD)
    assert sum(rows) == 3 * 4  # pi_old, then two updates, of the four rows with signal
    rows.clear()
    grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS),
                GRPOSettings(micro_batch=2, kl_beta=0.1), PAD, Reference(model))
    assert sum(rows) == 2 * len(rollouts)  # the reference's read and the training read, of every row


def test_reference_is_the_policy_at_its_creation():
    model = tiny_qwen_model(vocab_size=V)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        original = model(input_ids=ids).logits
    reference = Reference(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
        moved = model(input_ids=ids).logits
        with reference.active():
            assert torch.equal(model(input_ids=ids).logits, original)
        assert torch.equal(model(input_ids=ids).logits, moved)


def test_sft_loss_is_the_mean_cross_entropy_of_response_tokens():
    model = tiny_qwen_model(vocab_size=V)
    prompts = [[1, 2, 3], [4, 5]]
    responses = [[9, 10, 11, 12], [13, 14]]
    optimizer, _ = make_optimizer(model, lr=0.0)
    metrics = sft_step(model, optimizer, prompts, responses, Policy(TAGS, "causal"), PAD, micro_batch=1)
    losses = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            ids = torch.tensor(prompt + response)
            logits = model(input_ids=ids[None]).logits[0]
            losses += F.cross_entropy(logits[len(prompt) - 1 : -1], ids[len(prompt) :], reduction="none").tolist()
    assert metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5) and metrics["tokens"] == 6
    # the held-out read of the same traces: minus that mean, with no step (lr 0 left the model as it was)
    model.train()
    read = response_loglikelihood(model, prompts, responses, Policy(TAGS, "causal"), PAD, micro_batch=1)
    assert read == pytest.approx(-sum(losses) / len(losses), rel=1e-5) and model.training


def test_grpo_step_is_sample_score_drop_advantages_update(monkeypatch):
    """`grpo_step` against the same step written out by hand on a twin model, on scripted responses:
    the rollouts the layout cannot lay out dropped (PAPO: stray or nested tags, a block of one path,
    cut inside a block; a well-formed sequential answer stays, as in NPR's released code), *then*
    the advantages of the kept ones (not every rollout normalised and the invalid ones dropped
    after), the same parameters after the update."""
    import copy

    import nanopar.grpo
    from conftest import text_rollout
    from nanopar.grpo import grpo_step
    from nanopar.model import ModelSettings, load_model
    from nanopar.prompts import build_prompt, stop_ids
    from nanopar.toy import toy_problems

    model, tokenizer = load_model(ModelSettings("toy:model"))
    policy = Policy.for_tokenizer(tokenizer)
    twin = copy.deepcopy(model)
    problems = toy_problems("toy:easy")[:3]
    prompts = [build_prompt(p, tokenizer, "") for p in problems]
    eos = stop_ids(model, tokenizer)
    block = "<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>"
    right = [f"Final Answer: {p.answer}" for p in problems]
    responses = [  # reward = format (Algorithm 1: +1 / -1) + 0.5 * accuracy (+1 / -1); kept? valid parallel?
        block + right[0], block + "Final Answer: 0", right[0], block + "<Path>z</Path>" + right[0],
        #  1.5 kept, yes    0.5 kept, yes              1.5 kept, no (sequential)  1.5 dropped (a stray <Path>)
        block + right[1], block + right[1], block.replace("x", "<Path>x</Path>") + right[1],
        #  1.5 kept, yes    1.5 kept, yes    1.5 dropped (a nested <Path>)
        block.replace("<Path>y</Path>", "") + right[1],
        # -0.5 dropped (one path)
        "<Parallel><Path>x", block + "Final Answer: 0", block + right[2], block + right[2],
        # -1.5 dropped (truncated)  0.5 kept, yes       1.5 kept, yes      1.5 kept, yes
    ]
    scripted = [text_rollout(prompts[i // 4], tokenizer.encode(r, add_special_tokens=False) + [eos[0]],
                             policy.tag_ids) for i, r in enumerate(responses)]
    monkeypatch.setattr(nanopar.grpo, "sample", lambda model, prompts, policy, sampling, eos, G: scripted)
    settings = GRPOSettings(group_size=4, drop_invalid=True, micro_batch=5)
    optimizer = make_optimizer(model, lr=1e-3)[0]
    rollouts, metrics = grpo_step(model, tokenizer, optimizer, problems, prompts, policy, SamplerSettings(),
                                  settings, {"format": 1.0, "accuracy": 0.5})
    assert rollouts is scripted and metrics["dropped_invalid"] == 4
    assert metrics["reward"] == pytest.approx((1.5 + 0.5 + 1.5 + 1.5 + 1.5 * 3 - 0.5 - 1.5 + 0.5 + 1.5 * 2) / 12)
    assert metrics["parallel_ratio"] == 7 / 12  # the valid parallel ones: the sequential answer is kept, not parallel
    # kept rewards per group: [1.5, 0.5, 1.5] and [0.5, 1.5, 1.5]: mean 7/6, centred 1/3 for each 1.5
    # and -2/3 for the 0.5, std sqrt((1/9 + 4/9 + 1/9) / 3) = sqrt(2/9) -> 0.7071 and -1.4142; [1.5, 1.5] -> 0
    rewards = torch.tensor([1.5, 0.5, 1.5, 1.5, 1.5, 1.5, 1.5, -0.5, -1.5, 0.5, 1.5, 1.5])
    kept = torch.tensor([True, True, True, False, True, True, False, False, False, True, True, True])
    keep = kept.nonzero().flatten().tolist()
    advantages = group_advantages(rewards, 4, "zscore", kept)[keep]
    up, down = (1 / 3) / (2 / 9) ** 0.5, -(2 / 3) / (2 / 9) ** 0.5
    assert advantages.tolist() == pytest.approx([up, down, up, 0.0, 0.0, down, up, up], abs=1e-5)
    by_hand = grpo_update(twin, make_optimizer(twin, lr=1e-3)[0], [scripted[i] for i in keep], advantages,
                          policy, settings, tokenizer.pad_token_id)
    assert metrics["loss"] == by_hand["loss"] and metrics["grad_norm"] > 0
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def two_read_update(model, rollouts, advantages, policy, settings):
    """An on-policy step written the long way, as an independent reference: a no-grad pi_old
    read of every micro-batch, then the training read. -> (loss, {name: gradient})"""
    from nanopar.grpo import rollout_batch

    batch = rollout_batch(rollouts, PAD)
    total = batch.target_mask.sum() if settings.loss_agg == "token-mean" else torch.tensor(float(len(rollouts)))
    groups = [list(range(i, min(i + settings.micro_batch, len(batch)))) for i in range(0, len(batch), settings.micro_batch)]
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        old = [trace_logprobs(model, batch.rows(g), policy)[0] for g in groups]
    loss_sum = 0.0
    for g, before in zip(groups, old):
        micro = batch.rows(g)
        new, _ = trace_logprobs(model, micro, policy, with_entropy=True)
        loss = policy_loss(new, before, advantages[g], micro.target_mask, total, settings.clip, agg=settings.loss_agg)
        loss.backward()
        loss_sum += loss.item()
    return loss_sum, {n: p.grad.clone() for n, p in model.named_parameters()}


def count_forwards(model) -> list:
    """A list that grows by one at each forward of the model's decoder (its layers, norm: the
    whole model but the LM head), however it is called."""
    calls = []
    model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_an_on_policy_update_reads_each_micro_batch_once(monkeypatch):
    """updates = 1: pi_old is the training read detached (ratio exactly 1), not a second forward:
    one decoder pass per micro-batch instead of two, the same loss and gradients as the two-read
    step, and the sampler-trainer gap still measured. updates = 2: pi_old read once, then one
    read per update."""
    import nanopar.grpo

    model = tiny_qwen_model(vocab_size=V)
    rollouts = structured_rollouts(model, seed=1, keep_bias=True)  # the policy that sampled them
    advantages = torch.linspace(-1, 1, len(rollouts))
    settings = GRPOSettings(micro_batch=3)
    micro_batches = -(-len(rollouts) // 3)
    twin = copy.deepcopy(model)
    want_loss, want_grads = two_read_update(twin, rollouts, advantages, Policy(TAGS), settings)
    grads = {}
    monkeypatch.setattr(nanopar.grpo, "apply_gradients", lambda model, *_: grads.update(
        {n: p.grad.clone() for n, p in model.named_parameters()}) or (0.0, False))
    calls = count_forwards(model)
    metrics = grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS), settings, PAD)
    assert len(calls) == micro_batches and micro_batches >= 3
    assert metrics["loss"] == pytest.approx(want_loss, rel=1e-6) and metrics["logprob_gap"] < 1e-5
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-9)
    calls.clear()
    grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS), GRPOSettings(micro_batch=3, updates=2), PAD)
    assert len(calls) == 3 * micro_batches


def test_micro_batches_by_a_token_budget_give_the_gradient_of_one_big_batch(monkeypatch):
    """--micro-batch-tokens: rows sorted by length and packed under the budget; the loss is still
    divided by the tokens of the whole batch (GRPO) / of every response (SFT), so the gradient is
    the one of a single batch of every row."""
    import nanopar.grpo
    import nanopar.sft
    from nanopar.forward import micro_batches

    model = tiny_qwen_model(vocab_size=V)
    rollouts = structured_rollouts(model, seed=2, keep_bias=True)
    lengths = [len(r.prompt_ids) + len(r.ids) for r in rollouts]
    budget = 2 * max(lengths) + 1
    groups = micro_batches(lengths, 1, budget)
    assert 1 < len(groups) < len(rollouts) and sorted(sum(groups, [])) == list(range(len(rollouts)))
    assert all(len(g) * max(lengths[i] for i in g) <= budget for g in groups)
    assert micro_batches([3, 50, 4], 1, 10) == [[0, 2], [1]]  # a row longer than the budget goes alone
    with pytest.raises(NanoparError, match="a micro-batch needs rows >= 1"):
        micro_batches(lengths, 0)
    grads = []

    def record(model, *_):  # apply_gradients: the gradients kept, cleared
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
        return 0.0, False

    monkeypatch.setattr(nanopar.grpo, "apply_gradients", record)
    monkeypatch.setattr(nanopar.sft, "apply_gradients", record)
    advantages = torch.linspace(-1, 1, len(rollouts))
    calls = count_forwards(model)
    for settings in (GRPOSettings(micro_batch=len(rollouts)), GRPOSettings(micro_batch_tokens=budget)):
        grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS), settings, PAD)
    prompts, responses = [r.prompt_ids for r in rollouts], [r.ids for r in rollouts]
    for rows, tokens in ((len(rollouts), 0), (1, budget)):
        sft_step(model, make_optimizer(model, lr=0.0)[0], prompts, responses, Policy(TAGS), PAD, micro_batch=rows, micro_batch_tokens=tokens)
    assert len(calls) == 2 * (1 + len(groups))
    for one, packed in (grads[:2], grads[2:]):
        for name, grad in one.items():
            torch.testing.assert_close(packed[name], grad, rtol=1e-5, atol=1e-8)


def test_a_runs_grpo_settings_are_its_flags_and_its_stage_never_grpo_settings_own_defaults():
    """Every GRPOSettings field is a train.py flag or a field a stage sets, so a run takes none of
    GRPOSettings' own defaults (which serve direct callers): the toy's 16 responses a prompt and 16
    rows a micro-batch, not GRPOSettings' 8 and 8."""
    import dataclasses

    import train
    from nanopar.curriculum import Stage, TrainConfig, recipe

    fields = set(GRPOSettings.__dataclass_fields__)
    assert fields <= {f.name for f in dataclasses.fields(TrainConfig)} | {f.name for f in dataclasses.fields(Stage)}
    config = train.resolved_config(["--updates", "2", "--clip", "0.3", "--kl-beta", "0.1", "--max-grad-norm", "0.5",
                                    "--head-read", "plain", "--clip-high", "0.28", "--loss-agg", "seq-mean-token-mean",
                                    "--unbiased-std", "--filter-groups", "--max-draws", "3"])[0]
    rl_easy = next(s for s in recipe(config) if s.name == "rl-easy")
    settings = GRPOSettings.from_flags(config, dataclasses.replace(rl_easy, advantage="batch"))
    assert dataclasses.asdict(settings) == {
        "group_size": 16, "drop_invalid": False, "advantage": "batch", "unbiased_std": True, "updates": 2, "clip": 0.3, "clip_high": 0.28,
        "loss_agg": "seq-mean-token-mean", "kl_beta": 0.1, "micro_batch": 16, "micro_batch_tokens": 0,
        "max_grad_norm": 0.5, "head_read": "plain", "filter_groups": True, "max_draws": 3}
    # drop_invalid from the stage too (PAPO: with one update a batch, tests below)
    papo = dataclasses.replace(rl_easy, drop_invalid=True)
    assert GRPOSettings.from_flags(dataclasses.replace(config, updates=1), papo).drop_invalid
    assert (GRPOSettings().group_size, GRPOSettings().micro_batch) == (8, 8)


def test_micro_batch_tokens_is_a_flag_that_reaches_grpo_and_sft():
    import train
    from nanopar.curriculum import recipe

    config = train.resolved_config(["--micro-batch-tokens", "4096"])[0]
    stages = recipe(config)
    settings = GRPOSettings.from_flags(config, next(s for s in stages if s.kind == "grpo"))
    assert settings.micro_batch_tokens == 4096 == config.micro_batch_tokens


def test_a_step_with_nothing_to_learn_is_skipped(monkeypatch):
    """Every group's rewards equal (all advantages 0) and no KL term: grpo_step runs no training
    forward or backward, the weights stay bit-identical, and the step says it was skipped."""
    import copy

    import nanopar.grpo
    from conftest import text_rollout
    from nanopar.grpo import grpo_step
    from nanopar.model import ModelSettings, load_model
    from nanopar.prompts import build_prompt, stop_ids
    from nanopar.toy import toy_problems

    model, tokenizer = load_model(ModelSettings("toy:model"))
    policy, before = Policy.for_tokenizer(tokenizer), copy.deepcopy(model)
    problems = toy_problems("toy:easy")[:2]
    prompts = [build_prompt(p, tokenizer, "") for p in problems]
    eos = stop_ids(model, tokenizer)
    scripted = [text_rollout(prompts[i // 2], tokenizer.encode("Final Answer: 0") + [eos[0]], policy.tag_ids)
                for i in range(4)]  # every answer wrong: accuracy -1 everywhere
    monkeypatch.setattr(nanopar.grpo, "sample", lambda *args: scripted)
    forwards = []
    model.get_decoder().register_forward_hook(lambda *args: forwards.append(1))
    optimizer, scheduler = make_optimizer(model, lr=1e-3, warmup_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the schedule moves on before any optimiser step, on purpose: no warning
        _, metrics = grpo_step(model, tokenizer, optimizer, problems, prompts, policy, SamplerSettings(),
                               GRPOSettings(group_size=2), "accuracy", scheduler=scheduler)
    assert metrics["skipped_no_signal"] and "loss" not in metrics and not forwards
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 4)  # kept its place
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before.parameters()))
    scripted[0] = text_rollout(prompts[0], tokenizer.encode(f"Final Answer: {problems[0].answer}") + [eos[0]],
                               policy.tag_ids)  # one right answer: a signal, so a real step
    _, metrics = grpo_step(model, tokenizer, optimizer, problems, prompts, policy, SamplerSettings(),
                           GRPOSettings(group_size=2), "accuracy")
    assert not metrics["skipped_no_signal"] and metrics["loss"] is not None and forwards


def varied_rollouts():
    """Three rollouts of 2, 5 and 9 response tokens, the 5-token one with 2 inserted (not sampled):
    3 sampled tokens, so sampled lengths 2, 3 and 9."""
    from conftest import text_rollout

    rollouts = [text_rollout([1, 2, 3], list(range(10, 10 + n)), TAGS) for n in (2, 5, 9)]
    rollouts[1].sampled[1] = rollouts[1].sampled[3] = False
    return rollouts


@pytest.mark.parametrize("micro_batch", [1, 3])
def test_the_loss_is_a_token_mean_or_a_mean_of_response_means(micro_batch, monkeypatch):
    """On-policy every sampled token's loss is -A of its response (ratio 1). "token-mean" (nanopar's
    default) divides the sum by the batch's 2 + 3 + 9 = 14 sampled tokens, so a long response
    weighs more; "seq-mean-token-mean" (verl's name; NPR's released run) averages each response's
    tokens first, then the 3 responses, so each weighs 1/3 whatever its length; whatever the
    micro-batches."""
    import nanopar.grpo

    monkeypatch.setattr(nanopar.grpo, "apply_gradients", lambda *_: (0.0, False))
    model, rollouts = tiny_qwen_model(vocab_size=V), varied_rollouts()
    advantages = torch.tensor([1.5, -0.5, 0.25])
    token = -(1.5 * 2 - 0.5 * 3 + 0.25 * 9) / 14
    sequence = -(1.5 - 0.5 + 0.25) / 3
    for agg, want in (("token-mean", token), ("seq-mean-token-mean", sequence)):
        settings = GRPOSettings(micro_batch=micro_batch, loss_agg=agg)
        metrics = grpo_update(model, make_optimizer(model, lr=0.0)[0], rollouts, advantages, Policy(TAGS), settings, PAD)
        assert metrics["loss"] == pytest.approx(want, rel=1e-6), agg
    for wrong in (lambda: GRPOSettings(loss_agg="seq-mean"), lambda: policy_loss(*[torch.zeros(1, 1)] * 2, advantages[:1],
                                                                                torch.ones(1, 1), 1.0, 0.2, agg="seq-mean")):
        with pytest.raises(NanoparError, match="unknown loss aggregation 'seq-mean'"):
            wrong()


def test_policy_loss_of_responses_of_different_lengths_in_each_aggregation():
    """Off-policy ratios, clipped at 0.2, on a hand-built batch of 1, 3 and 2 tokens."""
    g = torch.Generator().manual_seed(1)
    new, old = (torch.randn(3, 4, generator=g) * 0.4 - 1 for _ in range(2))
    adv = torch.tensor([2.0, -1.0, 0.5])
    mask = torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.float)
    per_row = [[], [], []]
    for b in range(3):
        for t in range(4):
            if mask[b, t]:
                r = float(torch.exp(new[b, t] - old[b, t]))
                per_row[b].append(-min(r * adv[b].item(), min(max(r, 0.8), 1.2) * adv[b].item()))
    token = sum(sum(row) for row in per_row) / 6
    sequence = sum(sum(row) / len(row) for row in per_row) / 3
    assert policy_loss(new, old, adv, mask, 6.0, 0.2).item() == pytest.approx(token, rel=1e-5)
    assert policy_loss(new, old, adv, mask, 3.0, 0.2, agg="seq-mean-token-mean").item() == pytest.approx(sequence, rel=1e-5)


def test_an_upper_clip_apart_from_the_lower_one():
    """clip 0.2 below, 0.28 above (Parallel-R1's stage 2, DAPO's clip-higher): a positive advantage's
    ratio is held under 1.28 (not 1.2), a negative one's above 0.8; each token's loss by hand."""
    ratios = torch.tensor([[1.5, 1.25, 0.5, 0.75, 1.5]])
    adv_of_token = [2.0, 1.0, -1.0, -1.0, -1.0]
    # A = 2, r = 1.5: -min(3, 1.28 * 2) = -2.56    A = 1, r = 1.25: under 1.28, unclipped: -1.25
    # A = -1, r = 0.5: -min(-0.5, -0.8) = 0.8       A = -1, r = 0.75: clipped at 0.8: 0.8
    # A = -1, r = 1.5: -min(-1.5, -1.28) = 1.5 (the clip never lowers a negative advantage's loss)
    want = [-2.56, -1.25, 0.8, 0.8, 1.5]
    for t, (a, w) in enumerate(zip(adv_of_token, want)):
        new, old = ratios[:, t:t + 1].log(), torch.zeros(1, 1)
        got = policy_loss(new, old, torch.tensor([a]), torch.ones(1, 1), 1.0, 0.2, clip_high=0.28)
        assert got.item() == pytest.approx(w, rel=1e-6), (t, a)
    # the default: the upper clip is the lower one (1.25 with A = 1 clipped at 1.2)
    assert policy_loss(ratios[:, 1:2].log(), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 1.0,
                       0.2).item() == pytest.approx(-1.2, rel=1e-6)
    assert GRPOSettings().clip_high is None and GRPOSettings(clip=0.3).upper_clip == 0.3


def test_a_papo_group_with_one_survivor_is_measured_against_zero():
    """NPR's released PAPO (npr-rl/verl/trainer/ppo/core_algos.py, compute_grpo_outcome_advantage):
    a group left with one response has mean 0, so its advantage is r / (batch std). Groups of 2:
    [1, -1] whole, [-1, dropped], [1, dropped]; the kept batch [1, -1, -1, 1] has mean 0 and
    population std 1."""
    rewards = torch.tensor([1.0, -1.0, -1.0, 5.0, 1.0, 5.0])
    kept = torch.tensor([True, True, True, False, True, False])
    got = group_advantages(rewards, 2, "batch", kept)
    assert got.tolist() == pytest.approx([1.0, -1.0, -1.0, 0.0, 1.0, 0.0], abs=1e-5)
    # the kept batch [1, -1, 1]: mean 1/3, std sqrt((4/9 + 16/9 + 4/9) / 3) = sqrt(8/9)
    kept = torch.tensor([True, True, False, False, True, False])
    std = (8 / 9) ** 0.5
    assert group_advantages(rewards, 2, "batch", kept).tolist() == pytest.approx(
        [1 / std, -1 / std, 0.0, 0.0, 1 / std, 0.0], abs=1e-5)
    # every kept reward equal (the toy's PAPO stage: -1 everywhere): std 0, and r / (0 + eps) would
    # be -1e6 (NPR's code); nanopar's lone member gets 0, as every other member of such a batch
    same = torch.tensor([-1.0, -1.0, -1.0, 5.0])
    assert group_advantages(same, 2, "batch", torch.tensor([True, True, True, False])).tolist() == [0.0] * 4


def test_papo_is_on_policy_so_more_than_one_update_is_refused(tmp_path):
    """PAPO (NPR's parallel-rl: drop_invalid) takes one update per batch, ratio 1 and no clip;
    --updates 2 would bring a clipped ratio back. Refused in one line, by a run before any model
    loads, other stages left free."""
    import train
    from nanopar.runner import open_run

    with pytest.raises(NanoparError, match=r"^PAPO .*on-policy.*--updates 1, not 2") as refused:
        GRPOSettings(drop_invalid=True, updates=2)
    assert "\n" not in str(refused.value)
    assert GRPOSettings(updates=2).updates == 2  # a stage that drops nothing may go off-policy
    with pytest.raises(NanoparError, match=r"^a step makes at least one update: --updates 0 is below 1$"):
        GRPOSettings(updates=0)  # no update would leave the step without a loss or a gradient norm to log
    config = train.resolved_config(["--recipe", "npr", "--updates", "2", "--out", str(tmp_path / "run")])[0]
    with pytest.raises(NanoparError, match=r"parallel-rl: PAPO .*--updates 1, not 2"):
        open_run(config)
    assert [p.name for p in (tmp_path / "run").iterdir()] == []  # no stage begun, nothing logged


def test_the_unbiased_std_is_the_released_codes_torch_std():
    """--unbiased-std: both released codes normalise by torch.std (n - 1); by hand, group by group,
    with a dropped member (PAPO) and PAPO's batch std."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 1.0, 1.0, -1.0, 0.5])
    kept = torch.tensor([True, True, True, True, True, False, True, True])
    expected = []
    for group, keep in zip(rewards.view(2, 4), kept.view(2, 4)):
        members = group[keep]
        expected += [float((r - members.mean()) / (members.std() + 1e-6)) if k else 0.0 for r, k in zip(group, keep)]
    assert group_advantages(rewards, 4, "zscore", kept, unbiased=True).tolist() == pytest.approx(expected, abs=1e-6)
    population = group_advantages(rewards, 4, "zscore", None)
    assert (group_advantages(rewards, 4, "zscore", None, unbiased=True) * (4 / 3) ** 0.5).tolist() == \
        pytest.approx(population.tolist(), abs=1e-5)  # whole groups: the same advantages scaled alike
    batch = group_advantages(rewards, 4, "batch", kept, unbiased=True)
    centred = [float(r - rewards[:4][kept[:4]].mean()) for r in rewards[:4]]
    assert batch[:4].tolist() == pytest.approx([c / (float(rewards[kept].std()) + 1e-6) for c in centred], abs=1e-6)
