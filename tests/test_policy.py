"""The policy's distribution and the draws (policy.py) against direct computations."""

import math

import pytest
import torch

from conftest import TAGS, one_line, token_logprobs
from nanopar import NanoparError
from nanopar.draw_in_place import draw
from nanopar.policy import Policy, policy_logprobs


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


def test_two_level_inverse_cdf_follows_the_distribution_and_skips_zero_probabilities():
    """A row of 20 blocks of 1,024 ids and a short last one (20,500 ids): mass in four blocks, on a
    block's first id and on the id before the next block, whole blocks of zero between; 40,000
    two-level draws land on the positive ids only, at their probabilities."""
    from nanopar.draw_in_place import CDF_BLOCK, TWO_LEVELS_FROM_BLOCKS, sample_in_blocks

    V = 20 * CDF_BLOCK + 20
    assert V >= TWO_LEVELS_FROM_BLOCKS * CDF_BLOCK  # the two-level path
    support = torch.tensor([3 * CDF_BLOCK, 4 * CDF_BLOCK - 1, 4 * CDF_BLOCK, 11 * CDF_BLOCK + 7, V - 1])
    mass = torch.tensor([0.3, 0.1, 0.25, 0.15, 0.2])
    weights = (7.0 * torch.zeros(V).index_put_((support,), mass)).expand(40000, V)  # not normalised
    tokens = sample_in_blocks(weights, torch.Generator().manual_seed(2))
    assert set(tokens.tolist()) <= set(support.tolist())
    counts = torch.stack([(tokens == i).double().mean() for i in support])
    assert ((counts - mass).abs() <= 4 * (mass * (1 - mass) / len(tokens)).sqrt()).all(), counts


def test_two_level_inverse_cdf_draws_what_one_cumulative_sum_draws():
    """The same random numbers give the same ids through two levels as through one cumulative sum
    of the whole row, on 512 rows of a real vocabulary's softmax (8,990 ids: 9 blocks, a short last)."""
    from nanopar.draw_in_place import sample_in_blocks
    from nanopar.policy import sample_categorical

    probs = torch.softmax(real_vocab_logits(512, torch.float32)[:, :8990] / 0.7, -1)
    one = sample_categorical(probs, torch.Generator().manual_seed(4))
    two = sample_in_blocks(probs, torch.Generator().manual_seed(4))
    assert torch.equal(one, two) and (two >= 1024).sum() >= 20  # ids past the first block too


def test_two_level_inverse_cdf_edge_rows():
    """No rows draw nothing; a row with no mass left (its one likely id banned, the rest underflowed)
    draws its last id, as one cumulative sum does, never an id past the vocabulary."""
    from nanopar.draw_in_place import sample_in_blocks
    from nanopar.policy import sample_categorical

    assert sample_in_blocks(torch.zeros(0, 8990)).shape == (0,) and sample_categorical(torch.zeros(0, 8990)).shape == (0,)
    empty = torch.zeros(2, 8212)  # a short last block of 20 ids
    for sample in (sample_categorical, sample_in_blocks):
        assert sample(empty, torch.Generator().manual_seed(0)).tolist() == [8211, 8211]


def test_the_inverse_cdf_holds_a_rounded_target_inside_the_positive_ids():
    """A target rounded onto the total, or below 0, still finds an id of positive probability."""
    from nanopar.policy import first_above

    cdf = torch.tensor([[0.0, 0.5, 0.5, 1.0, 1.0]]).repeat(3, 1)  # ids 1 and 3 hold the mass
    found = first_above(cdf, torch.tensor([[1.0], [-1e-9], [0.5]]))
    assert found.tolist() == [3, 1, 3]


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


