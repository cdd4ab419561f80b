"""Measure the coefficients of bench/memory_plan.py on this CPU and write memory_coefficients.json.

    python bench/memory_measure.py              # every model (minutes of CPU each), then the plan
    python bench/memory_measure.py --only chunk # the logits-chunk coefficients alone, the rest kept
    python bench/memory_measure.py --model qwen2.5-0.5b --no-check
    python bench/memory_measure.py --only sequence --dtype float32   # phases as a user's run meets them

Each coefficient is measured at the real layer shapes on a randomly initialised model of the real
config (no download), built as `load_model` builds it: saved, reloaded 4-bit NF4 with double
quantisation (`_model_kwargs`), `disable_bnb_cpu_repack`, LoRA on the seven projections + the six
tag rows (`apply_lora`). Only 2 and 4 decoder layers are built: the per-layer slope and the rest
(`--check`: the plan against one full-depth Qwen2.5-0.5B, measured whole).

  weights       bytes of every parameter, buffer and 4-bit quant state (packed NF4, 8-bit absmax,
                float32 second-level absmax; embedding, norms, biases in the compute dtype), per
                layer and the rest (the tied 151,936 x d embedding)
  LoRA, AdamW   the trainable tensors (float32: peft keeps adapters in float32 over a bf16 base)
                and AdamW's exp_avg / exp_avg_sq after one real step; grads the size of LoRA
  KV cache      bytes per token per layer of a filled cache (= 2 x kv_heads x head_dim x bytes)
  decode step   one sampler step over a filled cache (every lane fed a token with the padding
                mask, then `draw` at temperature 1 with a ban mask), in its phases measured apart:
                the embedding lookup (the tag rows read row by row: nanopar/tag_rows.py), the
                layers (at two widths: a layer's new K/V while the old exist), the output embedding
                + draw (at two row counts: [N, V] float32 buffers)
  activations   forward + backward of the decoder layers (from the embedding's output; the layout
                mask built inside, as the trainer does) on one row of T0 tokens, with and without
                `enable_gradient_checkpointing`, at 2 and 4 layers: slope per layer and intercept.
                Beside it, a census of the tensors autograd saves (saved_tensors_hooks), by dtype
  logits chunk  the chunked training read (`chunked_read`: the library's `head.head_logprobs` with
                the model's head from `decoder_and_head`, with the entropy, forward + backward) over
                two chunks of the library's default chunk (221 positions on Qwen's vocabulary) and
                of twice it: a line between them
  embedding     the input embedding's forward + backward alone (row by row: no [V, d] copy or gradient,
                which peft's own forward of the tag rows makes)

`--only sequence` measures no coefficient: two GRPO steps (`sample`, then `grpo_update`) and an
evaluation's sampling, on Qwen2.5-0.5B's shape, in the order a run meets them, three ways side by
side: nothing freed by hand between phases (a user's run), `gc.collect()` after each (as the
coefficients are measured), and each sampler call's lane cache held in a reference cycle (what
only the cyclic collector frees). The first and second agree only when nothing of a phase
outlives it by a cycle; the third shows what such a cycle would keep.

Each is a peak rise of the resident set (bench/common.py; glibc's mmap threshold fixed at 64 KiB
so that freed tensors leave the resident set as they leave a GPU allocator), or tensor bytes where
they are exact. Measured in bfloat16 by default, the GPU's compute dtype: bitsandbytes runs NF4
with bf16 compute on this CPU (nanopar refuses that combination for training,
`resolve_device_and_dtype`, because its results are unverified there; its memory is what is
measured here); `--dtype float32` measures nanopar's own CPU path and prints it without writing.
Not here: the plan and its tables (memory_plan.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import tempfile
import time
from dataclasses import dataclass

import torch

from common import PeakRSS, hand_back_free_memory, peak_rise
from memory_plan import (BUILT_LAYERS, CHUNKS, COEFFICIENTS, DEFAULT_CHUNK, MODELS, STORED, PlanConfig,
                         decode_peak, model_names, predict, print_tables, sequence_tokens)

VOCAB = 151936  # embedding rows of every Qwen2.5 / Qwen3 model


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


# --- measuring -------------------------------------------------------------------------------
def fix_mmap_threshold(threshold: int = 64 * 1024) -> None:
    """Large blocks straight from mmap, returned on free (glibc's threshold otherwise grows after
    each free up to 32 MiB and freed tensors stay resident): the RSS then follows live tensors."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-3, threshold)  # M_MMAP_THRESHOLD


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
    """Peak rise of the input embedding alone, its tag rows read row by row (nanopar/tag_rows.py;
    peft's own forward would copy the whole [V, d] matrix and make a dense [V, d] gradient).
    Forward only (no grad) when not `train`."""
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
    peft's tag-row wrapper around it, read row by row), `chunk` positions at a time (0 = all n in one chunk), the
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
    hand_back_free_memory()
    process = psutil.Process()
    start = process.memory_info().rss
    with log(f"build all {depth} layers", console):
        model, tags = build(name, depth, dtype)
        counted = tensor_bytes(model, list(decoder_of(model).layers))
        adam, optimizer = adam_bytes(model, list(decoder_of(model).layers))  # grads allocated too
    gc.collect()
    hand_back_free_memory()
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


