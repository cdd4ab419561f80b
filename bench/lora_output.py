"""LoRA's base output in a training read: made 2-D by the base layer against a 2-D view of it.

    python bench/lora_output.py                               # Qwen2.5-Coder-0.5B + LoRA: ~2 min
    python bench/lora_output.py --quick --model tiny:qwen2    # the same code on a random tiny model: seconds

`lora_dtype.BaseDtypeLora` adds the adapter's update into the base layer's output in place. Written
on a 2-D view of a [..., out] output (the forward before, `viewed_forward` here), autograd records
the in-place write on a view and copies the output's gradient in backward (CopySlices), at every
adapted projection; the library hands the base layer 2-D rows, so its output is 2-D itself and
is only viewed back as [..., out] after the write. Here a training read (forward + backward of
the chosen tokens' log-probs, with the entropy, as the GRPO update reads) of --rows rows of
--tokens random tokens with a parallel block, the model as train.py loads it (LoRA r16 on the
seven projections, B drawn small so the update is not zero, and the tag rows): the same
log-probs (asserted equal) and gradients (cosine to each other, printed); seconds per read,
taking turns, best of --rounds; the load average beside them.
Not here: float32 models (peft's own forward), sampling (bench/lora_casts.py).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from common import bench_args, bench_parser, load_bench_model, write_report
from floor import training_batch
from nanopar import lora_dtype
from nanopar.forward import trace_logprobs
from nanopar.policy import Policy


def viewed_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The forward before: the update written in place on a 2-D view of the base's [..., out] output
    (the plain LoRA layers of the bench's model only: no 4-bit base, no variants)."""
    result = self.base_layer(x, *args, **kwargs)  # [..., out]
    flat = result.view(-1, result.shape[-1])  # [n, out] a view: CopySlices in backward
    for name in self.active_adapters:
        A, B = self.adapter_in(name, result.dtype)  # [r, in], [out, r] scaled
        down = F.linear(x.to(result.dtype), A)  # [..., r]
        flat.addmm_(down.reshape(-1, down.shape[-1]), B.t())
    return result


def timed_read(model, batch, policy, forward) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(seconds, log-probs [B, T-1], every trainable gradient flattened) of one read through `forward`."""
    library = lora_dtype.BaseDtypeLora.forward
    lora_dtype.BaseDtypeLora.forward = forward
    try:
        model.zero_grad(set_to_none=True)
        begun = time.perf_counter()
        logprobs, _ = trace_logprobs(model, batch, policy, with_entropy=True)
        (logprobs * batch.target_mask).sum().backward()
        seconds = time.perf_counter() - begun
    finally:
        lora_dtype.BaseDtypeLora.forward = library
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    return seconds, logprobs.detach(), grads


def main(argv: list[str] | None = None) -> dict:
    parser = bench_parser(__doc__)
    parser.add_argument("--rows", type=int, default=3, help="rows of the micro-batch")
    parser.add_argument("--tokens", type=int, default=660, help="tokens a row")
    args = bench_args(parser, argv, (4, "timed reads of each side, after a warm-up"),
                      dict(rows=2, tokens=24, rounds=1), "2 rows x 24 tokens, one round")
    console = Console(width=150)
    started = time.perf_counter()
    model, tokenizer, dtype = load_bench_model(args, console)
    with torch.no_grad():  # B = 0 at load: a small update, so the adapter's gradient path is exercised
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.01)
    model.train()
    policy = Policy.for_tokenizer(tokenizer, "structured", temperature=0.7)
    words = min(len(tokenizer), model.get_input_embeddings().weight.shape[0]) - 16
    batch, _ = training_batch(tokenizer, words, args.rows, args.tokens, model.device)
    sides = {"2-D output": lora_dtype.BaseDtypeLora.forward, "2-D view": viewed_forward}
    before, times, reads = os.getloadavg()[0], {side: [] for side in sides}, {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for side in sides if round_ % 2 == 0 else reversed(sides):
            seconds, *reads[side] = timed_read(model, batch, policy, sides[side])
            if round_:
                times[side].append(seconds)
    (ours, our_grads), (theirs, their_grads) = reads["2-D output"], reads["2-D view"]
    assert torch.equal(ours, theirs), "the 2-D output read other log-probs"
    cosine = F.cosine_similarity(our_grads.double(), their_grads.double(), dim=0).item()
    row = {"rows": args.rows, "tokens": args.tokens, "output": min(times["2-D output"]), "view": min(times["2-D view"]),
           "gradient_cosine": cosine, "load": f"{before:.1f} -> {os.getloadavg()[0]:.1f}"}
    row["ratio"] = row["output"] / row["view"]
    table = Table(title=f"a training read, {args.rows} x {args.tokens} tokens, {dtype}, best of {args.rounds}")
    for column in ("2-D output s", "2-D view s", "output / view", "gradients' cosine", "load (1 min)"):
        table.add_column(column, justify="right")
    table.add_row(f"{row['output']:.2f}", f"{row['view']:.2f}", f"{row['ratio']:.2f}", f"{cosine:.6f}", row["load"])
    console.print(table)
    report = {"config": vars(args) | {"resolved_dtype": dtype}, "threads": torch.get_num_threads(), "rows": [row],
              "seconds": time.perf_counter() - started}
    return write_report(report, args.out, console)


if __name__ == "__main__":
    main()
