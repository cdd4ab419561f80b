"""The GPU memory of a GRPO step on real Qwen models: the plan, and the measurement of its coefficients.

    python bench/memory.py                      # the plan for every model, and the flags that fit 12 and 24 GiB
    python bench/memory.py --model qwen3-0.6b --prompts 4 --micro-batch 4
    python bench/memory.py --measure            # measure the coefficients on this CPU (long), then the plan
    from memory import predict                  # with bench/ on sys.path: bytes of each component

The plan: the peak of each half of a GRPO step (4-bit NF4 + LoRA + the six tag rows), linear in the depth, the rows
and their length, from coefficients measured on a CPU (docs/memory_coefficients.json):
    sampling = weights + LoRA + AdamW states + KV cache (B x G x K rows: the bound) + one decode step
    training = weights + LoRA + AdamW states + LoRA grads + max(activations + logits chunk, embedding)
--measure: random models of the published configs (no download) at 2 and 4 layers, in bfloat16 (bench/README.md
says how). Not in the plan: the CUDA context and fragmentation (the recommendations allow 1 GiB + 10%), a KL
reference, GPU-only attention kernels. Not here: a GPU run (bench/gpu_check.py).
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
from pathlib import Path

import torch
from transformers import DynamicCache

from common import peak_rise
from nanopar.draw_in_place import draw  # the sampler's draw
from nanopar.head import CHUNK_BYTES, decoder_and_head, head_logprobs
from nanopar.kvcache import LaneCache
from nanopar.layout import build_layout, mask_dtype
from nanopar.sampler import SamplerSettings

GiB = 2**30
# The published configs (config.json of each hub repo), written out: no download here.
MODELS = {
    #                 arch     hidden layers heads kv head_dim  mlp   tokenizer (len, before the 6 tags)
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, 64, 4864, 151665),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, 128, 8960, 151665),
    "qwen3-0.6b": ("qwen3", 1024, 28, 16, 8, 128, 3072, 151669),
    "qwen3-1.7b": ("qwen3", 2048, 28, 16, 8, 128, 6144, 151669),
}  # all four tie the input and output embeddings (tie_word_embeddings: true)
VOCAB = 151936  # embedding rows of every Qwen2.5 / Qwen3 model
BUILT_LAYERS = (2, 4)  # depths measured; the plan is linear in between and beyond
COEFFICIENTS = Path(__file__).resolve().parent.parent / "docs" / "memory_coefficients.json"  # written by --measure
# the library's default chunk on Qwen's real vocabulary (tokenizer + the six tags): 221 positions
DEFAULT_CHUNK = min(max(1, CHUNK_BYTES // (4 * (spec[7] + 6))) for spec in MODELS.values())
CHUNKS = (DEFAULT_CHUNK, 2 * DEFAULT_CHUNK)  # logits-chunk sizes measured (positions), two chunks each
DTYPE = torch.bfloat16  # of the measurement: the GPU's compute dtype
# {"plain_read_per_token": {model: bytes}, "models": {model: coefficients}}, numeric keys (tokens, layers) as ints
STORED = json.loads(COEFFICIENTS.read_text(), object_pairs_hook=lambda kv: {int(k) if k.isdigit() else k: v for k, v in kv})


# --- the plan ----------------------------------------------------------------------------------
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
    chunk_tokens: int = DEFAULT_CHUNK  # positions per logits chunk of head_logprobs (default: the library's, 128 MiB of float32 logits); 0 = the plain read (whole micro-batch)
    lora_rank: int = 16  # LoRA r (the plan scales the measured r = 16 adapters)
    gpus: tuple[int, ...] = (12, 24)  # GPU sizes (GiB) to recommend settings for
    measure: bool = False  # first measure --model's coefficients on this CPU (rows of the longest row, B x G x K decode lanes) and write them

    def longest_row(self) -> int:
        """Tokens of the longest row: the sampler's own bound."""
        settings = SamplerSettings(paths=self.paths, max_new_tokens=self.new_tokens, max_blocks=self.max_blocks)
        return settings.longest_row(self.prompt_tokens)


