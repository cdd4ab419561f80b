"""What the tests share: the tiny models' tag world, a tag-biased tiny model and an independent
log-prob read.

Plain names, imported where used (`from conftest import TAGS, tag_biased_model`): pytest puts
tests/ on sys.path (bench/train_step.py adds it itself).

Not library code on purpose: the library ships none of it.
"""

from __future__ import annotations

import torch

from nanopar.model import ModelSettings, load_model
from nanopar.policy import policy_logprobs
from nanopar.tags import TagIds
from nanopar.tiny import char_tokenizer, tiny_qwen_model

# ---------------------------------------------------------------- the tiny models' token world

V = 256  # vocabulary of the tiny test models
TAGS = TagIds(*range(V - 6, V))  # the last six ids are the tags
P, P_, A, A_, S, S_ = TAGS.all()  # <Parallel> </Parallel> <Path> </Path> <Summary> </Summary>
EOS = 7  # an ordinary id the tests treat as end of sequence
PAD = 0  # the padding id of the tests' batches (the char tokenizer's pad too)


def bias_logits(model, bias: dict[int, float]):
    """Add `bias[id]` to the logit of each id on every forward (a hook on the output embedding):
    at temperature 1 a tiny random model then writes tags, so the sampler forks.
    -> the hook's handle (`handle.remove()` takes the bias off)"""
    ids, values = list(bias), list(bias.values())
    row = []  # the [V] bias, built at the first forward in the logits' dtype and device

    def add(module, args, out):  # out [..., V]
        if not row:
            row.append(torch.zeros(out.shape[-1], dtype=out.dtype, device=out.device))
            row[0][ids] = torch.tensor(values, dtype=out.dtype, device=out.device)
        return out + row[0]

    return model.get_output_embeddings().register_forward_hook(add)


def tag_biased_model(tag_bias=0.0, eos_bias=0.0, arch="qwen3", seed=0):
    """A tiny model; a bias on the tag (and EOS) logits makes structure likely at T = 1."""
    model = tiny_qwen_model(arch=arch, vocab_size=V, seed=seed)
    bias_logits(model, {**dict.fromkeys(TAGS.all(), tag_bias), EOS: eos_bias})
    return model


def load_char_model(folder, **settings):
    """A tiny Qwen3 (128 rows) saved with the char tokenizer to `folder`, then loaded as a user
    would (`load_model` adds the tags) with `settings` (lora=..., load_in_4bit=...).
    Seeded: LoRA A starts random. -> (model, tokenizer)"""
    tiny_qwen_model(vocab_size=128, hidden_size=64).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    torch.manual_seed(0)
    return load_model(ModelSettings(str(folder), **settings))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, vocab_size: int | None):
    """The policy log-prob of each token, read independently of the trainer's forward.
    logits [..., V], tokens [...] -> [...]."""
    return policy_logprobs(logits, temperature, vocab_size).gather(-1, tokens[..., None]).squeeze(-1)
