"""Tiny Qwen2 / Qwen3 models built from a config, for tests and demos (the toy world builds on it).

They are real `Qwen2ForCausalLM` / `Qwen3ForCausalLM` modules (same attention, rotary
embeddings, RMSNorm, GQA) with a few thousand to a few million parameters, randomly
initialised with a seed. `word_tokenizer` builds a small tokenizer with the `tokenizers` library
(whole words tried first, then one token per ASCII character); `char_tokenizer` is it without
words, so `load_model("tiny:qwen3")` gives a model + tokenizer pair without any download (its
text is noise: it is for trying the machinery). `bias_logits` adds a fixed logit bias on every
forward, so that a random tiny model writes tags and the sampler forks (tests and bench/).
Not here: Qwen's sliding-window or MoE variants, the toy world's own model and tokenizer (toy/).
"""

from __future__ import annotations

import re
from typing import Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config

from . import NanoparError


def tiny_qwen_config(
    arch: str = "qwen3",  # "qwen2" (q/k/v bias) or "qwen3" (q/k norm, explicit head_dim)
    vocab_size: int = 512,  # rows of the embedding / lm head
    hidden_size: int = 64,  # model width
    num_layers: int = 2,  # decoder layers
    num_heads: int = 4,  # query heads
    num_kv_heads: int = 2,  # key/value heads (GQA when < num_heads)
    intermediate_size: int | None = None,  # MLP width; 4 * hidden when None
    max_positions: int = 4096,  # rotary table length
    tie_word_embeddings: bool = True,  # as in Qwen2.5-0.5B / Qwen3-0.6B
    attn_implementation: str = "sdpa",  # "sdpa" or "eager"
):
    """A config for a tiny Qwen-architecture model."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "qwen2":
        config = Qwen2Config(**common)
    elif arch == "qwen3":
        config = Qwen3Config(head_dim=hidden_size // num_heads, **common)
    else:
        raise NanoparError(f"unknown tiny architecture {arch!r}: use 'qwen2' or 'qwen3'")
    config._attn_implementation = attn_implementation
    return config


def tiny_qwen_model(seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs):
    """A randomly initialised tiny Qwen model (eval mode), reproducible from `seed`."""
    config = tiny_qwen_config(**config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        config, dtype=dtype, attn_implementation=config._attn_implementation
    )
    return model.eval()


TINY_PREFIX = "tiny:"
TINY_MODELS = ("tiny:qwen2", "tiny:qwen3")  # load_model(name): a random tiny model, no download
EOS = "<|endoftext|>"


def word_tokenizer(
    words: Sequence[str] = (),  # whole-word tokens, tried before single characters, in this order
    whitespace: str = "\n",  # the characters besides printable ASCII (space..~) that get a token
    clean_up_tokenization_spaces: bool | None = None,  # None: transformers' default (not saved)
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: EOS (also padding) and <unk>, then `words`, then one token per
    printable ASCII character and per character of `whitespace`, ids in that order. Any text of
    those characters round-trips exactly, spaces included.

    >>> tokenizer = word_tokenizer(["yes"])
    >>> tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]), tokenizer.encode("yes!", add_special_tokens=False)
    (['<|endoftext|>', '<unk>', 'yes', ' ', '!'], [2, 4])
    """
    chars = [chr(i) for i in range(32, 127)] + list(whitespace)
    if len(set(words)) < len(words) or any(len(w) < 2 for w in words):  # each must be one more id
        raise NanoparError(f"words must be distinct and longer than one character: {list(words)}")
    vocab = {token: i for i, token in enumerate([EOS, "<unk>", *words, *chars])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    pieces = "|".join([*(re.escape(w) for w in words), "[\\s\\S]"])  # a word, else any one character
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pieces), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # join the pieces back as they were
    options = dict(eos_token=EOS, pad_token=EOS, unk_token="<unk>")
    if clean_up_tokenization_spaces is not None:  # only when given: the value is saved with the tokenizer
        options["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **options)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character and newline, plus EOS (also padding) and <unk>."""
    return word_tokenizer()


def tiny_named(name: str, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """(model, tokenizer) for "tiny:qwen2" / "tiny:qwen3": randomly initialised with seed 0, char
    tokenizer, vocabulary 128."""
    if name not in TINY_MODELS:
        raise NanoparError(f"unknown tiny model {name!r}: use {' or '.join(TINY_MODELS)}")
    model = tiny_qwen_model(arch=name.removeprefix(TINY_PREFIX), vocab_size=128, dtype=dtype,
                            attn_implementation=attn_implementation)
    return model, char_tokenizer()

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