def predict(model_name: str, layers: int | None = None, coefficients: dict | None = None, **setting) -> dict[str, int]:
    """Bytes of each component of one GRPO step and its two peaks, sampling_peak and training_peak. setting:
    PlanConfig's fields (its defaults for the rest); layers None: the model's; coefficients None: the stored."""
    s = PlanConfig(**setting)
    c = coefficients if coefficients is not None else STORED["models"][model_name]
    depth = layers or MODELS[model_name][2]
    T = s.longest_row()
    rank = s.lora_rank / c["lora_rank"]
    weights = c["weights"]["fixed"] + depth * c["weights"]["per_layer"]
    lora = c["lora"]["fixed"] + depth * c["lora"]["per_layer"] * rank  # tag rows do not scale with r
    adam = c["adam"]["fixed"] + depth * c["adam"]["per_layer"] * rank
    rows_no_fork, rows = s.prompts * s.samples, s.prompts * s.samples * s.paths  # rows: every response in a block, the bound
    kv = c["kv_per_token_layer"] * depth * T  # one row's cache
    a = c["activations"]["checkpointing" if s.checkpointing else "plain"]
    mask = c["mask_bytes_per_element"]
    per_row = (a["fixed"] + depth * a["per_layer"] - mask * c["T0"] ** 2) * T / c["T0"] + mask * T**2
    read = s.micro_batch * (T - 1)  # tokens a micro-batch reads; a chunk holds at most these
    chunk, largest = min(s.chunk_tokens, read), max(c["chunk"]["at"])  # largest: of the two chunk sizes measured
    if not s.chunk_tokens:  # the plain read: [b, T, V] logits, float32 log-softmax and their gradients at once
        logits = read * STORED["plain_read_per_token"][model_name]
    elif chunk >= largest:  # past the measured sizes: proportional to the largest (conservative: scales the intercept)
        logits = c["chunk"]["at"][largest] * chunk / largest
    else:  # the line through the two measured sizes, at least 0
        logits = max(0.0, c["chunk"]["const"] + chunk * c["chunk"]["per_token"])
    d = c["decode"]  # a decode step's largest phase: the embedding lookup, the layers (new K/V beside the old), head + draw
    decode = max(c["embedding_forward"], rows * (d["per_row"] + d["per_row_column"] * T),
                 d["head_const"] + rows * d["head_per_row"])
    out = dict(weights=weights, lora=lora, adam=adam, grads=lora, kv_cache=kv * rows, kv_cache_no_fork=kv * rows_no_fork,
               decode_step=decode, activations=s.micro_batch * per_row, logits_chunk=logits)
    out = {k: int(v) for k, v in out.items()}
    out["sampling_peak"] = out["weights"] + out["lora"] + out["adam"] + out["kv_cache"] + out["decode_step"]
    out["training_peak"] = (out["weights"] + out["lora"] + out["adam"] + out["grads"]
                            + max(out["activations"] + out["logits_chunk"], int(c["embedding_train"])))
    return out


def fits(total: int, gib: int) -> bool:
    """The recommendations' rule: 1 GiB for the CUDA context and cuBLAS workspace, 10% for fragmentation."""
    return total * 1.1 + GiB <= gib * GiB


def recommend(name: str, gib: int, args: PlanConfig, coefficients: dict) -> dict | None:
    """The largest prompts (G fixed) whose sampling fits, then the largest micro-batch whose training fits,
    preferring no checkpointing when it fits with a micro-batch >= 2. None: nothing fits."""
    prompts = next((b for b in (args.prompts, 4, 2, 1) if b <= args.prompts and
                    fits(predict(name, coefficients=coefficients, **vars(args) | {"prompts": b})["sampling_peak"], gib)), None)
    for ckpt in (False, True) if prompts else ():
        peak = {m: predict(name, coefficients=coefficients, **vars(args) | dict(prompts=prompts, micro_batch=m, checkpointing=ckpt))
                for m in (16, 8, 4, 2, 1) if m <= prompts * args.samples}
        micro = [m for m, p in peak.items() if fits(p["training_peak"], gib)]
        if micro and (micro[0] >= 2 or ckpt):
            p = peak[micro[0]]
            return dict(prompts=prompts, micro_batch=micro[0], checkpointing=ckpt, sampling=p["sampling_peak"],
                        training=p["training_peak"])
    return None