# --- phases as a user's run meets them ---------------------------------------------------------
def run_sequence(model, tags, vocab: int, console, lanes: int, prompt: int, new: int, between: str
                 ) -> list[tuple[str, int, int, int]]:
    """A GRPO step's two phases twice, then an evaluation's sampling, as the runner calls them:
    `sample` then `grpo_update` (nanopar's own), nothing freed by hand between them. `between`:
    "nothing" (a user's run), "gc.collect" (the cyclic collector run after each phase, as the
    coefficients above are measured), or "a cycle" (each sampler call's lane cache kept in a
    reference cycle, as the lazy cache's layers held it before they pointed back weakly: what the
    collector alone would free). -> [(phase, peak rise over the start, resident after it, lane
    caches still alive after it)]"""
    import weakref

    from nanopar.grpo import GRPOSettings, grpo_update
    from nanopar.kvcache import LazyLaneCache
    from nanopar.policy import Policy
    from nanopar.sampler import SamplerSettings, sample

    alive = []  # weak references to every lane cache a sampler call made

    class Watched(LazyLaneCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            alive.append(weakref.ref(self))
            if between == "a cycle":
                self.cache.lanes = self  # the cache object the model holds points back at its lanes

    policy = Policy(tags, "structured", 1.0, vocab)
    settings = SamplerSettings(paths=2, max_new_tokens=new, max_path_tokens=new, seed=0)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, tags.block_open, (prompt,), generator=generator).tolist() for _ in range(lanes // 8)]
    grpo = GRPOSettings(group_size=8, micro_batch=2)
    start = psutil_rss()
    rows = []

    def phase(name: str, fn):
        with PeakRSS() as watch:
            result = fn()
        if between == "gc.collect":
            gc.collect()
        rows.append((name, watch.peak - start, psutil_rss() - start, sum(ref() is not None for ref in alive)))
        console.print(f"  {between}: {name}: peak +{rows[-1][1] / 2**20:.0f} MiB, after +{rows[-1][2] / 2**20:.0f} MiB, "
                      f"lane caches alive {rows[-1][3]} (load {os.getloadavg()[0]:.2f})")
        return result

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    for step in (1, 2):
        rollouts = phase(f"step {step}: sampling", lambda: sample(model, prompts, policy, settings, [], 8, Watched))
        advantages = torch.zeros(len(rollouts))  # one group of 8 with signal: the update reads its rows only
        advantages[:8] = torch.tensor([1.0, -1.0] * 4)
        phase(f"step {step}: training read + update",
              lambda: grpo_update(model, optimizer, rollouts, advantages, policy, grpo, 0))
        del rollouts
    phase("evaluation: sampling", lambda: sample(model, prompts * 8, policy, settings, [], 1, Watched))
    return rows


def psutil_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def measure_sequence(dtype: torch.dtype, console, lanes: int = 64, prompt: int = 400, new: int = 64,
                     layers: int | None = None) -> dict:
    """`run_sequence` three ways on Qwen2.5-0.5B's shape (all its layers unless `layers`), each on a
    model built anew. -> {way: rows}"""
    name = "qwen2.5-0.5b"
    vocab = MODELS[name][7] + 6
    out = {}
    for between in ("nothing", "gc.collect", "a cycle"):
        gc.collect()
        hand_back_free_memory()
        with log(f"{between}: build {layers or MODELS[name][2]} layers", console):
            model, tags = build(name, layers or MODELS[name][2], dtype)
        model.train()
        with log(f"{between}: two GRPO steps of {lanes} lanes x {prompt} + {new} tokens, then an evaluation", console):
            out[between] = run_sequence(model, tags, vocab, console, lanes, prompt, new, between)
        del model
    gc.collect()
    return out


def print_sequence(console, measured: dict) -> None:
    from rich.table import Table

    table = Table(title="Phases as a user's run meets them (peak / resident after, MiB over the start; lane caches alive)")
    table.add_column("phase")
    for way in measured:
        table.add_column(f"between phases: {way}", justify="right")
    for i, (name, *_) in enumerate(next(iter(measured.values()))):
        table.add_row(name, *[f"{rows[i][1] / 2**20:,.0f} / {rows[i][2] / 2**20:,.0f} ({rows[i][3]})"
                              for rows in measured.values()])
    console.print(table)


# --- the command ---------------------------------------------------------------------------------
@dataclass
class MeasureConfig(PlanConfig):
    only: str = ""  # "chunk" = re-measure the logits-chunk coefficients alone (1-layer builds), the rest kept; "sequence" = the phases as a user's run meets them (nothing written)
    sequence_layers: int = 0  # --only sequence: decoder layers built (0 = all of Qwen2.5-0.5B's 24)
    dtype: str = "bfloat16"  # dtype of the CPU measurement: bfloat16 (the GPU's compute dtype) or float32 (nanopar's CPU path)
    check: bool = True  # also the full-depth check (Qwen2.5-0.5B, all 24 layers)


def main(argv=None):
    from rich.console import Console

    from nanopar.config import parse_config

    args = parse_config(MeasureConfig, argv, description=__doc__.splitlines()[0])
    names = model_names(args.model)
    if args.only not in ("", "chunk", "sequence"):
        raise SystemExit(f"bench/memory_measure.py: unknown --only {args.only!r}: use chunk or sequence")
    if args.dtype not in ("bfloat16", "float32"):
        raise SystemExit(f"bench/memory_measure.py: unknown --dtype {args.dtype!r}: use bfloat16 or float32")
    console = Console(width=160)
    T = sequence_tokens(args.prompt_tokens, args.new_tokens, args.paths, args.max_blocks)
    fix_mmap_threshold()
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    console.print(f"measuring on CPU ({torch.get_num_threads()} threads, torch {torch.__version__}), "
                  f"load average before: {os.getloadavg()}")
    started = time.perf_counter()
    checks = []
    if args.only == "sequence":
        print_sequence(console, measure_sequence(dtype, console, layers=args.sequence_layers or None))
        console.print(f"measured in {time.perf_counter() - started:.0f} s; load average after: {os.getloadavg()}")
        return
    if args.only == "chunk":
        measured = {n: STORED["models"][n] | {"chunk": measure_chunk_only(n, dtype, console, args.lora_rank)["chunk"]}
                    for n in names}
    else:
        rows = args.prompts * args.samples * args.paths  # the decode step's lanes: the cache bound's rows
        measured = {n: measure_model(n, dtype, T, rows, console, args.lora_rank) for n in names}
        if args.check:
            console.print("[bold]full-depth check[/bold] qwen2.5-0.5b")
            reference = measured.get("qwen2.5-0.5b") or measure_model("qwen2.5-0.5b", dtype, T, rows, console)
            checks = full_depth_check(dtype, reference, console)
    console.print(f"measured in {time.perf_counter() - started:.0f} s; load average after: {os.getloadavg()}")
    measured = rounded(measured)
    if args.dtype == "bfloat16":  # the stored plan is the GPU's: bfloat16 only, never mixed with float32
        write_coefficients(measured)
        console.print(f"coefficients written to {COEFFICIENTS}")
    else:
        console.print(json.dumps(measured, indent=1))
    print_tables(console, args, names, measured, T, checks)


def write_coefficients(measured: dict, path=COEFFICIENTS) -> None:
    """The stored coefficients with `measured`'s models replaced (the others and the plain read's kept)."""
    stored = json.loads(path.read_text())
    stored["models"] |= measured
    path.write_text(json.dumps(stored, indent=1) + "\n")


def rounded(value):
    """Floats of a coefficients dict rounded to whole bytes (fits slopes: a byte is their noise)."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return round(value) if isinstance(value, float) else value


if __name__ == "__main__":
    main()
