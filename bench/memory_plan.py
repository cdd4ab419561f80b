"""A memory plan for real Qwen models on a GPU: 4-bit NF4 + LoRA + tag rows, GRPO with nanopar.

    python bench/memory_plan.py                 # the plan for every model, from memory_coefficients.json
    python bench/memory_plan.py --model qwen3-0.6b --prompts 4 --micro-batch 4

    from memory_plan import predict             # with bench/ on sys.path: bytes of each component
    predict("qwen2.5-1.5b", micro_batch=2, checkpointing=True)["training_peak"]

The plan is the peak memory of the two halves of a GRPO step, B prompts x G samples x N new
tokens, from coefficients measured on a CPU at the real layer shapes (bench/memory_measure.py
writes them into bench/memory_coefficients.json, and says how each is measured):

    sampling = weights + LoRA + AdamW states + KV cache + one decode step
    training = weights + LoRA + AdamW states + LoRA grads + max(activations + logits chunk, embedding)

weights, LoRA and AdamW are linear in the depth; the KV cache is bytes per token per layer x the
rows the sampler holds (B x G x K: every response inside a K-path block, the bound) x the longest
row; the decode step is its largest phase; activations are per row, linear in T but for the T x T
mask; the logits chunk is head.py's chunk (or, `--chunk-tokens 0`, the plain read's full logits);
the embedding's backward comes after the layers' activations are freed, so a max (with the tag
rows read row by row, nanopar/tag_rows.py, the embedding's share is small). Not in
the plan: the CUDA context and cuBLAS workspace, the caching allocator's fragmentation (the
recommendations allow 1 GiB + 10% for both), a KL reference (one more copy of the LoRA
parameters), attention kernels that differ between CPU and GPU.
Not here: measuring (memory_measure.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GiB, MiB = 2**30, 2**20
# The published configs (config.json of each hub repo), written out: no download here.
MODELS = {
    #                 arch     hidden layers heads kv head_dim  mlp   tokenizer (len, before the 6 tags)
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, 64, 4864, 151665),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, 128, 8960, 151665),
    "qwen3-0.6b": ("qwen3", 1024, 28, 16, 8, 128, 3072, 151669),
    "qwen3-1.7b": ("qwen3", 2048, 28, 16, 8, 128, 6144, 151669),
}  # all four tie the input and output embeddings (tie_word_embeddings: true)
BUILT_LAYERS = (2, 4)  # depths measured; the plan is linear in between and beyond
COEFFICIENTS = Path(__file__).resolve().parent / "memory_coefficients.json"  # written by memory_measure.py


def library_chunk(vocab: int) -> int:
    """Positions per chunk of `nanopar.head.head_logprobs` by default: CHUNK_BYTES of float32 logits."""
    from nanopar.head import CHUNK_BYTES

    return max(1, CHUNK_BYTES // (4 * vocab))


# the library's default chunk on Qwen's real vocabulary (tokenizer + the six tags): 221 positions
DEFAULT_CHUNK = min(library_chunk(spec[7] + 6) for spec in MODELS.values())
CHUNKS = (DEFAULT_CHUNK, 2 * DEFAULT_CHUNK)  # logits-chunk sizes measured (positions), two chunks each


# --- the stored measurement ------------------------------------------------------------------
def load_coefficients(path: Path = COEFFICIENTS) -> dict:
    """The stored measurement: {"plain_read_per_token": {model: bytes}, "models": {model: coefficients}};
    the numeric keys of its tables (tokens, layers) back to ints."""
    numbers = lambda pairs: {int(k) if k.isdigit() else k: v for k, v in pairs}  # noqa: E731
    return json.loads(Path(path).read_text(), object_pairs_hook=numbers)


STORED = load_coefficients()


# --- the plan --------------------------------------------------------------------------------
def sequence_tokens(prompt_tokens: int, new_tokens: int, paths: int, max_blocks: int) -> int:
    """Tokens of the longest row: the sampler's own bound (`SamplerSettings.longest_row`)."""
    from nanopar.sampler import SamplerSettings  # (as library_chunk: the plan reads the library's own figures)

    return SamplerSettings(paths=paths, max_new_tokens=new_tokens, max_blocks=max_blocks).longest_row(prompt_tokens)


