"""Write a merged Qwen2/Qwen3 model folder as one GGUF file, the format llama.cpp and Ollama run.

A GGUF is a header of key-values (the architecture's numbers, the tokenizer) and named tensors.
Here, written with the `gguf` package (llama.cpp's own Python writer):

    qwen2.block_count, .embedding_length, ...    from config.json
    tokenizer.ggml.tokens / token_type / merges   from the tokenizer: byte-level BPE, Qwen's "qwen2"
                                                  pre-tokenizer; ids past the tokenizer's last (the
                                                  embedding's padding rows) become "[PAD<id>]"
    blk.0.attn_q.weight, ...                      the weights, named by gguf's own map of
                                                  transformers' names (`TensorNameMap`)

Each matrix is stored as `kind` says (f32, f16, bf16, or q8_0: blocks of 32 values, one scale
each); vectors (norms, biases) stay float32, as llama.cpp's converter keeps them. The tags are
written as user-defined tokens, not control ones as llama.cpp's converter would make special
tokens: llama.cpp then prints `<Parallel>` in its text and reads it back from a prompt.
Not here: other architectures (Llama's q/k need a row permutation, Gemma its own keys): run
llama.cpp's `convert_hf_to_gguf.py` on the exported folder; sliding windows, rope scaling; the
k-quants (llama.cpp's `llama-quantize` makes them from this file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from . import NanoparError

ARCHITECTURES = ("qwen2", "qwen3")  # model_type -> gguf's architecture of the same name
KINDS = ("f32", "f16", "bf16", "q8_0")  # what `kind` may be
GGUF_HINT = "pip install gguf==0.19.0"


def gguf_bytes(parameters: int, kind: str) -> int:
    """About how large a GGUF of `parameters` weights in `kind` is (q8_0: 34 bytes per 32 values)."""
    return int(parameters * {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}[kind])


def check_writable(config: dict, tokenizer_json: dict) -> None:
    """One line when the folder is not one this writer knows: its architecture, its tokenizer."""
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise NanoparError(f"GGUF export writes {' and '.join(ARCHITECTURES)} models; this one is {kind!r}: "
                           "run llama.cpp's convert_hf_to_gguf.py on the exported folder")
    model, pre = tokenizer_json.get("model", {}), tokenizer_json.get("pre_tokenizer") or {}
    steps = [p.get("type") for p in pre.get("pretokenizers", [pre])]
    if model.get("type") != "BPE" or "ByteLevel" not in steps:
        raise NanoparError(f"GGUF export needs a byte-level BPE tokenizer (Qwen's); this one is a "
                           f"{model.get('type')} with {steps}: llama.cpp could not read its text")
    if config.get("use_sliding_window") or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise NanoparError("GGUF export writes full attention with plain RoPE; this model uses a sliding window "
                           "or scaled RoPE: run llama.cpp's convert_hf_to_gguf.py on the exported folder")


def write_gguf(folder: str | Path, path: str | Path, kind: str, tags: tuple[str, ...]) -> Path:
    """Write the model folder `folder` (a merged export) to the GGUF file `path` in `kind`, the
    schema's `tags` as user-defined tokens. -> path"""
    try:
        import gguf
    except ImportError:
        raise NanoparError(f"writing GGUF needs the gguf package: {GGUF_HINT}") from None
    if kind not in KINDS:
        raise NanoparError(f"unknown GGUF kind {kind!r}: use one of {', '.join(KINDS)}")
    folder, path = Path(folder), Path(path)
    config = json.loads((folder / "config.json").read_text())
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    check_writable(config, tokenizer_json)
    arch = config["model_type"]
    writer = gguf.GGUFWriter(str(path), arch)
    _add_hyperparameters(writer, config, kind, gguf)
    _add_tokenizer(writer, folder, config["vocab_size"], tags, gguf)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    for name, weight in _weights(folder):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise NanoparError(f"GGUF export: no GGUF name for the weight {name!r} of a {arch} model")
        data, dtype = _stored(weight, kind, gguf)
        writer.add_tensor(gguf_name, data, raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_hyperparameters(writer, config: dict, kind: str, gguf) -> None:
    """The architecture's numbers, under `<arch>.` keys, as llama.cpp reads them."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer.add_name(str(config.get("_name_or_path") or "nanopar export"))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads", heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    file_types = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
    writer.add_file_type(getattr(gguf.LlamaFileType, file_types[kind]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_tokenizer(writer, folder: Path, vocab_size: int, tags: tuple[str, ...], gguf) -> None:
    """Every row's token (by id; ids the tokenizer lacks are "[PAD<id>]", unused), its type, the
    merges, the special ids and the chat template (gguf's `SpecialVocab` reads the last three)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    if max(by_id) >= vocab_size:
        raise NanoparError(f"GGUF export: the tokenizer has ids up to {max(by_id)}, the embedding only {vocab_size} rows")
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in tags:  # printed and read as text by llama.cpp
            tokens.append(token)
            types.append(gguf.TokenType.USER_DEFINED)
        elif i in added:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)


def _weights(folder: Path):
    """(transformers' name, float32 tensor) of every weight in the folder's safetensors files."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise NanoparError(f"GGUF export: no .safetensors file in {str(folder)!r}")
    for file in files:
        with safe_open(os.fspath(file), framework="pt") as weights:
            for name in weights.keys():
                yield name, weights.get_tensor(name).to(torch.float32)


def _stored(weight: torch.Tensor, kind: str, gguf):
    """(numpy data, its GGML type): a matrix as `kind` says, a vector as float32. A matrix whose
    rows q8_0 cannot block in 32s is stored as f16, as llama.cpp's converter does."""
    data = weight.numpy()
    if weight.dim() == 1 or kind == "f32":
        return data, gguf.GGMLQuantizationType.F32
    if kind == "q8_0" and weight.shape[-1] % 32:
        kind = "f16"
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype("float16"), qtype
    return gguf.quants.quantize(data, qtype), qtype
