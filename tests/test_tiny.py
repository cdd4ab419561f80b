"""Tests of nanopar.tiny's tokenizers: the ids a saved tiny model depends on stay where they are."""

import json

import pytest

from nanopar import NanoparError
from nanopar.tiny import char_tokenizer, word_tokenizer


def test_char_tokenizer_ids_are_pinned(tmp_path):
    tokenizer = char_tokenizer()
    pinned = {"<|endoftext|>": 0, "<unk>": 1, " ": 2, "0": 18, "a": 67, "~": 96, "\n": 97}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in pinned} == pinned and len(tokenizer) == 98
    assert tokenizer.encode("a 0\n~\t", add_special_tokens=False) == [67, 2, 18, 97, 96, 1]  # no tab: <unk>
    assert tokenizer.decode([67, 2, 18, 97, 96]) == "a 0\n~"
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id) == (0, 0, 1)
    tokenizer.save_pretrained(tmp_path)  # transformers' default clean-up setting, not written out
    assert "clean_up_tokenization_spaces" not in json.loads((tmp_path / "tokenizer_config.json").read_text())


def test_word_tokenizer_tries_words_first_in_order():
    tokenizer = word_tokenizer(["ab", "abc", " so "], whitespace="\t\n", clean_up_tokenization_spaces=False)
    assert tokenizer.convert_ids_to_tokens([2, 3, 4, 5, 99, 100, 101]) == ["ab", "abc", " so ", " ", "~", "\t", "\n"]
    text = "abc so \tb"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["ab", "c", " so ", "\t", "b"]  # "ab" is tried before "abc"
    assert tokenizer.decode(ids) == text and tokenizer.clean_up_tokenization_spaces is False
    with pytest.raises(NanoparError, match="longer than one character"):
        word_tokenizer(["a"])
