"""The LM head read chunk by chunk: each chosen token's log-prob without the full logits.

The optimisation beside forward.py's plain read, which it must equal (tests/test_head.py). A
training read needs one number per position, the policy's log-prob of the token that follows
(and, where it is logged, the entropy). Taking them from the model's full logits keeps a
[B, T, V] tensor alive, with its float32 log-softmax and their gradients: on Qwen's 151,936-row
vocabulary 0.6 GB each per 1,000 positions. Here the model runs without its head
(`decoder_and_head`) and `head_logprobs` applies the head to `chunk` positions at a time:

    forward   per chunk: logits = head(h) [c, V] -> logsumexp, chosen log-prob, entropy [c]; freed
    backward  per chunk: logits recomputed from h, overwritten in place by their gradient
              g * (onehot - softmax) / T, passed back through the head, freed

so at most one chunk's [c, V] logits exist at a time, forward and backward (with float32 buffers
of their size, made at the first chunk and reused: the copy of bf16 logits, the exponentials for
the entropy); kept in between are h [n, d] and the logsumexp [n]. The price is one more head
matmul per chunk (the recompute).
The head is called as the module it is, so its trainable parameters, whatever they are (the
embedding it is tied to, peft's TrainableTokensWrapper and its tag rows, a LoRA on the head),
are inputs of the autograd Function and get their gradients by autograd over each recomputed
chunk; the random state is replayed, so a head with dropout draws the same masks again.
The policy is `policy.policy_scores`'s: logits / T over the real vocabulary, T = 0 read at 1.

Not here: the layout, the batch and the plain read (forward.py), losses. Not covered: models whose forward does
more to the logits than the head (Gemma's softcapping: refused), peft's prompt-learning methods.
"""

from __future__ import annotations

import torch

from . import NanoparError
from .policy import policy_scores, scores_are_a_view

CHUNK_BYTES = 128 * 2**20  # float32 logits per chunk by default: ~220 positions on Qwen's 151,936 rows


