"""A memory plan for real Qwen models on a GPU: 4-bit NF4 + LoRA + tag rows, GRPO with nanopar.

    python bench/memory_plan.py                 # measure on this CPU (7 min of CPU time), print the plan
    python bench/memory_plan.py --no-measure    # the plan from the coefficients stored below (instant)
    python bench/memory_plan.py --no-measure --model qwen3-0.6b --prompts 4 --micro-batch 4

    from memory_plan import predict             # with bench/ on sys.path: bytes of each component
    predict("qwen2.5-1.5b", micro_batch=2, checkpointing=True)["training_peak"]

The plan is the peak memory of the two halves of a GRPO step, B prompts x G samples x N new
tokens, split into components, each **measured on this CPU** at the real layer shapes on a
randomly initialised model of the real config (no download), built as `load_model` builds it:
saved, reloaded 4-bit NF4 with double quantisation (`_model_kwargs`), `disable_bnb_cpu_repack`,
LoRA on the seven projections + the six tag rows (`apply_lora`). Only 4 decoder layers are built;
measurements at 2 and at 4 layers give the per-layer slope, and the plan extrapolates to the
model's depth (`--check`: against one full-depth Qwen2.5-0.5B, measured whole).

    sampling = weights + LoRA + AdamW states + KV cache + one decode step
    training = weights + LoRA + AdamW states + LoRA grads + max(activations + logits chunk, embedding)

  weights       bytes of every parameter, buffer and 4-bit quant state (packed NF4, 8-bit absmax,
                float32 second-level absmax; embedding, norms, biases in the compute dtype), per
                layer and the rest (the tied 151,936 x d embedding)
  LoRA, AdamW   the trainable tensors (float32: peft keeps adapters in float32 over a bf16 base)
                and AdamW's exp_avg / exp_avg_sq after one real step; grads the size of LoRA
  KV cache      bytes per token per layer of a filled cache (= 2 x kv_heads x head_dim x bytes),
                x the rows the sampler holds (one per lane: B x G; B x G x K when every response
                is inside a K-path block, the bound the plan uses) x its width (longest prompt +
                new tokens + inserted tags: every row is as wide as the longest)
  decode step   one sampler step over a filled cache (every lane fed a token with the padding
                mask, then `draw` at temperature 1 with a ban mask), in its phases measured apart:
                the embedding lookup (peft merges the tag rows into a full copy of the matrix), the
                layers (at two widths: a layer's new K/V while the old exist), the output embedding
                + draw (at two row counts: [N, V] float32 buffers); the plan takes the largest
  activations   forward + backward of the decoder layers (from the embedding's output; the layout
                mask built inside, as the trainer does) on one row of T = prompt + new + inserted
                tokens, with and without `enable_gradient_checkpointing`, at 2 and 4 layers: slope
                per layer and intercept; x micro-batch rows; linear in T (the T x T mask exactly).
                Beside it, a census of the tensors autograd saves (saved_tensors_hooks), by dtype
  logits chunk  the chunked training read as users run it (`chunked_read`: the library's
                `head.head_logprobs` with the model's head from `decoder_and_head`, with the
                entropy, forward + backward, each chunk's logits recomputed in backward) over two
                chunks of the library's default chunk (CHUNK_BYTES of float32 logits: 221 positions
                on Qwen's vocabulary) and of twice it: a line between them, proportional above;
                `--only chunk` re-measures this alone. `--chunk-tokens 0` = the read before head.py,
                the full logits of a whole micro-batch (WHOLE_READ_PER_TOKEN, stored, not re-measured)
  embedding     the input embedding's forward + backward alone (a merged copy, a dense [V, d]
                gradient): before and after the layers' activations, so a max, not a sum

Each component is a peak rise of the resident set (psutil, every 2 ms; glibc's mmap threshold
fixed at 64 KiB so that freed tensors leave the resident set as they leave a GPU allocator), or
tensor bytes where they are exact. Measured in bfloat16 by default, the GPU's compute dtype:
bitsandbytes runs NF4 with bf16 compute on this CPU (nanopar refuses that combination for
training, `resolve_device_and_dtype`, because its results are unverified there; its memory is
what is measured here); `--dtype float32` measures nanopar's own CPU path. Not in the plan: the
CUDA context and cuBLAS workspace (outside `torch.cuda.max_memory_allocated`), the caching
allocator's fragmentation (the recommendations allow 1 GiB + 10% for both), a KL reference (one
more copy of the LoRA parameters, kl_beta > 0), attention kernels that differ between CPU and GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pprint
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

GiB, MiB = 2**30, 2**20
VOCAB = 151936  # embedding rows of every Qwen2.5 / Qwen3 model
# The published configs (config.json of each hub repo), written out: no download here.
MODELS = {
    #                 arch     hidden layers heads kv head_dim  mlp   tokenizer (len, before the 6 tags)
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, 64, 4864, 151665),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, 128, 8960, 151665),
    "qwen3-0.6b": ("qwen3", 1024, 28, 16, 8, 128, 3072, 151669),
    "qwen3-1.7b": ("qwen3", 2048, 28, 16, 8, 128, 6144, 151669),
}  # all four tie the input and output embeddings (tie_word_embeddings: true)
BUILT_LAYERS = (2, 4)  # depths measured; the plan is linear in between and beyond


def library_chunk(vocab: int) -> int:
    """Positions per chunk of `nanopar.head.head_logprobs` by default: CHUNK_BYTES of float32 logits."""
    from nanopar.head import CHUNK_BYTES

    return max(1, CHUNK_BYTES // (4 * vocab))


# the library's default chunk on Qwen's real vocabulary (tokenizer + the six tags): 221 positions
DEFAULT_CHUNK = min(library_chunk(spec[7] + 6) for spec in MODELS.values())
CHUNKS = (DEFAULT_CHUNK, 2 * DEFAULT_CHUNK)  # logits-chunk sizes measured (positions), two chunks each


def qwen_config(name: str, layers: int | None = None):
    """The transformers config of `name` (MODELS), with `layers` decoder layers (None = all)."""
    from transformers import Qwen2Config, Qwen3Config

    arch, hidden, depth, heads, kv, head_dim, mlp, _ = MODELS[name]
    common = dict(hidden_size=hidden, num_hidden_layers=layers or depth, num_attention_heads=heads,
                  num_key_value_heads=kv, intermediate_size=mlp, vocab_size=VOCAB, tie_word_embeddings=True,
                  rms_norm_eps=1e-6, rope_theta=1e6, hidden_act="silu")
    if arch == "qwen2":  # head_dim = hidden / heads; q/k/v have biases
        return Qwen2Config(max_position_embeddings=32768, use_sliding_window=False, **common)
    return Qwen3Config(head_dim=head_dim, max_position_embeddings=40960, attention_bias=False, **common)


def kv_bytes_per_token_layer(name: str, dtype_bytes: int = 2) -> int:
    """2 (keys, values) x kv_heads x head_dim x bytes: the formula the measurement checks."""
    _, _, _, _, kv, head_dim, _, _ = MODELS[name]
    return 2 * kv * head_dim * dtype_bytes


# --- the stored measurement ------------------------------------------------------------------
# Printed by `python bench/memory_plan.py` (bfloat16; the run of 2026-11-30 in bench/README.md; 'chunk'
# re-measured with `--only chunk` on 2026-12-01, the library's head_logprobs),
# in bytes; activations for one row of T0 tokens. `predict` uses these unless given others.
# The read before nanopar/head.py (`--chunk-tokens 0`): the full logits of a micro-batch, bytes per
# token read, from the stand-in (torch checkpoint + policy_logprobs + a copying entropy) measured
# at 1,024 tokens on 2026-11-30 (bfloat16), kept for the "before" row; not re-measured.
WHOLE_READ_PER_TOKEN = {"qwen2.5-0.5b": 2485616640 / 1024, "qwen2.5-1.5b": 2482270208 / 1024,
                        "qwen3-0.6b": 2484731904 / 1024, "qwen3-1.7b": 2485415936 / 1024}
STORED: dict = {'qwen2.5-0.5b': {'dtype': 'bfloat16',
                                 'T0': 1368,
                                 'lora_rank': 16,
                                 'mask_bytes_per_element': 2,
                                 'kv_formula': 512,
                                 'weights': {'fixed': 272292864, 'per_layer': 7704852},
                                 'lora': {'fixed': 21504, 'per_layer': 1466368},
                                 'adam': {'fixed': 43008, 'per_layer': 2932736},
                                 'activations': {'plain': {'fixed': 56442880,
                                                           'per_layer': 112056320,
                                                           'at': {2: 280555520, 4: 504668160}},
                                                 'checkpointing': {'fixed': 159395840,
                                                                   'per_layer': 2555904,
                                                                   'at': {2: 164507648, 4: 169619456}}},
                                 'saved_per_layer': {'float32': 66539520, 'bfloat16': 49729536},
                                 'saved_tensors_per_layer': 26,
                                 'chunk': {'const': 547135488, 'per_token': 918894, 'at': {221: 750211072, 442: 953286656}, 'no_entropy_at_default': 748216320},
                                 'embedding_train': 274739200,
                                 'embedding_forward': 270901248,
                                 'decode': {'per_row': -15392,
                                            'per_row_column': 289,
                                            'head_const': 136552448,
                                            'head_per_row': 2427264,
                                            'at': {'layers 128x1368': 48623616,
                                                   'layers 128x684': 23326720,
                                                   'head 64': 291897344,
                                                   'head 128': 447242240,
                                                   'whole step 128x1368': 446500864}},
                                 'kv_per_token_layer': 512},
                'qwen2.5-1.5b': {'dtype': 'bfloat16',
                                 'T0': 1368,
                                 'lora_rank': 16,
                                 'mask_bytes_per_element': 2,
                                 'kv_formula': 1024,
                                 'weights': {'fixed': 466787840, 'per_layer': 24156796},
                                 'lora': {'fixed': 36864, 'per_layer': 2637824},
                                 'adam': {'fixed': 73728, 'per_layer': 5275648},
                                 'activations': {'plain': {'fixed': 72822784,
                                                           'per_layer': 207077376,
                                                           'at': {2: 486977536, 4: 901132288}},
                                                 'checkpointing': {'fixed': 284168192,
                                                                   'per_layer': 3086336,
                                                                   'at': {2: 290340864, 4: 296513536}}},
                                 'saved_per_layer': {'float32': 116958528, 'bfloat16': 90353664},
                                 'saved_tensors_per_layer': 26,
                                 'chunk': {'const': 935776256, 'per_token': 926048, 'at': {221: 1140432896, 442: 1345089536}, 'no_entropy_at_default': 1138634752},
                                 'embedding_train': 470982656,
                                 'embedding_forward': 463491072,
                                 'decode': {'per_row': -31584,
                                            'per_row_column': 559,
                                            'head_const': 466280448,
                                            'head_per_row': 314880,
                                            'at': {'layers 128x1368': 93786112,
                                                   'layers 128x684': 44871680,
                                                   'head 64': 486432768,
                                                   'head 128': 506585088,
                                                   'whole step 128x1368': 507305984}},
                                 'kv_per_token_layer': 1024},
                'qwen3-0.6b': {'dtype': 'bfloat16',
                               'T0': 1368,
                               'lora_rank': 16,
                               'mask_bytes_per_element': 2,
                               'kv_formula': 4096,
                               'weights': {'fixed': 311192064, 'per_layer': 8126172},
                               'lora': {'fixed': 24576, 'per_layer': 1441792},
                               'adam': {'fixed': 49152, 'per_layer': 2883584},
                               'activations': {'plain': {'fixed': 35860480,
                                                         'per_layer': 137359360,
                                                         'at': {2: 310579200, 4: 585297920}},
                                               'checkpointing': {'fixed': 164777984,
                                                                 'per_layer': 2830336,
                                                                 'at': {2: 170438656, 4: 176099328}}},
                               'saved_per_layer': {'float32': 84892608, 'bfloat16': 47628288},
                               'saved_tensors_per_layer': 30,
                               'chunk': {'const': 624570368, 'per_token': 920896, 'at': {221: 828088320, 442: 1031606272}, 'no_entropy_at_default': 826294272},
                               'embedding_train': 313991168,
                               'embedding_forward': 311377920,
                               'decode': {'per_row': 8480,
                                          'per_row_column': 2067,
                                          'head_const': 214474752,
                                          'head_per_row': 1816512,
                                          'at': {'layers 128x1368': 363057152,
                                                 'layers 128x684': 182071296,
                                                 'head 64': 330731520,
                                                 'head 128': 446988288,
                                                 'whole step 128x1368': 447836160}},
                               'kv_per_token_layer': 4096},
                'qwen3-1.7b': {'dtype': 'bfloat16',
                               'T0': 1368,
                               'lora_rank': 16,
                               'mask_bytes_per_element': 2,
                               'kv_formula': 4096,
                               'weights': {'fixed': 622383616, 'per_layer': 25980892},
                               'lora': {'fixed': 49152, 'per_layer': 2490368},
                               'adam': {'fixed': 98304, 'per_layer': 4980736},
                               'activations': {'plain': {'fixed': 71385088,
                                                         'per_layer': 217534464,
                                                         'at': {2: 506454016, 4: 941522944}},
                                               'checkpointing': {'fixed': 273547264,
                                                                 'per_layer': 7237632,
                                                                 'at': {2: 288022528, 4: 302497792}}},
                               'saved_per_layer': {'float32': 140925888, 'bfloat16': 72843264},
                               'saved_tensors_per_layer': 30,
                               'chunk': {'const': 1246941184, 'per_token': 931219, 'at': {221: 1452740608, 442: 1658540032}, 'no_entropy_at_default': 1450962944},
                               'embedding_train': 627970048,
                               'embedding_forward': 622362624,
                               'decode': {'per_row': -14176,
                                          'per_row_column': 2076,
                                          'head_const': 622071808,
                                          'head_per_row': 313088,
                                          'at': {'layers 128x1368': 361730048,
                                                 'layers 128x684': 179957760,
                                                 'head 64': 642109440,
                                                 'head 128': 662147072,
                                                 'whole step 128x1368': 663699456}},
                               'kv_per_token_layer': 4096}}


# --- the plan --------------------------------------------------------------------------------
def sequence_tokens(prompt_tokens: int, new_tokens: int, paths: int, max_blocks: int) -> int:
    """Tokens of the longest row: prompt + sampled + inserted tags (per block: K forced <Path>,
    up to K inserted </Path>, the two merge tags </Parallel><Summary>)."""
    return prompt_tokens + new_tokens + max_blocks * (2 * paths + 2)


def predict(model_name: str, prompts: int = 8, samples: int = 8, new_tokens: int = 1024, prompt_tokens: int = 320,
            paths: int = 2, max_blocks: int = 4, micro_batch: int = 2, checkpointing: bool = True,
            chunk_tokens: int = DEFAULT_CHUNK, lora_rank: int = 16, layers: int | None = None,
            coefficients: dict | None = None) -> dict[str, int]:
    """Predicted GPU memory of one GRPO step, in bytes, by component (see the module docstring):
    weights, lora, adam, grads, kv_cache (the bound: B x G x K rows), kv_cache_no_fork, decode_step,
    activations, logits_chunk, and the totals sampling_peak and training_peak.

    chunk_tokens: positions per logits chunk of `head_logprobs` (default: the library's, CHUNK_BYTES
    of float32 logits); 0 = the read before head.py, the full logits of a whole micro-batch at once
    (`whole_read`: the stand-in measured 2026-11-30, scaled in proportion). layers: decoder layers (None = the model's). coefficients: a
    `measure_model` result (None = STORED[model_name]). Sampling and training are separate peaks:
    the cache is freed before training, the activations before the next sampling. For
    bench/train_step.py --full-size 0.5b (4 x 8 x 1,024, prompts of 16 tokens, micro-batch 2):
    predict("qwen2.5-0.5b", prompts=4, prompt_tokens=16)
    """
    c = coefficients if coefficients is not None else STORED[model_name]
    depth = layers or MODELS[model_name][2]
    T = sequence_tokens(prompt_tokens, new_tokens, paths, max_blocks)
    rank = lora_rank / c["lora_rank"]
    line = lambda key: c[key]["fixed"] + depth * c[key]["per_layer"]  # noqa: E731
    weights = line("weights")
    lora = c["lora"]["fixed"] + depth * c["lora"]["per_layer"] * rank  # tag rows do not scale with r
    adam = c["adam"]["fixed"] + depth * c["adam"]["per_layer"] * rank
    rows_no_fork = prompts * samples
    rows = rows_no_fork * paths  # every response inside a K-path block at once: the bound
    kv = c["kv_per_token_layer"] * depth * T
    decode = decode_peak(c, rows, T)
    a = c["activations"]["checkpointing" if checkpointing else "plain"]
    mask = c["mask_bytes_per_element"]
    per_row = (a["fixed"] + depth * a["per_layer"] - mask * c["T0"] ** 2) * T / c["T0"] + mask * T**2
    activations = micro_batch * per_row
    read = micro_batch * (T - 1)  # tokens a micro-batch reads; a chunk holds at most these
    if chunk_tokens:
        logits = chunk_peak(c, min(chunk_tokens, read))
    else:  # the pre-head.py read: [b, T, V] logits, float32 log-softmax and their gradients at once
        logits = read * WHOLE_READ_PER_TOKEN[model_name]
    out = dict(weights=weights, lora=lora, adam=adam, grads=lora, kv_cache=kv * rows,
               kv_cache_no_fork=kv * rows_no_fork, decode_step=decode, activations=activations, logits_chunk=logits)
    out = {k: int(v) for k, v in out.items()}
    out["sampling_peak"] = out["weights"] + out["lora"] + out["adam"] + out["kv_cache"] + out["decode_step"]
    # the embedding's backward (a dense [V, d] gradient) comes after the layers' activations are freed
    out["training_peak"] = (out["weights"] + out["lora"] + out["adam"] + out["grads"]
                            + max(out["activations"] + out["logits_chunk"], int(c["embedding_train"])))
    return out


def chunk_peak(c: dict, tokens: int) -> float:
    """A logits chunk's peak (`head_logprobs`, `tokens` positions per chunk): the line through the
    two measured sizes between them and below (floored at 0), proportional to the largest above
    it (conservative: the intercept, the head's merged [V, d] copy and its [V, d] gradient in a
    chunk's backward, does not grow with the chunk)."""
    at = c["chunk"]["at"]
    largest = max(at)
    if tokens >= largest:
        return at[largest] * tokens / largest
    return max(0.0, c["chunk"]["const"] + tokens * c["chunk"]["per_token"])


# --- measuring -------------------------------------------------------------------------------
def fix_mmap_threshold(threshold: int = 64 * 1024) -> None:
    """Large blocks straight from mmap, returned on free (glibc's threshold otherwise grows after
    each free up to 32 MiB and freed tensors stay resident): the RSS then follows live tensors."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-3, threshold)  # M_MMAP_THRESHOLD


def train_step_module():
    """bench/train_step.py, for its resident-set watcher (one definition of the measurement)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import train_step

    return train_step


def peak_rise(fn) -> tuple[int, object]:
    """(peak resident bytes above those at the start, fn's result)."""
    PeakRSS = train_step_module().PeakRSS

    gc.collect()
    with PeakRSS() as watch:
        result = fn()
    return watch.rise, result


@contextlib.contextmanager
def log(what: str, console):
    start = time.perf_counter()
    yield
    console.print(f"  {what}: {time.perf_counter() - start:.1f} s (load {os.getloadavg()[0]:.2f})")


def build(name: str, layers: int, dtype: torch.dtype, rank: int = 16):
    """A random model of `name`'s shape with `layers` layers, 4-bit + LoRA + tag rows, as
    `load_model` makes it. -> (model, tag ids)"""
    from transformers import AutoModelForCausalLM

    from nanopar.model import ModelSettings, _model_kwargs, apply_lora, disable_bnb_cpu_repack
    from nanopar.tags import TagIds

    torch.manual_seed(0)
    settings = ModelSettings("random", device="cpu", load_in_4bit=True, lora=True, lora_rank=rank)
    with tempfile.TemporaryDirectory(prefix="nanopar-memplan-") as folder:
        AutoModelForCausalLM.from_config(qwen_config(name, layers), dtype=torch.bfloat16).save_pretrained(folder)
        gc.collect()
        model = AutoModelForCausalLM.from_pretrained(folder, **_model_kwargs(settings, "cpu", dtype))
        with torch.no_grad():  # own memory, not views of the file's mapping (its pages would count as resident)
            for tensor in [*model.parameters(), *model.buffers()]:
                if tensor.dtype != torch.uint8:
                    tensor.data = tensor.data.clone()
    disable_bnb_cpu_repack(model)
    tokenizer = MODELS[name][7]
    tags = TagIds(*range(tokenizer, tokenizer + 6))  # where the tags land after Qwen's tokenizer
    model = apply_lora(model, settings, tags)
    return model, tags


def decoder_of(model):
    return model.get_base_model().model  # Qwen2Model / Qwen3Model: embedding, layers, final norm


def use_layers(model, layers: list) -> None:
    """Run the decoder with `layers` only (a prefix of the built ones)."""
    decoder = decoder_of(model)
    decoder.layers = torch.nn.ModuleList(layers)
    decoder.config.num_hidden_layers = len(layers)


def tensor_bytes(model, layers: list) -> dict:
    """{"weights" | "lora": {"fixed", "per_layer"}} from the tensors themselves (no RSS):
    frozen = parameters, buffers and 4-bit quant states; trainable = LoRA + tag rows."""
    def count(module) -> tuple[int, int]:
        frozen, trainable, seen = 0, 0, set()
        for tensor in [*module.parameters(), *module.buffers()] + quant_states(module):
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad:
                trainable += tensor.nbytes
            else:
                frozen += tensor.nbytes
        return frozen, trainable

    total = count(model)
    per_layer = [count(layer) for layer in layers]
    assert len({p for p in per_layer}) == 1, "layers of one model differ in size"
    layer = per_layer[0]
    return {"weights": {"fixed": total[0] - len(layers) * layer[0], "per_layer": layer[0]},
            "lora": {"fixed": total[1] - len(layers) * layer[1], "per_layer": layer[1]}}


def quant_states(module) -> list[torch.Tensor]:
    """The tensors of every 4-bit weight's quant state (absmax, nested absmax, code tables)."""
    tensors = []
    for p in module.parameters():
        state = getattr(p, "quant_state", None)
        while state is not None:
            parts = (state.absmax, state.code, getattr(state, "offset", None))
            tensors += [t for t in parts if isinstance(t, torch.Tensor)]
            state = getattr(state, "state2", None)
    return tensors


def adam_bytes(model, layers: list) -> dict:
    """AdamW's state after one real step, fixed and per layer (`make_optimizer`, lr 0); leaves
    every trainable parameter with an allocated (zero) gradient, as after a backward."""
    from nanopar.optim import make_optimizer

    optimizer, _ = make_optimizer(model, lr=0.0)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    in_layer = {id(p) for layer in layers for p in layer.parameters()}
    state = lambda ps: sum(t.nbytes for p in ps for t in optimizer.state[p].values() if t.dim() > 0)  # noqa: E731
    per_layer = state([p for p in params if id(p) in in_layer]) // len(layers)
    return {"fixed": state([p for p in params if id(p) not in in_layer]), "per_layer": per_layer}, optimizer


class SavedCensus:
    """saved_tensors_hooks census: bytes autograd keeps for backward, by dtype, each storage once,
    parameters' storages excluded."""

    def __init__(self, model):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen, self.bytes, self.count = set(), {}, 0

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key not in self.params and key not in self.seen:
            self.seen.add(key)
            self.count += 1
            name = str(t.dtype).replace("torch.", "")
            self.bytes[name] = self.bytes.get(name, 0) + t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def activation_rise(model, tags, tokens: int, rows: int = 1, census: bool = False):
    """Peak rise of the decoder layers' forward + backward on `rows` rows of `tokens` tokens (the
    layout built inside, as the trainer does). The input is the embedding's output, made before:
    the embedding's own transients come before and after the layers' (`embedding_rise`), never
    on top of their activations. -> (bytes, census or None)"""
    from nanopar.layout import build_layout, mask_dtype

    decoder = decoder_of(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tags.block_open, (rows, tokens), generator=g)
    with torch.no_grad():
        embedded = decoder.embed_tokens(ids)
    embedded.requires_grad_()  # as the embedding's output does (its tag rows train)
    dtype = mask_dtype(model)
    record = SavedCensus(model) if census else contextlib.nullcontext()

    def step():
        layout = build_layout(ids, tags, "causal", dtype=dtype)
        with record:
            hidden = decoder(inputs_embeds=embedded, attention_mask=layout.attention_mask,
                             position_ids=layout.position_ids).last_hidden_state  # [rows, T, d]
        hidden.sum().backward()

    rise, _ = peak_rise(step)
    embedded.grad = None
    return rise, (record if census else None)


def embedding_rise(model, tags, tokens: int, train: bool) -> int:
    """Peak rise of the input embedding alone: peft's tag-row wrapper merges the six rows into a
    full copy of the [V, d] matrix in every forward; in backward the gradient of that matrix is
    dense. Forward only (no grad) when not `train`."""
    ids = torch.randint(0, tags.block_open, (1, tokens), generator=torch.Generator().manual_seed(0))
    embed = decoder_of(model).embed_tokens

    def step():
        if train:
            embed(ids).sum().backward()
        else:
            with torch.no_grad():
                embed(ids)

    return peak_rise(step)[0]


def chunked_read(model, tags, hidden: torch.Tensor, chunk: int, vocab: int, entropy: bool = True) -> torch.Tensor:
    """The training read from the final hidden states [b, T, d], as `forward.trace_logprobs` does
    it: the positions gathered into [n, d] (n = b x (T - 1)), then the library's
    `head.head_logprobs` with the model's own head (`decoder_and_head`: the tied output embedding,
    peft's tag-row wrapper around it), `chunk` positions at a time (0 = all n in one chunk), the
    no-grad entropy with it (`with_entropy`). -> a loss to call backward on"""
    from nanopar.head import decoder_and_head, head_logprobs

    b, T, _ = hidden.shape
    targets = torch.randint(0, tags.block_open, (b, T), generator=torch.Generator().manual_seed(1))
    where = torch.ones(b, T - 1, dtype=torch.bool)  # every position read (responses only, in training)
    _, head = decoder_and_head(model)
    chosen, _ = head_logprobs(hidden[:, :-1][where], targets[:, 1:][where], head, 1.0, vocab, entropy,
                              chunk or b * (T - 1))  # [n]
    return -chosen.sum()


def chunk_rise(model, tags, tokens: int, dtype: torch.dtype, vocab: int, entropy: bool = True, chunks: int = 2) -> int:
    """Peak rise of the chunked read of `chunks` chunks of `tokens` positions, forward + backward."""
    d = model.config.hidden_size
    hidden = torch.randn(1, chunks * tokens + 1, d, generator=torch.Generator().manual_seed(0)).to(dtype)
    hidden.requires_grad_()
    rise, _ = peak_rise(lambda: chunked_read(model, tags, hidden, tokens, vocab, entropy).backward())
    return rise


def filled_cache(model, rows: int, width: int, dtype: torch.dtype, layers: int):
    """A LaneCache of `rows` lanes `width` columns wide, lanes of different lengths (so the step
    mask is built, as in real sampling); constant keys and values (fast to write, and written
    pages are resident: their values change no memory). -> LaneCache"""
    from transformers import DynamicCache

    from nanopar.kvcache import LaneCache

    config = model.config
    kv = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    filled = lambda n: torch.full((rows, kv, n, head_dim), 0.01, dtype=dtype)  # noqa: E731  (written: resident)
    cache = DynamicCache(ddp_cache_data=[(filled(1), filled(1))] * layers)
    for layer in cache.layers:  # the full width, without the copy a cache update makes
        layer.keys, layer.values = filled(width), filled(width)
    lens = [width - (r * 7) % max(1, width // 2) for r in range(rows)]  # row 0 is full width
    return LaneCache(cache, lens)


def draw_step(model, tags, logits: torch.Tensor, vocab: int):
    """The sampler's draw at temperature 1, with a ban mask (as once a lane has spent its blocks)."""
    from nanopar.policy import draw

    banned = torch.zeros(logits.shape, dtype=torch.bool)
    banned[:, tags.block_open] = True
    return draw(logits, 1.0, vocab, 0, 1.0, banned, torch.Generator().manual_seed(3))


def step_inputs(model, tags, lanes) -> dict:
    from nanopar.layout import mask_dtype

    rows = len(lanes.lens)
    tokens = torch.randint(0, tags.block_open, (rows, 1), generator=torch.Generator().manual_seed(2))
    return dict(input_ids=tokens, position_ids=torch.tensor([[n] for n in lanes.lens]),
                attention_mask=lanes.step_mask(mask_dtype(model)), cache=lanes.cache, use_cache=True)


@torch.no_grad()
def decode_step(model, tags, lanes, vocab: int):
    """One whole step of `Sampler.run`: every lane fed a token over the cache, then `draw`."""
    logits = model(**step_inputs(model, tags, lanes)).logits[:, -1]  # [N, V]
    lanes.appended()
    return draw_step(model, tags, logits, vocab)


def decode_rise(model, tags, rows: int, width: int, dtype: torch.dtype, layers: int, vocab: int,
                part: str = "all") -> tuple[int, int]:
    """(peak rise of one decode step over a filled cache, the cache's bytes). `part` "layers":
    the decoder layers alone, from the embedded tokens (the embedding's and the head's transients
    come before and after theirs: `embedding_rise`, `head_rise`)."""
    lanes = filled_cache(model, rows, width, dtype, layers)
    cache_bytes = lanes.nbytes()
    if part == "layers":
        inputs = step_inputs(model, tags, lanes)
        with torch.no_grad():
            inputs["inputs_embeds"] = decoder_of(model).embed_tokens(inputs.pop("input_ids"))
        fn = lambda: torch.no_grad()(decoder_of(model))(**inputs)  # noqa: E731
    else:
        fn = lambda: decode_step(model, tags, lanes, vocab)  # noqa: E731
    rise, _ = peak_rise(fn)
    del lanes, fn
    gc.collect()
    return rise, cache_bytes


@torch.no_grad()
def head_rise(model, tags, rows: int, vocab: int, dtype: torch.dtype) -> int:
    """Peak rise of the output embedding + `draw` for `rows` lanes (the end of a decode step)."""
    hidden = torch.randn(rows, 1, model.config.hidden_size, generator=torch.Generator().manual_seed(2)).to(dtype)
    return peak_rise(lambda: draw_step(model, tags, model.get_output_embeddings()(hidden)[:, -1], vocab))[0]


def line_of(at: dict[int, float]) -> dict:
    """{x: y} at two x -> {"fixed", "per_layer"} (intercept, slope)."""
    (x0, y0), (x1, y1) = sorted(at.items())
    slope = (y1 - y0) / (x1 - x0)
    return {"fixed": y0 - x0 * slope, "per_layer": slope}


def measure_chunk(model, tags, dtype: torch.dtype, vocab: int) -> dict:
    """The logits-chunk coefficients: `head_logprobs` (with the entropy) over two chunks of each of
    CHUNKS positions, forward + backward; and without the entropy at the library's chunk."""
    at = {c: chunk_rise(model, tags, c, dtype, vocab) for c in CHUNKS}
    fit = line_of(at)
    return {"const": fit["fixed"], "per_token": fit["per_layer"], "at": at,
            "no_entropy_at_default": chunk_rise(model, tags, CHUNKS[0], dtype, vocab, entropy=False)}


def measure_chunk_only(name: str, dtype: torch.dtype, console, rank: int = 16) -> dict:
    """`--only chunk`: the logits-chunk coefficients alone, on a one-layer build (the read
    never touches the decoder layers) -> {"dtype", "chunk"}"""
    vocab = MODELS[name][7] + 6
    console.print(f"[bold]{name}[/bold] ({dtype}), logits chunks of {CHUNKS} positions")
    with log(f"build 1 layer, 4-bit + LoRA r{rank}", console):
        model, tags = build(name, 1, dtype, rank)
    model.train()
    with log("warm-up", console):
        chunk_rise(model, tags, 64, dtype, vocab)
    with log("chunks", console):
        out = {"dtype": str(dtype).replace("torch.", ""), "chunk": measure_chunk(model, tags, dtype, vocab)}
    del model
    gc.collect()
    return out


def measure_model(name: str, dtype: torch.dtype, T0: int, rows: int, console, rank: int = 16) -> dict:
    """Every coefficient of `predict` for one model, measured (see the module docstring)."""
    from nanopar.model import enable_gradient_checkpointing

    vocab = MODELS[name][7] + 6  # the policy's real vocabulary: tokenizer + the six tags
    console.print(f"[bold]{name}[/bold] ({dtype}, T0 = {T0}, decode rows {rows})")
    with log(f"build {max(BUILT_LAYERS)} layers, 4-bit + LoRA r{rank}", console):
        model, tags = build(name, max(BUILT_LAYERS), dtype, rank)
    built = list(decoder_of(model).layers)
    out = {"dtype": str(dtype).replace("torch.", ""), "T0": T0, "lora_rank": rank,
           "mask_bytes_per_element": torch.finfo(dtype).bits // 8,
           "kv_formula": kv_bytes_per_token_layer(name, torch.finfo(dtype).bits // 8)}
    out |= tensor_bytes(model, built)
    out["adam"], optimizer = adam_bytes(model, built)  # grads now allocated: backward adds none
    model.train()
    with log("warm-up", console):
        use_layers(model, built[:1])
        activation_rise(model, tags, 64)
        chunk_rise(model, tags, 64, dtype, vocab)
    acts, census = {"plain": {}, "checkpointing": {}}, {}
    with log(f"activations at {BUILT_LAYERS} layers, one row of {T0} tokens", console):
        for L in BUILT_LAYERS:
            use_layers(model, built[:L])
            acts["plain"][L], census[L] = activation_rise(model, tags, T0, census=True)
        enable_gradient_checkpointing(model)
        for L in BUILT_LAYERS:
            use_layers(model, built[:L])
            acts["checkpointing"][L], _ = activation_rise(model, tags, T0)
    out["activations"] = {kind: line_of(at) | {"at": at} for kind, at in acts.items()}
    L0, L1 = BUILT_LAYERS
    out["saved_per_layer"] = {k: (census[L1].bytes.get(k, 0) - census[L0].bytes.get(k, 0)) // (L1 - L0)
                              for k in census[L1].bytes}
    out["saved_tensors_per_layer"] = (census[L1].count - census[L0].count) // (L1 - L0)
    with log(f"logits chunks of {CHUNKS} positions, the embedding", console):
        out["chunk"] = measure_chunk(model, tags, dtype, vocab)
        out["embedding_train"] = embedding_rise(model, tags, T0, train=True)
        out["embedding_forward"] = embedding_rise(model, tags, rows, train=False)
    model.eval()
    L = BUILT_LAYERS[0]
    use_layers(model, built[:L])
    with log(f"decode steps over a filled cache ({L} layers)", console):
        decode_rise(model, tags, 8, 64, dtype, L, vocab)  # warm-up
        (r0, cache), (r1, _) = [decode_rise(model, tags, rows, w, dtype, L, vocab, "layers") for w in (T0, T0 // 2)]
        head = {n: head_rise(model, tags, n, vocab, dtype) for n in (rows // 2, rows)}
        whole, _ = decode_rise(model, tags, rows, T0, dtype, L, vocab)
    per_row_column = (r0 - r1) / (rows * (T0 - T0 // 2))
    fit = line_of(head)
    out["decode"] = {"per_row": r0 / rows - per_row_column * T0, "per_row_column": per_row_column,
                     "head_const": fit["fixed"], "head_per_row": fit["per_layer"],
                     "at": {f"layers {rows}x{T0}": r0, f"layers {rows}x{T0 // 2}": r1,
                            **{f"head {n}": r for n, r in head.items()}, f"whole step {rows}x{T0}": whole}}
    out["kv_per_token_layer"] = cache // (rows * T0 * L)
    del model, optimizer, built
    gc.collect()
    return out


def decode_peak(c: dict, rows: int, width: int) -> float:
    """A decode step's peak over the cache: the largest of its phases (the embedding lookup's
    merged matrix, the layers' per-layer K/V copies, the output embedding + draw)."""
    d = c["decode"]
    return max(c["embedding_forward"], rows * (d["per_row"] + d["per_row_column"] * width),
               d["head_const"] + rows * d["head_per_row"])


# --- the full-depth check ----------------------------------------------------------------------
def full_depth_check(dtype: torch.dtype, coefficients: dict, console, rows: int = 2, tokens: int = 512,
                     chunk: int = DEFAULT_CHUNK, decode_rows: int = 32) -> list[tuple[str, int, int]]:
    """Qwen2.5-0.5B at its full 24 layers, measured whole (embedding, layers, chunked read,
    backward; a whole decode step), against `predict` from the 2- and 4-layer coefficients, at a
    shorter length: `rows` rows of `tokens` tokens, `decode_rows` lanes. -> [(what, predicted, measured)]"""
    import psutil

    from nanopar.layout import build_layout, mask_dtype
    from nanopar.model import enable_gradient_checkpointing

    name = "qwen2.5-0.5b"
    depth, vocab = MODELS[name][2], MODELS[name][7] + 6
    gc.collect()
    train_step_module().hand_back_free_memory()
    process = psutil.Process()
    start = process.memory_info().rss
    with log(f"build all {depth} layers", console):
        model, tags = build(name, depth, dtype)
        counted = tensor_bytes(model, list(decoder_of(model).layers))
        adam, optimizer = adam_bytes(model, list(decoder_of(model).layers))  # grads allocated too
    gc.collect()
    train_step_module().hand_back_free_memory()
    static = process.memory_info().rss - start
    prompt, paths, blocks = 64, 2, 4
    new_tokens = tokens - prompt - blocks * (2 * paths + 2)  # rows of exactly `tokens` tokens

    def plan(**kw):
        return predict(name, prompts=1, samples=1, new_tokens=new_tokens, prompt_tokens=prompt, paths=paths,
                       max_blocks=blocks, micro_batch=rows, chunk_tokens=chunk, coefficients=coefficients, **kw)

    p = plan()
    checks = [("weights + LoRA (tensor bytes)", p["weights"] + p["lora"],
               sum(v["fixed"] + depth * v["per_layer"] for v in counted.values())),
              ("AdamW states (tensor bytes)", p["adam"], adam["fixed"] + depth * adam["per_layer"]),
              ("static: weights + LoRA + grads + AdamW (RSS)", p["weights"] + p["lora"] + p["grads"] + p["adam"],
               static)]
    ids = torch.randint(0, tags.block_open, (rows, tokens), generator=torch.Generator().manual_seed(0))
    decoder = decoder_of(model)
    model.train()

    def step():
        layout = build_layout(ids, tags, "causal", dtype=mask_dtype(model))
        hidden = decoder(input_ids=ids, attention_mask=layout.attention_mask,
                         position_ids=layout.position_ids).last_hidden_state
        chunked_read(model, tags, hidden, chunk, vocab).backward()

    for ckpt in (False, True):
        if ckpt:
            enable_gradient_checkpointing(model)
        with log(f"training micro-step, {rows} rows x {tokens} tokens, chunks of {chunk}, checkpointing {ckpt}",
                 console):
            rise, _ = peak_rise(step)
        q = plan(checkpointing=ckpt)
        label = "with" if ckpt else "without"
        checks.append((f"train step rise {label} checkpointing", q["activations"] + q["logits_chunk"], rise))
        checks.append((f"training peak {label} checkpointing (RSS)", q["training_peak"], static + rise))
    model.eval()
    with log(f"decode step, {decode_rows} lanes x {tokens} columns", console):
        rise, cache = decode_rise(model, tags, decode_rows, tokens, dtype, depth, vocab)
    kv = coefficients["kv_per_token_layer"] * depth * decode_rows * tokens
    checks += [("KV cache (tensor bytes)", kv, cache),
               ("decode step rise", int(decode_peak(coefficients, decode_rows, tokens)), rise)]
    del model, optimizer
    gc.collect()
    return checks


# --- the tables ------------------------------------------------------------------------------
@dataclass
class PlanConfig:
    model: str = "all"  # qwen2.5-0.5b | qwen2.5-1.5b | qwen3-0.6b | qwen3-1.7b | all
    prompts: int = 8  # B: prompts per GRPO step (train.py --prompts-per-step)
    samples: int = 8  # G: samples per prompt (train.py --group-size)
    new_tokens: int = 1024  # sampled tokens per response (train.py --max-new-tokens)
    prompt_tokens: int = 320  # the longest prompt of a step (GSM8K + parallel instructions + chat template: 234-399, median 268)
    paths: int = 2  # K: paths per block; the KV-cache bound is B x G x K rows (train.py --paths)
    max_blocks: int = 4  # blocks per response: inserted tags add max_blocks x (2K + 2) tokens to a row
    micro_batch: int = 2  # rows per forward/backward (train.py --micro-batch)
    checkpointing: bool = True  # gradient checkpointing (train.py --gradient-checkpointing)
    chunk_tokens: int = DEFAULT_CHUNK  # positions per logits chunk of head_logprobs (default: the library's, 128 MiB of float32 logits); 0 = the read before head.py (whole micro-batch)
    only: str = ""  # with --measure: "chunk" = re-measure the logits-chunk coefficients alone (1-layer builds, ~1 min per model), the rest stored
    lora_rank: int = 16  # LoRA r (the plan scales the measured r = 16 adapters)
    measure: bool = True  # measure on this CPU (a few minutes per model); --no-measure: the coefficients stored in this file
    dtype: str = "bfloat16"  # dtype of the CPU measurement: bfloat16 (the GPU's compute dtype) or float32 (nanopar's CPU path)
    check: bool = True  # with --measure: also the full-depth check (Qwen2.5-0.5B, all 24 layers, ~2 min)
    gpus: tuple[int, ...] = (12, 24)  # GPU sizes (GiB) to recommend settings for


def fits(total: int, gib: int) -> bool:
    """The rule of thumb the recommendations use: 1 GiB for the CUDA context and cuBLAS
    workspace, then 10% for the caching allocator's fragmentation."""
    return total * 1.1 + GiB <= gib * GiB


def recommend(name: str, gib: int, args: PlanConfig, coefficients: dict) -> dict | None:
    """The largest prompts (G fixed) whose sampling fits, then the largest micro-batch whose
    training fits, preferring no checkpointing when it fits with a micro-batch >= 2."""
    base = dict(samples=args.samples, new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                paths=args.paths, max_blocks=args.max_blocks, chunk_tokens=args.chunk_tokens,
                lora_rank=args.lora_rank, coefficients=coefficients)
    prompts = next((b for b in (args.prompts, 4, 2, 1) if b <= args.prompts
                    and fits(predict(name, prompts=b, **base)["sampling_peak"], gib)), None)
    if prompts is None:
        return None
    rows = prompts * args.samples
    for ckpt in (False, True):
        peak = {m: predict(name, prompts=prompts, micro_batch=m, checkpointing=ckpt, **base)
                for m in (16, 8, 4, 2, 1) if m <= rows}
        micro = [m for m, p in peak.items() if fits(p["training_peak"], gib)]
        if micro and (micro[0] >= 2 or ckpt):
            p = peak[micro[0]]
            return dict(prompts=prompts, micro_batch=micro[0], checkpointing=ckpt, sampling=p["sampling_peak"],
                        training=p["training_peak"])
    return None


def main(argv=None):
    from rich.console import Console

    from nanopar.config import parse_config

    args = parse_config(PlanConfig, argv, description=__doc__.splitlines()[0])
    names = list(MODELS) if args.model == "all" else [args.model]
    if any(n not in MODELS for n in names):
        raise SystemExit(f"bench/memory_plan.py: unknown model {args.model!r}: use {' | '.join(MODELS)} | all")
    console = Console(width=160)
    T = sequence_tokens(args.prompt_tokens, args.new_tokens, args.paths, args.max_blocks)
    coefficients = {}
    checks = []
    if args.measure:
        fix_mmap_threshold()
        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
        console.print(f"measuring on CPU ({torch.get_num_threads()} threads, torch {torch.__version__}), "
                      f"load average before: {os.getloadavg()}")
        started = time.perf_counter()
        rows = args.prompts * args.samples * args.paths  # the decode step's lanes: the cache bound's rows
        if args.only not in ("", "chunk"):
            raise SystemExit(f"bench/memory_plan.py: unknown --only {args.only!r}: use chunk")
        if args.only == "chunk":
            measured = {n: measure_chunk_only(n, dtype, console, args.lora_rank) for n in names}
            console.print(f"measured in {time.perf_counter() - started:.0f} s; load average after: {os.getloadavg()}")
            console.print("logits-chunk coefficients (paste into STORED[name]['chunk']):")
            print(pprint.pformat(rounded(measured), width=120, sort_dicts=False))
            if args.dtype != "bfloat16":  # the stored plan is bfloat16's: print it, without mixing in
                return
            coefficients = {n: STORED[n] | {"chunk": measured[n]["chunk"]} for n in names}
            print_tables(console, args, names, coefficients, T, [])
            return
        for name in names:
            coefficients[name] = measure_model(name, dtype, T, rows, console, args.lora_rank)
        if args.check:
            console.print("[bold]full-depth check[/bold] qwen2.5-0.5b")
            reference = coefficients.get("qwen2.5-0.5b") or measure_model("qwen2.5-0.5b", dtype, T, rows, console)
            checks = full_depth_check(dtype, reference, console)
        console.print(f"measured in {time.perf_counter() - started:.0f} s; load average after: {os.getloadavg()}")
        console.print("coefficients (paste into STORED to update the stored plan):")
        print(pprint.pformat(rounded(coefficients), width=120, sort_dicts=False))
    else:
        missing = [n for n in names if n not in STORED]
        if missing:
            raise SystemExit(f"bench/memory_plan.py: no stored coefficients for {', '.join(missing)}: "
                             "run with --measure")
        coefficients = {n: STORED[n] for n in names}
    print_tables(console, args, names, coefficients, T, checks)


def rounded(value):
    """Floats of a coefficients dict rounded to whole bytes (fits slopes: a byte is their noise)."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return round(value) if isinstance(value, float) else value


def mb(n: float) -> str:
    return f"{n / MiB:,.0f}"


def gb(n: float) -> str:
    return f"{n / GiB:.2f}"


def print_tables(console, args: PlanConfig, names, coefficients, T, checks):
    from rich.table import Table

    c = coefficients
    settings = dict(prompts=args.prompts, samples=args.samples, new_tokens=args.new_tokens,
                    prompt_tokens=args.prompt_tokens, paths=args.paths, max_blocks=args.max_blocks,
                    micro_batch=args.micro_batch, chunk_tokens=args.chunk_tokens, lora_rank=args.lora_rank)
    dtypes = "/".join(sorted({c[n]["dtype"] for n in names}))
    plan = {n: predict(n, checkpointing=args.checkpointing, coefficients=c[n], **settings) for n in names}
    other = {n: predict(n, checkpointing=not args.checkpointing, coefficients=c[n], **settings) for n in names}
    rows, bound = args.prompts * args.samples, args.prompts * args.samples * args.paths
    b = args.micro_batch
    chunk = (f"{min(args.chunk_tokens, b * (T - 1)):,} positions (head_logprobs)" if args.chunk_tokens
             else f"{b} x {T - 1:,} tokens, the full logits (before head.py)")
    ckpt, not_ckpt = ("with", "without") if args.checkpointing else ("without", "with")

    def table(title, first, last):
        t = Table(title=title)
        t.add_column(first)
        for n in names:
            t.add_column(n, justify="right")
        t.add_column(last)
        return t

    main = table(f"predicted peak GPU memory, GiB: {args.prompts} prompts x {args.samples} samples x "
                 f"{args.new_tokens:,} new tokens (rows of {T:,} tokens), 4-bit NF4 + LoRA r{args.lora_rank} + "
                 f"tag rows, micro-batch {b}; measured in {dtypes}", "component", "what")
    lines = [
        ("weights", "weights", "NF4 layers + bf16 embedding (tied), norms, biases"),
        ("LoRA + tag rows", "lora", "float32 parameters"),
        ("AdamW states", "adam", "exp_avg + exp_avg_sq, float32"),
        (f"KV cache, {bound} rows (bound)", "kv_cache", f"every response inside a {args.paths}-path block"),
        (f"  KV cache, {rows} rows (no fork)", "kv_cache_no_fork", "not in the total"),
        ("decode step", "decode_step", f"{bound} rows; its largest phase (embedding, layers, head + draw)"),
        ("[bold]sampling peak[/bold]", "sampling_peak", ""),
        ("LoRA grads", "grads", "float32, alive over the micro-batches"),
        (f"activations, {ckpt} checkpointing", "activations", f"{b} row{'s' * (b != 1)}"),
        ("logits chunk", "logits_chunk", chunk),
        (f"[bold]training peak[/bold], {ckpt} checkpointing", "training_peak", ""),
    ]
    for label, key, what in lines:
        main.add_row(label, *[gb(plan[n][key]) for n in names], what,
                     end_section=key in ("decode_step", "sampling_peak", "training_peak"))
    for key in ("activations", "training_peak"):
        main.add_row(f"  {key.replace('_', ' ')}, {not_ckpt} checkpointing", *[gb(other[n][key]) for n in names], "")
    console.print(main)

    measured = table(f"measured on this CPU ({dtypes}), MiB: per decoder layer (slope between {BUILT_LAYERS[0]} and "
                     f"{BUILT_LAYERS[1]} layers) and the rest (intercept); one row of T0 tokens", "quantity", "how")
    act = lambda x, kind, key: x["activations"][kind][key]  # noqa: E731
    saved = lambda x, dtype: mb(x["saved_per_layer"].get(dtype, 0))  # noqa: E731
    quantities = [
        ("weights per layer / rest", lambda x: f"{mb(x['weights']['per_layer'])} / {mb(x['weights']['fixed'])}",
         "tensor bytes"),
        ("LoRA per layer (MiB) / tag rows (KiB)",
         lambda x: f"{x['lora']['per_layer'] / MiB:.2f} / {x['lora']['fixed'] / 1024:.0f}", "tensor bytes"),
        ("KV per token per layer (bytes)", lambda x: f"{x['kv_per_token_layer']:,} ({x['kv_formula']:,})",
         "filled cache (formula)"),
        ("activations per layer per row", lambda x: mb(act(x, "plain", "per_layer")), "RSS"),
        ("  intercept", lambda x: mb(act(x, "plain", "fixed")), ""),
        ("  saved per layer: tensors, bf16 + fp32 MiB",
         lambda x: f"{x['saved_tensors_per_layer']}: {saved(x, 'bfloat16')} + {saved(x, 'float32')}",
         "autograd census"),
        ("  with checkpointing, per layer per row",
         lambda x: f"{act(x, 'checkpointing', 'per_layer') / MiB:.1f}", "RSS"),
        ("  intercept", lambda x: mb(act(x, "checkpointing", "fixed")), "one layer recomputed"),
        (f"logits chunk: const + per {CHUNKS[0]} positions",
         lambda x: f"{mb(x['chunk']['const'])} + {mb(CHUNKS[0] * x['chunk']['per_token'])}",
         f"RSS, head_logprobs at {CHUNKS}"),
        (f"  {CHUNKS[0]} positions without the entropy", lambda x: mb(x["chunk"]["no_entropy_at_default"]),
         "with_entropy=False"),
        ("embedding: forward / forward + backward",
         lambda x: f"{mb(x['embedding_forward'])} / {mb(x['embedding_train'])}", "merged [V, d] copy; dense grad"),
        ("decode layers: per row + per row x 1k columns",
         lambda x: f"{x['decode']['per_row'] / MiB:.2f} + {1000 * x['decode']['per_row_column'] / MiB:.2f}",
         "RSS, 2 widths"),
        ("decode head + draw: const + per row",
         lambda x: f"{mb(x['decode']['head_const'])} + {x['decode']['head_per_row'] / MiB:.2f}", "RSS, 2 row counts"),
        ("T0 (tokens per row measured)", lambda x: f"{x['T0']:,}", ""),
    ]
    for label, fn, how in quantities:
        measured.add_row(label, *[fn(c[n]) for n in names], how)
    console.print(measured)

    if checks:
        check = Table(title="full-depth check: Qwen2.5-0.5B, all 24 layers, on this CPU, against the plan "
                            f"from {BUILT_LAYERS[0]} and {BUILT_LAYERS[1]} layers (MiB)")
        for column in ("what", "predicted", "measured", "measured / predicted"):
            check.add_column(column, justify="left" if column == "what" else "right")
        for what, predicted, value in checks:
            check.add_row(what, mb(predicted), mb(value), f"{value / predicted:.2f}")
        console.print(check)

    advice = Table(title=f"recommended settings (fits: peak x 1.1 + 1 GiB <= GPU; G = {args.samples}; "
                         f"--micro-batch-tokens = micro-batch x {T:,}, the longest row: the same bound, "
                         "more rows when rows are shorter; "
                         f"logits chunks of {args.chunk_tokens or 'a whole micro-batch'} positions)")
    for column in ("model", "GPU", "--prompts-per-step", "--micro-batch", "or --micro-batch-tokens",
                   "--gradient-checkpointing", "sampling GiB", "training GiB"):
        advice.add_column(column)
    for n in names:
        for gib in args.gpus:
            r = recommend(n, gib, args, c[n])
            if r is None:
                advice.add_row(n, f"{gib} GiB", "does not fit", "", "", "", "", "")
            else:
                advice.add_row(n, f"{gib} GiB", str(r["prompts"]), str(r["micro_batch"]), f"{r['micro_batch'] * T:,}",
                               "yes" if r["checkpointing"] else "no", gb(r["sampling"]), gb(r["training"]))
    console.print(advice)


if __name__ == "__main__":
    main()