def print_plan(args: PlanConfig, coefficients: dict) -> None:
    """The plan's components for each model of `coefficients` (GiB), then the flags that fit each of `args.gpus`."""
    T = args.longest_row()
    plan = {ck: {n: predict(n, coefficients=c, **vars(args) | {"checkpointing": ck}) for n, c in coefficients.items()}
            for ck in (True, False)}
    rows, bound, b, on = args.prompts * args.samples, args.prompts * args.samples * args.paths, args.micro_batch, args.checkpointing
    said = {True: "with checkpointing", False: "without checkpointing"}
    chunk = f"{min(args.chunk_tokens, b * (T - 1)):,} positions" if args.chunk_tokens else f"the plain read, {b} x {T - 1:,} tokens"
    lines = [("weights: NF4 layers, bf16 embedding (tied), norms, biases", "weights", on),
             ("LoRA + tag rows, float32", "lora", on), ("AdamW states: exp_avg + exp_avg_sq, float32", "adam", on),
             (f"KV cache, {bound} rows: the bound, every response inside a {args.paths}-path block", "kv_cache", on),
             (f"  KV cache, {rows} rows: no fork (not in the total)", "kv_cache_no_fork", on),
             (f"decode step, {bound} rows: its largest phase (embedding, layers, head + draw)", "decode_step", on),
             ("SAMPLING PEAK", "sampling_peak", on), ("LoRA grads, float32, alive over the micro-batches", "grads", on),
             (f"activations, {b} row{'s' * (b != 1)}, {said[on]}", "activations", on),
             (f"logits chunk: {chunk}", "logits_chunk", on), (f"TRAINING PEAK, {said[on]}", "training_peak", on),
             (f"  activations, {said[not on]}", "activations", not on),
             (f"  training peak, {said[not on]}", "training_peak", not on)]
    dtypes = "/".join(sorted({c["dtype"] for c in coefficients.values()}))
    print(f"Predicted peak GPU memory, GiB: {args.prompts} prompts x {args.samples} samples x {args.new_tokens:,} new "
          f"tokens (rows of {T:,} tokens), 4-bit NF4 + LoRA r{args.lora_rank} + tag rows, micro-batch {b}; measured in {dtypes}")
    print(" " * 80 + "".join(f"{n:>14}" for n in coefficients))
    for label, key, ck in lines:
        print(f"{label:<80}" + "".join(f"{plan[ck][n][key] / GiB:>14.2f}" for n in coefficients))
    print(f"\nFlags that fit (peak x 1.1 + 1 GiB <= the GPU; G = {args.samples}; --micro-batch-tokens: the micro-batch "
          f"x the longest row, {T:,} tokens, the same bound with more rows when rows are shorter)")
    for n, c in coefficients.items():
        for gib in args.gpus:
            r = recommend(n, gib, args, c)
            print(f"  {n}, {gib} GiB: " + ("does not fit" if r is None else
                  f"--prompts-per-step {r['prompts']} --micro-batch {r['micro_batch']} (or --micro-batch-tokens "
                  f"{r['micro_batch'] * T}){' --gradient-checkpointing' * r['checkpointing']}: "
                  f"sampling {r['sampling'] / GiB:.2f} GiB, training {r['training'] / GiB:.2f} GiB"))


# --- the measurement (--measure) ---------------------------------------------------------------
def build(name: str, layers: int, rank: int):
    """A random model of `name`'s config with `layers` layers as `load_model` makes it: saved, reloaded 4-bit
    NF4 with double quantisation, LoRA on the seven projections + the tag rows. -> (model, tag ids)"""
    from transformers import AutoConfig, AutoModelForCausalLM

    from nanopar.model import ModelSettings, _model_kwargs, apply_lora, disable_bnb_cpu_repack
    from nanopar.tags import TagIds

    arch, hidden, _, heads, kv, head_dim, mlp, tokenizer = MODELS[name]
    config = AutoConfig.for_model(arch, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  num_key_value_heads=kv, head_dim=head_dim, intermediate_size=mlp, vocab_size=VOCAB,
                                  tie_word_embeddings=True)
    torch.manual_seed(0)
    settings = ModelSettings("random", device="cpu", load_in_4bit=True, lora=True, lora_rank=rank)
    with tempfile.TemporaryDirectory(prefix="nanopar-memory-") as folder:
        AutoModelForCausalLM.from_config(config, dtype=DTYPE).save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, **_model_kwargs(settings, "cpu", DTYPE))
        with torch.no_grad():  # own memory, not views of the file's mapping (its pages would count as resident)
            for tensor in [*model.parameters(), *model.buffers()]:
                if tensor.dtype != torch.uint8:
                    tensor.data = tensor.data.clone()
    disable_bnb_cpu_repack(model)
    tags = TagIds(*range(tokenizer, tokenizer + 6))  # where the tags land after Qwen's tokenizer
    return apply_lora(model, settings, tags), tags


