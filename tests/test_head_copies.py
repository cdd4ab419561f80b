"""No [rows, d, V] tensor: the LM head's weight is never copied once per row, by a sampler call
(its prefill, forks and merges) or by a training read and its backward, with the head frozen
(LoRA, or a model loaded only to sample): torch's matmul of a strided [B, 1, d] view by a frozen
weight expands the weight to [B, d, V] and copies it (sampler.py's prefill says why it indexes)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import PAD, OpOutputs, perturb_trainable
from nanopar.forward import make_batch, trace_logprobs
from nanopar.model import ModelSettings, apply_lora
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import TagIds
from nanopar.tiny import tiny_qwen_model

V, D = 200, 48  # vocabulary and width: no other size of the model is either
TAGS = TagIds(*range(V - 6, V))
PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]  # three lengths: a padded prefill


def head_copies(ops: OpOutputs) -> list[tuple[str, tuple]]:
    """(operation, shape) of each tensor it returned that holds more than one [d, V] matrix's worth of
    numbers and has both a d and a V dimension (the head's weight, copied per row)."""
    return [(op, shape) for op, _, shape in ops.seen if D in shape and V in shape and math.prod(shape) > D * V]


def frozen_head_model(lora: bool):
    model = tiny_qwen_model(arch="qwen2", vocab_size=V, hidden_size=D, num_heads=4, num_kv_heads=2,
                            tie_word_embeddings=False)
    if lora:
        model = apply_lora(model, ModelSettings("tiny", lora=True), TAGS)
        perturb_trainable(model)
    else:  # as a checkpoint loaded to sample only: nothing trains
        model.requires_grad_(False)
    return model


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "frozen"])
def test_a_sampler_call_never_copies_the_head_per_row(lora):
    model = frozen_head_model(lora)
    policy = Policy(TAGS, "structured", 1.0, V)
    with OpOutputs() as ops:
        rollouts = sample(model, PROMPTS, policy, SamplerSettings(max_new_tokens=10, max_path_tokens=3, seed=0),
                          eos_ids=[], samples_per_prompt=2)
    assert [len(r.ids) >= 10 for r in rollouts] == [True] * 6
    assert head_copies(ops) == []


def test_the_prefill_without_the_index_would_copy_it():
    """The guard can fail: the model's own `logits_to_keep=1` on the padded prompts does copy."""
    model = frozen_head_model(lora=True)
    ids = torch.tensor([[0, 0, 3, 4, 5], [6, 7, 8, 9, 10]])  # [2, 5]
    with torch.no_grad(), OpOutputs() as ops:
        model(input_ids=ids, logits_to_keep=1)
    assert (2, D, V) in [shape for _, shape in head_copies(ops)]


@pytest.mark.parametrize("head_read", ["chunked", "plain"])
def test_a_training_read_and_its_backward_never_copy_the_head_per_row(head_read):
    model = frozen_head_model(lora=True).train()
    policy = Policy(TAGS, "structured", 1.0, V)
    response = [20, TAGS.block_open, TAGS.path_open, 21, TAGS.path_close, TAGS.path_open, 22, 23,
                TAGS.path_close, TAGS.block_close, TAGS.summary_open, 24, TAGS.summary_close, 25]
    batch = make_batch(PROMPTS[:2], [response, response[:4]], [[1.0] * len(response), [1.0] * 4], pad_id=PAD)
    with OpOutputs() as ops:
        logprobs, _ = trace_logprobs(model, batch, policy, with_entropy=True, head_read=head_read)
        (logprobs * batch.target_mask).sum().backward()
    assert head_copies(ops) == []
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_B" in n)