def real_vocab_logits(rows, dtype, seed=0):
    """[rows, 9,000] logits (a vocabulary past DRAW_IN_PLACE_FROM_VOCAB) with a few likely ids per row."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, 9000, generator=g)
    logits[:, :4] += 12  # most of the mass on ids 0-3, the rest spread thin
    return logits.to(dtype)


@pytest.mark.parametrize("dtype, temperature", [(torch.bfloat16, 0.7), (torch.float32, 1.0), (torch.float32, 0.6)])
def test_the_in_place_draw_is_the_plain_draw_at_a_real_vocabulary(dtype, temperature):
    """From DRAW_IN_PLACE_FROM_VOCAB rows `draw` draws in place: the tokens the plain draw takes
    with the same random numbers (the same inverse CDF, up to rounding), never a banned id, and
    log-probs nearer a float64 log-softmax than the plain draw's; the logits are left as they were."""
    from nanopar.draw_in_place import DRAW_IN_PLACE_FROM_VOCAB
    from nanopar.policy import plain_draw

    logits = real_vocab_logits(256, dtype)
    assert logits.shape[-1] > 8990 >= DRAW_IN_PLACE_FROM_VOCAB  # the vocabulary: 8,990 real ids
    before = logits.clone()
    banned = torch.zeros(logits.shape, dtype=torch.bool)
    banned[::2, 0] = True  # every other row may not draw its likeliest id
    tokens, logprobs = draw(logits, temperature, 8990, banned=banned, generator=torch.Generator().manual_seed(3))
    plain_tokens, plain_logprobs = plain_draw(logits, temperature, 8990, banned=banned,
                                              generator=torch.Generator().manual_seed(3))
    assert torch.equal(logits, before)
    assert torch.equal(tokens, plain_tokens) and not (tokens[::2] == 0).any() and (tokens < 8990).all()
    exact = torch.log_softmax(logits[:, :8990].double() / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert (logprobs.double() - exact).abs().max() <= 1e-5
    assert (logprobs.double() - exact).abs().max() <= (plain_logprobs.double() - exact).abs().max() + 1e-7


@pytest.mark.parametrize("dtype, temperature", [(torch.bfloat16, 0.7), (torch.float32, 1.0), (torch.float32, 0.6)])
def test_the_in_place_draw_into_a_kept_buffer_is_the_draw_into_a_new_one(dtype, temperature):
    """A sampler hands each step's draw the rows it needs of one float32 buffer: the same tokens and
    log-probs, bit for bit, as a new tensor, whatever the buffer held before (here: another step's
    scores, and NaNs), in bf16 and float32, at T = 1 (where the scores are a view of the logits)."""
    logits = real_vocab_logits(40, dtype)
    kept = torch.full((64, 8990), float("nan"))
    for step, rows in enumerate((40, 17)):
        fresh = draw(logits[:rows], temperature, 8990, generator=torch.Generator().manual_seed(step))
        into = draw(logits[:rows], temperature, 8990, generator=torch.Generator().manual_seed(step), out=kept[:rows])
        assert all(torch.equal(a, b) for a, b in zip(fresh, into)), (step, rows)
        assert not kept[:rows].isnan().any()  # the draw wrote there


def test_the_in_place_draw_follows_the_distribution():
    """Frequencies of 8,000 in-place draws against the policy's probabilities of ids 0-3."""
    logits = real_vocab_logits(1, torch.float32, seed=1).expand(8000, -1)
    probs = torch.softmax(logits[0].double() / 0.8, -1)[:4]
    tokens, _ = draw(logits, 0.8, None, generator=torch.Generator().manual_seed(5))
    counts = torch.bincount(tokens, minlength=9000)[:4].double() / len(tokens)
    assert ((counts - probs).abs() <= 4 * (probs * (1 - probs) / len(tokens)).sqrt() + 1e-3).all()


def test_draw_keeps_the_plain_draw_where_the_in_place_one_does_not_apply():
    """Greedy, top-k, top-p and a vocabulary under DRAW_IN_PLACE_FROM_VOCAB: the plain draw, bit for bit."""
    from nanopar.policy import plain_draw

    big, small = real_vocab_logits(8, torch.float32), real_vocab_logits(8, torch.float32)[:, :100]
    for logits, kwargs in ((big, {"temperature": 0.0}), (big, {"temperature": 0.7, "top_k": 50}),
                           (big, {"temperature": 0.7, "top_p": 0.9}), (small, {"temperature": 0.7})):
        got = draw(logits, vocab_size=None, generator=torch.Generator().manual_seed(0), **kwargs)
        want = plain_draw(logits, vocab_size=None, generator=torch.Generator().manual_seed(0), **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), kwargs