def tensor_bytes(module) -> tuple[int, int]:
    """(frozen, trainable) bytes of a module's tensors, each storage once: parameters, buffers and the 4-bit
    quant states (absmax, code tables, the nested ones) frozen; LoRA and the tag rows trainable."""
    tensors = [*module.parameters(), *module.buffers()]
    for p in module.parameters():
        state = getattr(p, "quant_state", None)
        while state is not None:
            tensors += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if torch.is_tensor(t)]
            state = getattr(state, "state2", None)
    unique = {t.data_ptr(): t for t in reversed(tensors)}.values()  # the first of each storage
    trainable = sum(t.nbytes for t in unique if isinstance(t, torch.nn.Parameter) and t.requires_grad)
    return sum(t.nbytes for t in unique) - trainable, trainable


def line_of(at: dict[int, float]) -> dict:
    """{x: y} at two x -> {"fixed", "per_layer"}: the intercept and the slope, in whole bytes."""
    (x0, y0), (x1, y1) = sorted(at.items())
    return {"fixed": round(y0 - x0 * (y1 - y0) / (x1 - x0)), "per_layer": round((y1 - y0) / (x1 - x0))}


def measure_model(name: str, T0: int, rows: int, rank: int) -> dict:
    """Every coefficient `predict` reads, for one model (activations on a row of `T0` tokens, decode steps of
    `rows` lanes): tensor bytes, or the peak rise of the resident set (`common.peak_rise`) of one phase."""
    from nanopar.model import enable_gradient_checkpointing  # imports peft: only where a measurement needs it

    started, vocab, g = time.perf_counter(), MODELS[name][7] + 6, torch.Generator().manual_seed(0)  # vocab: + the tags
    model, tags = build(name, max(BUILT_LAYERS), rank)
    (decoder, head), config, dtype = decoder_and_head(model), model.config, mask_dtype(model)
    built = list(decoder.layers)
    tokens = lambda *shape: torch.randint(0, tags.block_open, shape, generator=g)  # noqa: E731  (no tag among them)

    def use_layers(depth: int) -> None:  # the decoder runs the first `depth` built layers
        decoder.layers, config.num_hidden_layers = torch.nn.ModuleList(built[:depth]), depth

    def layers_trained(depth: int, length: int) -> int:  # `depth` layers' forward + backward from the embedding's output
        use_layers(depth)
        ids = tokens(1, length)  # [1, T]
        embedded = decoder.embed_tokens(ids).detach().requires_grad_()  # [1, T, d], as its trained tag rows make it

        def step():  # the layout built inside, as the trainer does
            layout = build_layout(ids, tags, "causal", dtype=dtype)
            decoder(inputs_embeds=embedded, attention_mask=layout.attention_mask,
                    position_ids=layout.position_ids).last_hidden_state.sum().backward()
        return peak_rise(step)[0]

    def chunks_read(positions: int, entropy: bool = True) -> int:  # `head_logprobs` over two chunks, as the training read
        hidden = torch.randn(1, 2 * positions + 1, config.hidden_size, generator=g).to(DTYPE).requires_grad_()  # [1, T, d]
        targets, where = tokens(1, 2 * positions + 1), torch.ones(1, 2 * positions, dtype=torch.bool)  # [1, T], [1, T - 1]
        return peak_rise(lambda: head_logprobs(hidden[:, :-1][where], targets[:, 1:][where], head, 1.0, vocab, entropy,
                                               positions)[0].sum().backward())[0]

    @torch.no_grad()
    def layers_decoded(lanes: int, width: int) -> tuple[int, int]:  # a decode step's layers over a filled LaneCache
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        filled = lambda n: torch.full((lanes, config.num_key_value_heads, n, head_dim), 0.01, dtype=DTYPE)  # noqa: E731
        cache = DynamicCache(ddp_cache_data=[(filled(1), filled(1))] * config.num_hidden_layers)
        for layer in cache.layers:  # the full width, written (resident), without the copy a cache update makes
            layer.keys, layer.values = filled(width), filled(width)
        lane_cache = LaneCache(cache, [width - (r * 7) % max(1, width // 2) for r in range(lanes)])  # uneven: a step mask
        inputs = dict(inputs_embeds=decoder.embed_tokens(tokens(lanes, 1)), cache=cache, use_cache=True,  # [N, 1, d]
                      position_ids=torch.tensor([[n] for n in lane_cache.lens]), attention_mask=lane_cache.step_mask(dtype))
        return peak_rise(lambda: decoder(**inputs))[0], lane_cache.nbytes()

    @torch.no_grad()
    def head_drawn(lanes: int) -> int:  # the output embedding, then the sampler's draw at T = 1 with a ban mask
        hidden = torch.randn(lanes, 1, config.hidden_size, generator=g).to(DTYPE)  # [N, 1, d]

        def step():
            banned = torch.zeros(lanes, VOCAB, dtype=torch.bool)  # [N, V]: as once a lane has spent its blocks
            banned[:, tags.block_open] = True
            draw(head(hidden)[:, -1], 1.0, vocab, 0, 1.0, banned, g)
        return peak_rise(step)[0]

    (frozen, trainable), (layer_frozen, layer_trainable) = tensor_bytes(model), tensor_bytes(built[0])
    lora = {"fixed": trainable - len(built) * layer_trainable, "per_layer": layer_trainable}
    out = {"dtype": str(DTYPE).removeprefix("torch."), "T0": T0, "lora_rank": rank, "mask_bytes_per_element": DTYPE.itemsize,
           "weights": {"fixed": frozen - len(built) * layer_frozen, "per_layer": layer_frozen}, "lora": lora,
           "adam": {k: 2 * v for k, v in lora.items()}, "activations": {}}  # AdamW: exp_avg, exp_avg_sq of float32 trainables
    for p in model.parameters():  # the gradients allocated, as after a first backward: later backwards add none
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    model.train()
    layers_trained(1, 64), chunks_read(64)  # warm-up
    out["activations"]["plain"] = line_of({depth: layers_trained(depth, T0) for depth in BUILT_LAYERS})
    enable_gradient_checkpointing(model)
    out["activations"]["checkpointing"] = line_of({depth: layers_trained(depth, T0) for depth in BUILT_LAYERS})
    fit = line_of(at := {n: chunks_read(n) for n in CHUNKS})
    out["chunk"] = {"const": fit["fixed"], "per_token": fit["per_layer"], "at": at,
                    "no_entropy_at_default": chunks_read(CHUNKS[0], entropy=False)}
    ids = tokens(1, T0)  # the input embedding alone (its tag rows read row by row)
    out["embedding_train"] = peak_rise(lambda: decoder.embed_tokens(ids).sum().backward())[0]
    model.eval()
    with torch.no_grad():
        out["embedding_forward"] = peak_rise(lambda: decoder.embed_tokens(ids[:, :rows]))[0]
    use_layers(BUILT_LAYERS[0])
    layers_decoded(8, 64)  # warm-up
    (wide, cache), (half, _) = layers_decoded(rows, T0), layers_decoded(rows, T0 // 2)
    per_row_column = (wide - half) / (rows * (T0 - T0 // 2))
    fit = line_of({n: head_drawn(n) for n in (rows // 2, rows)})
    out["decode"] = {"per_row": round(wide / rows - per_row_column * T0), "per_row_column": round(per_row_column),
                     "head_const": fit["fixed"], "head_per_row": fit["per_layer"]}
    out["kv_per_token_layer"] = cache // (rows * T0 * BUILT_LAYERS[0])  # = 2 x kv heads x head_dim x bytes
    del model, built, decoder, head
    gc.collect()
    print(f"  {name}: {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")
    return out


def main(argv=None):
    from nanopar.config import parse_config

    args = parse_config(PlanConfig, argv, description=__doc__.splitlines()[0])
    names = list(MODELS) if args.model == "all" else [args.model]
    if any(n not in MODELS for n in names):
        raise SystemExit(f"bench/memory.py: unknown model {args.model!r}: use {' | '.join(MODELS)} | all")
    coefficients = {n: STORED["models"][n] for n in names}
    if args.measure:
        with contextlib.suppress(OSError, AttributeError):  # glibc: large blocks from mmap, handed back on free
            ctypes.CDLL(None).mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (otherwise it grows to 32 MiB)
        print(f"measuring on this CPU ({torch.get_num_threads()} threads, torch {torch.__version__}), "
              f"load average {os.getloadavg()[0]:.2f}")
        T = args.longest_row()
        coefficients = {n: measure_model(n, T, args.prompts * args.samples * args.paths, args.lora_rank) for n in names}
        stored = json.loads(COEFFICIENTS.read_text())  # the other models' and the plain read's kept
        COEFFICIENTS.write_text(json.dumps(stored | {"models": stored["models"] | coefficients}, indent=1) + "\n")
        print(f"written to {COEFFICIENTS}; load average {os.getloadavg()[0]:.2f}")
    print_plan(args, coefficients)


if __name__ == "__main__":
    main()