def decoder_and_head(model):
    """(the model without its LM head, the head) of a causal LM or of a peft model around one: the
    base model's own modules, LoRA layers and trainable tag rows inside them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if decoder is None or decoder is base or head is None:
        raise NanoparError(f"{type(base).__name__} has no decoder and LM head to read log-probs from")
    if getattr(base.config, "final_logit_softcapping", None):
        raise NanoparError(f"{type(base).__name__} softcaps its logits; nanopar's chunked read applies the head alone")
    return decoder, head


def head_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float,
                  vocab_size: int | None, with_entropy: bool = False, chunk: int | None = None):
    """The policy's log-prob of each target after each hidden state, and (`with_entropy`, no
    gradient) the entropy there; `chunk` positions at a time (None: as many as fit in CHUNK_BYTES
    of float32 logits). hidden [n, d], targets [n] -> (log-probs [n] float32, entropy [n] or None)"""
    if chunk is None:
        rows = vocab_size or next(head.parameters()).shape[0]  # not `.weight`: a peft wrapper builds it anew
        chunk = max(1, CHUNK_BYTES // (4 * rows))
    if chunk < 1:
        raise NanoparError(f"positions per chunk must be >= 1, not {chunk}")
    params = [p for p in head.parameters() if p.requires_grad]
    chosen, entropy = _HeadLogprobs.apply(hidden, targets, head, temperature, vocab_size, chunk, with_entropy,
                                          *params)
    return chosen, entropy if with_entropy else None


class _HeadLogprobs(torch.autograd.Function):
    """(hidden [n, d], targets [n], head, T, vocab, chunk, with_entropy, *head params) -> (chosen [n], entropy [n])"""

    @staticmethod
    def forward(ctx, hidden, targets, head, temperature, vocab_size, chunk, with_entropy, *params):
        ctx.rng = _rng_state(hidden.device)  # replayed by the recompute: a head with dropout
        n = hidden.shape[0]
        chosen = hidden.new_empty(n, dtype=torch.float32)  # [n]
        lse = torch.empty_like(chosen)  # [n] log of the softmax's denominator
        entropy = torch.zeros_like(chosen)  # [n]
        buffers = _ChunkBuffers(min(chunk, n), vocab_size)
        for start in range(0, n, chunk):
            span = slice(start, start + chunk)
            logits = head(hidden[span])  # [c, V]
            scores = policy_scores(logits, temperature, vocab_size, out=buffers.scores(logits, temperature))  # [c, V']
            del logits
            top = scores.amax(-1, keepdim=True)  # [c, 1]
            shifted = scores.sub_(top)  # [c, V'] in place: the logits are not needed again
            picked = shifted.gather(-1, targets[span, None]).squeeze(-1)  # [c]
            if with_entropy:  # -sum p log p = log Z - sum e * shifted / Z, e = exp(shifted), Z = sum e
                e = torch.exp(shifted, out=buffers.get(1, shifted))  # [c, V']
                Z = e.sum(-1)  # [c]
                entropy[span] = Z.log() - torch.linalg.vecdot(e, shifted) / Z
            else:
                Z = shifted.exp_().sum(-1)  # [c]
            chosen[span] = picked - Z.log()
            lse[span] = top.squeeze(-1) + Z.log()
        ctx.save_for_backward(hidden, targets, lse, *params)
        ctx.head, ctx.temperature, ctx.vocab_size, ctx.chunk = head, temperature, vocab_size, chunk
        ctx.mark_non_differentiable(entropy)
        return chosen, entropy

    @staticmethod
    def backward(ctx, grad_chosen, _grad_entropy):
        hidden, targets, lse, *params = ctx.saved_tensors
        head, temperature, vocab_size = ctx.head, ctx.temperature, ctx.vocab_size
        scale = temperature if 0 < temperature != 1.0 else 1.0  # d scores / d logits
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None  # [n, d]
        grad_params = [None] * len(params)
        cuda = [hidden.device] if hidden.device.type == "cuda" else []
        buffers = _ChunkBuffers(min(ctx.chunk, hidden.shape[0]), vocab_size)
        with torch.random.fork_rng(devices=cuda):
            _set_rng_state(ctx.rng, hidden.device)
            for start in range(0, hidden.shape[0], ctx.chunk):
                span = slice(start, start + ctx.chunk)
                with torch.enable_grad():
                    h = hidden[span].detach().requires_grad_(ctx.needs_input_grad[0])  # [c, d]
                    logits = head(h)  # [c, V] recomputed
                with torch.no_grad():  # d chosen / d logits = (onehot(target) - softmax) / T, on the real vocabulary
                    g = grad_chosen[span, None] / scale  # [c, 1]
                    grad = logits.detach()  # [c, V]: becomes the gradient in place
                    scores = policy_scores(grad, temperature, vocab_size, out=buffers.scores(grad, temperature))  # [c, V']
                    softmax = scores.sub_(lse[span, None]).exp_()  # [c, V']
                    part = softmax.mul_(-g).scatter_add_(-1, targets[span, None], g)  # [c, V']
                    if part.data_ptr() != grad.data_ptr():  # a copy (another dtype, T != 1): back in
                        grad[:, : part.shape[-1]].copy_(part)
                    grad[:, part.shape[-1] :].zero_()  # rows beyond the real vocabulary: not in the policy
                wanted = ([h] if ctx.needs_input_grad[0] else []) + params
                grads = list(torch.autograd.grad(logits, wanted, grad, allow_unused=True))
                if ctx.needs_input_grad[0]:
                    grad_hidden[span] = grads.pop(0)
                for i, value in enumerate(grads):
                    if value is not None:
                        grad_params[i] = value if grad_params[i] is None else grad_params[i].add_(value)
        return (grad_hidden, None, None, None, None, None, None, *grad_params)


class _ChunkBuffers:
    """Float32 [chunk, V'] buffers made at the first chunk and written by every chunk after it: a
    fresh [c, V'] tensor per chunk costs its pages' first touch, more than the pass that fills it
    (bench/head_chunk.py races the two). The numbers are those of fresh tensors."""

    def __init__(self, rows: int, vocab_size: int | None):
        self.rows, self.vocab_size, self.made = rows, vocab_size, {}

    def get(self, which: int, like: torch.Tensor) -> torch.Tensor:
        """buffer `which`, cut to `like`'s rows: [c, V'] float32 (V' = the real vocabulary, at most like's)."""
        if which not in self.made:
            width = min(self.vocab_size or like.shape[-1], like.shape[-1])
            self.made[which] = like.new_empty(self.rows, width, dtype=torch.float32)
        return self.made[which][: like.shape[0]]

    def scores(self, logits: torch.Tensor, temperature: float) -> torch.Tensor | None:
        """buffer 0 for `policy_scores` to write the chunk's scores into; None where it returns a view."""
        return None if scores_are_a_view(logits, temperature) else self.get(0, logits)


def _rng_state(device: torch.device):
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
