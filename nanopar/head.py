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

The head `load_model` builds (a frozen linear head, its tag rows trainable, `tag_rows.py`) takes
a shorter road: a log-prob's gradient is its incoming number times a slope known in the forward,

    d chosen / d h     = (onehot(target) - softmax) / T  @ W'   [c, d]  (W': the weight, tag rows swapped in)
    d chosen / d rows  = (onehot(target) - softmax)[tags] / T  x h   ([c, k] kept, times h in backward)

so the forward multiplies each chunk's (onehot - softmax) by the weight, the matmul the backward
would have made, and keeps the slopes ([n, d] and [n, k], float32); the backward only scales them.
No recompute: two head matmuls per chunk instead of three (bench/races.py, head_chunk, races the
two roads); a read for no backward (under no_grad: pi_old, a reference) takes no slopes, one matmul a
chunk. Any other head (a bias, a LoRA on it, dropout, several adapters, a hook) takes the recompute.
The policy is `policy.policy_scores`'s: logits / T over the real vocabulary, T = 0 read at 1.

Not here: the layout, the batch and the plain read (forward.py), losses. Not covered: models whose forward does
more to the logits than the head (Gemma's softcapping: refused), peft's prompt-learning methods.
"""

from __future__ import annotations

import torch
from peft.utils.other import TrainableTokensWrapper

from . import NanoparError
from .policy import policy_scores, scores_are_a_view, temperature_divisor
from .tag_rows import RowwiseTagRows

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
    wanted = torch.is_grad_enabled() and (hidden.requires_grad or bool(params))  # a read for a backward
    linear = _linear_head(head, params, vocab_size) if wanted else None  # None: the recompute road (or none)
    chosen, entropy = _HeadLogprobs.apply(hidden, targets, head, temperature, vocab_size, chunk, with_entropy,
                                          linear, *params)
    return chosen, entropy if with_entropy else None


class _HeadLogprobs(torch.autograd.Function):
    """(hidden [n, d], targets [n], head, T, vocab, chunk, with_entropy, its `_LinearHead` or None,
    *head params) -> (chosen [n], entropy [n])"""

    @staticmethod
    def forward(ctx, hidden, targets, head, temperature, vocab_size, chunk, with_entropy, linear, *params):
        ctx.rng = _rng_state(hidden.device)  # replayed by the recompute: a head with dropout
        n = hidden.shape[0]
        chosen = hidden.new_empty(n, dtype=torch.float32)  # [n]
        lse = torch.empty_like(chosen)  # [n] log of the softmax's denominator
        entropy = torch.zeros_like(chosen)  # [n]
        buffers = _ChunkBuffers(min(chunk, n), vocab_size)
        if linear is not None:  # the slopes of the module docstring, filled chunk by chunk
            slope = hidden.new_zeros(n, hidden.shape[1] if hidden.requires_grad else 0, dtype=torch.float32)  # [n, d]
            tag_slope = hidden.new_zeros(n, linear.k, dtype=torch.float32)  # [n, k]
        for start in range(0, n, chunk):
            span = slice(start, start + chunk)
            logits = head(hidden[span])  # [c, V]
            scores = policy_scores(logits, temperature, vocab_size, out=buffers.scores(logits, temperature))  # [c, V']
            top = scores.amax(-1, keepdim=True)  # [c, 1]
            shifted = scores.sub_(top)  # [c, V'] in place: the logits are not needed again
            picked = shifted.gather(-1, targets[span, None]).squeeze(-1)  # [c]
            if with_entropy:  # -sum p log p = log Z - sum e * shifted / Z, e = exp(shifted), Z = sum e
                e = torch.exp(shifted, out=buffers.get(1, shifted))  # [c, V']
                Z = e.sum(-1)  # [c]
                entropy[span] = Z.log() - torch.linalg.vecdot(e, shifted) / Z
            else:
                e = shifted.exp_()  # [c, V']
                Z = e.sum(-1)  # [c]
            chosen[span] = picked - Z.log()
            lse[span] = top.squeeze(-1) + Z.log()
            if linear is not None:
                slope[span], tag_slope[span] = linear.slopes(e, Z, targets[span], logits, temperature,
                                                             hidden.requires_grad)
            del logits
        if linear is None:
            ctx.save_for_backward(hidden, targets, lse, *params)
        else:
            ctx.save_for_backward(hidden, slope, tag_slope)
        ctx.head, ctx.temperature, ctx.vocab_size, ctx.chunk, ctx.linear = head, temperature, vocab_size, chunk, linear
        ctx.mark_non_differentiable(entropy)
        return chosen, entropy

    @staticmethod
    def backward(ctx, grad_chosen, _grad_entropy):
        if ctx.linear is not None:  # the slopes taken in the forward, scaled by each log-prob's incoming number
            hidden, slope, tag_slope = ctx.saved_tensors
            grad_hidden = (grad_chosen[:, None] * slope).to(hidden.dtype) if ctx.needs_input_grad[0] else None  # [n, d]
            grad_params = [] if ctx.linear.rows is None else [ctx.linear.rows_gradient(grad_chosen, tag_slope, hidden)]
            return (grad_hidden, None, None, None, None, None, None, None, *grad_params)
        hidden, targets, lse, *params = ctx.saved_tensors
        head, temperature, vocab_size = ctx.head, ctx.temperature, ctx.vocab_size
        scale = temperature_divisor(temperature)  # d scores / d logits = 1 / scale
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
        return (grad_hidden, None, None, None, None, None, None, None, *grad_params)


class _LinearHead:
    """A head that is a linear map: logits = h @ W'^T, W' the frozen weight [V, d] with the rows of
    `tags` [k] replaced by the trainable `rows` [k, d] (peft's tag rows), or no tags at all; read
    over the policy's first `vocab` rows (V')."""

    def __init__(self, weight: torch.Tensor, tags: list[int], rows: torch.nn.Parameter | None, vocab: int):
        self.weight, self.rows, self.k = weight, rows, len(tags)
        self.inside = [i for i, tag in enumerate(tags) if tag < vocab]  # slots of the tag rows the policy reads
        self.tags = torch.tensor([tags[i] for i in self.inside], dtype=torch.long, device=weight.device)  # [k']

    def slopes(self, e: torch.Tensor, Z: torch.Tensor, targets: torch.Tensor, logits: torch.Tensor, temperature: float,
               of_hidden: bool = True):
        """A chunk's d chosen / d h [c, d] (empty [c, 0] unless `of_hidden`) and d chosen / d (tag
        logits) [c, k], float32. e [c, V'] the exponentials of the shifted scores (float32, spent:
        overwritten), Z [c] their sums, targets [c]; logits [c, V] the chunk's spent logits: their
        storage takes (onehot - softmax) in the head's dtype for the matmul, as the recompute's
        backward writes its gradient."""
        scale = temperature_divisor(temperature)  # d scores / d logits = 1 / scale
        vocab = e.shape[-1]  # V': the policy's rows; the weight's rows beyond it are not in the policy
        tag_slope = e.new_zeros(e.shape[0], self.k)  # [c, k]; 0 for a tag row beyond V'
        part = e.mul_((-1 / Z)[:, None])  # [c, V'] -softmax, in place
        part.scatter_add_(-1, targets[:, None], torch.ones_like(Z)[:, None])  # onehot(target) - softmax
        if self.inside:
            tag_slope[:, self.inside] = part[:, self.tags]
            part[:, self.tags] = 0  # their logits came from `rows`, added below
        if not of_hidden:
            return e.new_zeros(e.shape[0], 0), tag_slope / scale
        onehot_minus_p = logits[:, :vocab]  # [c, V'] in the head's dtype
        if onehot_minus_p.data_ptr() != part.data_ptr():  # float32 logits at T = 1: `part` is that view already
            onehot_minus_p.copy_(part)
        slope = (onehot_minus_p @ self.weight[:vocab]).float()  # [c, d]: the head's backward matmul
        if self.inside:
            rows = self.rows.detach()[self.inside].to(self.weight.dtype).float()  # [k', d] as the forward rounds them
            slope += tag_slope[:, self.inside] @ rows  # [c, k'] @ [k', d]
        return slope / scale, tag_slope / scale

    def rows_gradient(self, grad_chosen: torch.Tensor, tag_slope: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """d loss / d rows [k, d] in the rows' dtype: sum over positions of g x tag slope x h."""
        return ((grad_chosen[:, None] * tag_slope).T @ hidden.float()).to(self.rows.dtype)