def predict(model_name: str, prompts: int = 8, samples: int = 8, new_tokens: int = 1024, prompt_tokens: int = 320,
            paths: int = 2, max_blocks: int = 4, micro_batch: int = 2, checkpointing: bool = True,
            chunk_tokens: int = DEFAULT_CHUNK, lora_rank: int = 16, layers: int | None = None,
            coefficients: dict | None = None) -> dict[str, int]:
    """Predicted GPU memory of one GRPO step, in bytes, by component (see the module docstring):
    weights, lora, adam, grads, kv_cache (the bound: B x G x K rows), kv_cache_no_fork, decode_step,
    activations, logits_chunk, and the totals sampling_peak and training_peak.

    chunk_tokens: positions per logits chunk of `head_logprobs` (default: the library's, CHUNK_BYTES
    of float32 logits); 0 = the plain read, the full logits of a whole micro-batch at once (bytes
    per token read, in proportion). layers: decoder layers (None = the model's). coefficients: a
    `memory_measure.measure_model` result (None = the stored ones). Sampling and training are
    separate peaks: the cache is freed before training, the activations before the next sampling. For
    bench/train_step.py --full-size 0.5b (4 x 8 x 1,024, prompts of 16 tokens, micro-batch 2):
    predict("qwen2.5-0.5b", prompts=4, prompt_tokens=16)
    """
    c = coefficients if coefficients is not None else STORED["models"][model_name]
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
    else:  # the plain read: [b, T, V] logits, float32 log-softmax and their gradients at once
        logits = read * STORED["plain_read_per_token"][model_name]
    out = dict(weights=weights, lora=lora, adam=adam, grads=lora, kv_cache=kv * rows,
               kv_cache_no_fork=kv * rows_no_fork, decode_step=decode, activations=activations, logits_chunk=logits)
    out = {k: int(v) for k, v in out.items()}
    out["sampling_peak"] = out["weights"] + out["lora"] + out["adam"] + out["kv_cache"] + out["decode_step"]
    # the embedding's backward comes after the layers' activations are freed
    out["training_peak"] = (out["weights"] + out["lora"] + out["adam"] + out["grads"]
                            + max(out["activations"] + out["logits_chunk"], int(c["embedding_train"])))
    return out


def chunk_peak(c: dict, tokens: int) -> float:
    """A logits chunk's peak (`head_logprobs`, `tokens` positions per chunk): the line through the
    two measured sizes between them and below (floored at 0), proportional to the largest above
    it (conservative: that scales the intercept too, which does not grow with the chunk)."""
    at = c["chunk"]["at"]
    largest = max(at)
    if tokens >= largest:
        return at[largest] * tokens / largest
    return max(0.0, c["chunk"]["const"] + tokens * c["chunk"]["per_token"])


def decode_peak(c: dict, rows: int, width: int) -> float:
    """A decode step's peak over the cache: the largest of its phases (the embedding lookup, the
    layers' per-layer K/V copies, the output embedding + draw)."""
    d = c["decode"]
    return max(c["embedding_forward"], rows * (d["per_row"] + d["per_row_column"] * width),
               d["head_const"] + rows * d["head_per_row"])


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
    chunk_tokens: int = DEFAULT_CHUNK  # positions per logits chunk of head_logprobs (default: the library's, 128 MiB of float32 logits); 0 = the plain read (whole micro-batch)
    lora_rank: int = 16  # LoRA r (the plan scales the measured r = 16 adapters)
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
    names = model_names(args.model)
    coefficients = {n: STORED["models"][n] for n in names}
    T = sequence_tokens(args.prompt_tokens, args.new_tokens, args.paths, args.max_blocks)
    print_tables(Console(width=160), args, names, coefficients, T, [])


def model_names(model: str) -> list[str]:
    """The models `--model` names (one, or "all")."""
    names = list(MODELS) if model == "all" else [model]
    if any(n not in MODELS for n in names):
        raise SystemExit(f"bench/memory_plan.py: unknown model {model!r}: use {' | '.join(MODELS)} | all")
    return names


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
             else f"{b} x {T - 1:,} tokens, the full logits (the plain read)")
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
         lambda x: f"{mb(x['embedding_forward'])} / {mb(x['embedding_train'])}", "RSS, tag rows row by row"),
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
