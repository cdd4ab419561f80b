"""The policy's distribution and the draws (policy.py) against direct computations."""

import math

import pytest
import torch

from conftest import TAGS, one_line, token_logprobs
from nanopar import NanoparError
from nanopar.policy import Policy, draw, policy_logprobs


def test_logprobs_are_a_temperature_softmax_over_the_real_vocabulary():
    logits = torch.tensor([[2.0, 1.0, 0.0, 9.0]])  # the last id is padding: never part of the policy
    got = policy_logprobs(logits, 0.5, vocab_size=3)
    z = [math.exp(4.0), math.exp(2.0), math.exp(0.0)]
    assert torch.allclose(got, torch.tensor([[math.log(v / sum(z)) for v in z]]))
    assert torch.allclose(token_logprobs(logits, torch.tensor([1]), 0.5, 3), got[:, 1])


def test_greedy_draw_takes_the_best_allowed_token_and_records_its_temperature_one_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0, 50.0], [5.0, 1.0, 2.0, 0.0]])
    banned = torch.zeros(2, 4, dtype=torch.bool)
    banned[1, 0] = True
    tokens, logprobs = draw(logits, 0.0, vocab_size=3, banned=banned)
    assert tokens.tolist() == [1, 2]  # id 3 is padding; row 1 may not draw id 0
    assert torch.allclose(logprobs, torch.log_softmax(logits[:, :3], -1)[[0, 1], [1, 2]])


def test_top_k_top_p_and_bans_restrict_the_draws_but_not_the_recorded_logprob():
    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).expand(4000, 4)
    tokens, logprobs = draw(logits, 1.0, None, top_k=2, generator=g)
    assert set(tokens.tolist()) == {0, 1} and abs((tokens == 0).float().mean() - 0.4 / 0.7) < 0.03
    assert torch.allclose(logprobs, torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))[tokens])
    tokens, _ = draw(logits, 1.0, None, top_p=0.75, generator=g)  # 0.4 + 0.3 < 0.75: three tokens stay
    assert set(tokens.tolist()) == {0, 1, 2}
    banned = torch.zeros(4000, 4, dtype=torch.bool)
    banned[:, 0] = True
    tokens, _ = draw(logits, 1.0, None, banned=banned, generator=g)
    assert 0 not in tokens.tolist() and abs((tokens == 1).float().mean() - 0.5) < 0.03
    hot, _ = draw(logits, 0.01, None, generator=g)  # a low temperature is almost greedy
    assert (hot == 0).all()


def test_inverse_cdf_draws_follow_the_distribution_and_skip_zero_probabilities():
    from nanopar.policy import sample_categorical

    g = torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).expand(20000, 6)
    tokens = sample_categorical(probs, g)
    counts = torch.bincount(tokens, minlength=6).float() / len(tokens)
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_path_stride_is_part_of_the_policy_and_must_not_be_negative(qwen_tokenizer):
    assert Policy(TAGS).path_stride == 0  # by default paths share positions (Multiverse's, NPR's, Parallel-R1's released code)
    assert Policy.for_tokenizer(qwen_tokenizer, "structured", 1.0, 258).path_stride == 258
    with pytest.raises(NanoparError) as error:
        Policy(TAGS, path_stride=-1)
    assert one_line(error) == "path_stride must be >= 0, not -1"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
def test_policy_scores_are_the_plain_division_bit_for_bit_with_its_gradient(dtype, temperature):
    """The in-place division of a fresh float32 copy gives `logits.float() / T` exactly, value and
    gradient, and never writes into the caller's logits."""
    from nanopar.policy import policy_scores

    logits = torch.randn(3, 5, 40).to(dtype).requires_grad_(True)
    before = logits.detach().clone()
    ours = policy_scores(logits, temperature, 37)
    plain = logits[..., :37].float() / (temperature if temperature not in (0.0, 1.0) else 1.0)
    assert ours.dtype == torch.float32 and torch.equal(ours, plain) and torch.equal(logits.detach(), before)
    weights = torch.randn(3, 5, 37)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    (g_plain,) = torch.autograd.grad((plain * weights).sum(), logits)
    assert torch.equal(g_ours, g_plain)
