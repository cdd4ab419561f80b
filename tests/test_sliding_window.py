"""A model whose layers mix sliding-window and full attention (Gemma-3's architecture), tiny and
random, with a window of 5 tokens: nanopar's masks must keep the window (layout.py,
kvcache.py), against the model's own masks and against unforked runs.

Without it a 4D mask is every layer's mask: the sliding layers see everything (on the real
Gemma-3 270M past 512 tokens: up to 25 nats per token off, a different argmax at 43% of
positions), and a prompt longer than the window crashed the sampler (the model's own cache keeps
only the last window - 1 columns of a sliding layer).
"""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from conftest import EOS, PAD, TAGS, V, bias_logits, token_logprobs, trainer_gap
from nanopar.layout import build_layout, sliding_window
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample

WINDOW = 5
PROMPTS = [[1, 2, 3], [4, 5, 6, 8, 9, 10, 11, 12], [12, 13, 14, 15, 16]]  # the second is longer than the window


def tiny_gemma3(seed: int = 0):
    """A random Gemma-3 text model: layers sliding, full, sliding; V rows, TAGS the last six."""
    config = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=WINDOW, max_position_embeddings=256, pad_token_id=PAD,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).eval()


def test_the_window_is_read_from_the_layer_types():
    assert sliding_window(tiny_gemma3()) == WINDOW
    from nanopar.tiny import tiny_qwen_model

    assert sliding_window(tiny_qwen_model(vocab_size=V)) is None  # full attention everywhere: one mask


def test_a_causal_layout_with_the_window_is_the_models_own_masks():
    model = tiny_gemma3()
    ids = torch.randint(0, V - 6, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = model(input_ids=ids).logits  # transformers builds the sliding and the full masks
        def ours(window):
            layout = build_layout(ids, TAGS, "causal", window=window)
            return model(input_ids=ids, attention_mask=layout.attention_mask, position_ids=layout.position_ids).logits
        assert (ours(WINDOW) - own).abs().max() <= 1e-5
        assert (ours(None) - own)[:, WINDOW:].abs().max() > 1e-2  # the premise: one 4D mask loses the window


def test_greedy_decoding_past_the_window_equals_generate():
    """Left-padded prompts, one longer than the window: the prefill's cache keeps every column."""
    model = tiny_gemma3(seed=1)
    rollouts = sample(model, PROMPTS, Policy(None, temperature=0), SamplerSettings(max_new_tokens=16), eos_ids=[])
    T = max(map(len, PROMPTS))
    ids = torch.tensor([[PAD] * (T - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in PROMPTS])
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                               pad_token_id=PAD, eos_token_id=None)[:, T:]
    assert [r.ids for r in rollouts] == reference.tolist()


@pytest.fixture(scope="module")
def forked():
    """Structured rollouts at T = 1 of a tag-heavy tiny Gemma-3: rows far longer than the window."""
    model = tiny_gemma3(seed=2)
    bias_logits(model, {**dict.fromkeys(TAGS.all(), 2.5), EOS: 1.0})
    policy = Policy(TAGS)
    settings = SamplerSettings(max_new_tokens=40, max_path_tokens=8, paths=3, seed=0)
    return model, policy, sample(model, PROMPTS, policy, settings, eos_ids=[EOS], samples_per_prompt=4)


def test_forked_paths_match_unforked_runs_under_the_models_own_masks(forked):
    """Each path of a first block: its log-probs equal a plain run of prefix + that path alone, in
    which transformers makes the masks (the window counts the tokens the path sees)."""
    model, policy, rollouts = forked
    checked = 0
    for rollout in rollouts:
        full, n = rollout.prompt_ids + rollout.ids, len(rollout.prompt_ids)
        for block in rollout.trace.blocks[:1]:
            prefix = full[: n + block.paths[0].start]
            for path in block.paths:
                alone = torch.tensor([prefix + full[n + path.start : n + path.end]])
                with torch.no_grad():
                    logits = model(input_ids=alone).logits[0]
                expected = token_logprobs(logits[len(prefix) - 1 : -1], alone[0, len(prefix) :], 1.0, None)
                sampled = torch.tensor(rollout.sampled[path.start : path.end])
                got = torch.tensor(rollout.logprobs[path.start : path.end])
                assert (got - expected)[sampled].abs().max() <= 1e-5
                checked += int(sampled.sum()) * (len(alone[0]) > WINDOW)
    assert checked > 30  # the premise: forks happened, and paths were sampled past the window


def test_the_trainer_reproduces_every_sampled_logprob_past_the_window(forked):
    model, policy, rollouts = forked
    worst, count = trainer_gap(model, policy, rollouts)
    assert worst <= 1e-5, worst
    assert sum(r.stats.forks for r in rollouts) >= 6 and any(len(r.trace.blocks) >= 2 for r in rollouts)
    assert max(len(r.prompt_ids) + len(r.ids) for r in rollouts) > 4 * WINDOW and count > 100