def _linear_head(head: torch.nn.Module, params: list, vocab_size: int | None) -> _LinearHead | None:
    """The head as a `_LinearHead` where it is one whose only trainable parameters are its tag rows
    (or none): a bias-free frozen nn.Linear, bare or inside `RowwiseTagRows` with one active
    adapter (in peft's TrainableTokensWrapper, whose forward is its layer's), no hook on any of
    them. None for any other head: its backward recomputes the logits."""
    def frozen_linear(m):
        return type(m) is torch.nn.Linear and m.bias is None and not m.weight.requires_grad

    modules = [head]
    if isinstance(head, TrainableTokensWrapper):
        head = head.token_adapter
        modules.append(head)
    if isinstance(head, RowwiseTagRows):
        modules.append(head.base_layer)
    hooked = torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks
    if hooked or any(m._forward_hooks or m._forward_pre_hooks for m in modules):
        return None  # a hook may change the logits: only the recompute reads what it does
    if frozen_linear(head) and not params:
        return _LinearHead(head.weight, [], None, _policy_rows(head.weight, vocab_size))
    if (isinstance(head, RowwiseTagRows) and frozen_linear(head.base_layer) and not head.merged
            and not head.disable_adapters and len(head.active_adapters) == 1):
        name = head.active_adapters[0]
        rows = head.trainable_tokens_delta[name]
        if len(params) == 1 and params[0] is rows:
            weight = head.base_layer.weight
            return _LinearHead(weight, list(head.token_indices[name]), rows, _policy_rows(weight, vocab_size))
    return None


def _policy_rows(weight: torch.Tensor, vocab_size: int | None) -> int:
    """V': the head's rows the policy reads (policy_scores' cut)."""
    return weight.shape[0] if vocab_size is None else min(vocab_size, weight.shape[0])


class _ChunkBuffers:
    """Float32 [chunk, V'] buffers made at the first chunk and written by every chunk after it: a
    fresh [c, V'] tensor per chunk costs its pages' first touch, more than the pass that fills it
    (bench/races.py's head_chunk races the two). The numbers are those of fresh tensors."""

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
