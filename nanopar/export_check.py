"""Check an export against the checkpoint it came from, each side run by its own engine.

  - `sampler_greedy`: the checkpoint as nanopar runs it (its adapter over its base), causal
    mode, temperature 0: the reference;
  - `transformers_greedy`: the merged folder (or a GGUF read back) under plain `generate`;
  - `llama_cpp_greedy`: the GGUF under llama.cpp (the `xllamacpp` wheel, an optional extra);
  - `logit_gap`: the largest logit difference of two models on one prompt, against the logits' scale;
  - `agreement`: how many leading tokens two greedy runs share.
Greedy decoding is exact only while the top two logits are further apart than the engines'
rounding; a real model's check therefore reports how far the tokens agree, not a pass or fail.
Not here: sampling at a temperature (two engines' random numbers differ), the structured mode
(a plain engine does not fork: docs/export.md).
"""

from __future__ import annotations

import importlib.util

import torch

from . import NanoparError
from .checkpoint import trained_schema, trained_with
from .model import ModelSettings, load_model
from .policy import Policy
from .prompts import build_prompt, instructions_named, stop_ids
from .sampler import SamplerSettings, sample

LLAMA_CPP_HINT = "pip install xllamacpp==2026.10.11549"


def check_prompts(checkpoint: str, tokenizer, problems: list, data: str) -> list[list[int]]:
    """`problems` (loaded from `data`) as the checkpoint's stage prompted them: its instructions,
    worded as `data`'s source words them, in the chat template."""
    instructions = instructions_named(trained_with(checkpoint).get("instructions", "none"), data,
                                      trained_schema(checkpoint))
    return [build_prompt(p, tokenizer, instructions=instructions) for p in problems]


def sampler_greedy(checkpoint: str, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """nanopar's sampler on the checkpoint, causal, greedy, one prompt a call: each response up to
    its first inserted token (a plain engine inserts none). Nothing else steers it: no block cap,
    no path budget below `tokens`."""
    schema = trained_schema(checkpoint)
    model, tokenizer = load_model(ModelSettings(checkpoint, dtype="float32", device="cpu"), schema)
    policy = Policy.for_tokenizer(tokenizer, "causal", 0.0, 0, schema)
    settings = SamplerSettings(max_new_tokens=tokens, max_path_tokens=tokens, max_blocks=tokens, seed=0)
    responses = []
    for prompt in prompts:
        rollout = sample(model, [prompt], policy, settings, stop_ids(model, tokenizer))[0]
        drawn = rollout.sampled.index(False) if False in rollout.sampled else len(rollout.ids)
        responses.append(rollout.ids[:drawn])
    return responses


def transformers_greedy(folder: str, prompts: list[list[int]], tokens: int, gguf_file: str | None = None) -> list[list[int]]:
    """Plain transformers `generate` (greedy, float32) on the model folder, or on a GGUF in it
    read back by transformers' GGUF loader; stops where nanopar's `stop_ids` do."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    stops = stop_ids(model, tokenizer)
    responses = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                                 eos_token_id=stops, pad_token_id=stops[0])  # [1, len(prompt) + new]
        responses.append(out[0, len(prompt):].tolist())
    return responses


def llama_cpp_greedy(gguf_path: str, prompts: list[list[int]], tokens: int, threads: int = 2) -> list[list[int]]:
    """llama.cpp's greedy tokens (temperature 0) for each prompt, fed as token ids, read back as ids."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise NanoparError(f"running a GGUF under llama.cpp needs xllamacpp: {LLAMA_CPP_HINT}")
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path)
    params.n_ctx = max(map(len, prompts)) + tokens + 8
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    responses = []
    for prompt in prompts:
        out = server.handle_completions({"prompt": prompt, "max_tokens": tokens, "temperature": 0.0,
                                         "logprobs": 1, "cache_prompt": False})
        if "choices" not in out:
            raise NanoparError(f"llama.cpp refused the completion: {str(out)[:200]}")
        content = out["choices"][0]["logprobs"] or {"content": []}
        responses.append([step["id"] for step in content["content"]])
    return responses


def logit_gap(model_a, model_b, prompt: list[int]) -> float:
    """max |logits_a - logits_b| / max |logits_a| over every position of `prompt` and the ids both
    models have (an export has no padding rows)."""
    with torch.no_grad():
        a = model_a(torch.tensor([prompt])).logits.float()  # [1, T, V_a]
        b = model_b(torch.tensor([prompt])).logits.float()  # [1, T, V_b]
    shared = min(a.shape[-1], b.shape[-1])
    a, b = a[..., :shared], b[..., :shared]
    return ((a - b).abs().max() / a.abs().max()).item()


def agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share.

    >>> agreement([1, 2, 3], [1, 2, 4, 5])
    2
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
