"""The two training reads of forward.trace_logprobs: the plain one (full logits, log_softmax,
gather) against a hand computation, and the chunked one (head.py) against the plain one:
log-probs, entropy, loss and every gradient, on Qwen's real 151,936-row vocabulary (cut to the
policy's), structured and causal, through grpo_update and sft_step, and with LoRA + trainable tag
rows on a tied and an untied head; "auto" picks each by the vocabulary's size."""

import copy

import pytest
import torch

import nanopar.grpo
import nanopar.sft
from conftest import PAD, load_char_model, text_rollout
from nanopar import NanoparError
from nanopar.forward import CHUNKED_HEAD_FROM_VOCAB, head_read_for, make_batch, trace_logprobs
from nanopar.grpo import GRPOSettings, Reference, grpo_update
from nanopar.head import head_logprobs
from nanopar.model import ModelSettings, load_model
from nanopar.policy import Policy, policy_logprobs
from nanopar.sft import sft_step
from nanopar.tags import TagIds
from nanopar.tiny import char_tokenizer, tiny_qwen_model

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

REAL, WORDS = 151_936, 151_669  # Qwen's embedding rows; its tokenizer before the six tags
QWEN_TAGS = TagIds(*range(WORDS, WORDS + 6))
P, P_, A, A_, S, S_ = QWEN_TAGS.all()
RTOL = 1e-5


@pytest.fixture(scope="module")
def real_vocab_model():
    return tiny_qwen_model(vocab_size=REAL, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1)


def responses(seed=0):
    """Four prompt + response pairs with a parallel block, as ids of the real vocabulary; the
    inserted tags (a closing `</Path>`, the merge) weigh 0, as the sampler marks them."""
    g = torch.Generator().manual_seed(seed)
    word = lambda n: torch.randint(0, WORDS, (n,), generator=g).tolist()
    prompts = [word(5), word(3), word(6), word(4)]
    replies = [word(3) + [P, A] + word(4) + [A_, A] + word(2) + [A_, P_, S] + word(3) + [S_] + word(2),
               word(7), [P, A] + word(2) + [A_, A] + word(5) + [A_, P_, S, S_], word(2) + [P, A, A_, A, A_] + word(1)]
    weights = [[0.0 if t in (P_, S) or (t == A_ and i % 2) else 1.0 for i, t in enumerate(r)] for r in replies]
    return prompts, replies, weights


def close(got, want, rtol=RTOL):
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * want.abs().max().item())


def trainable_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def test_the_plain_read_is_the_policy_log_prob_of_each_next_token():
    """By hand, one row at a time, unpadded: the model's logits at position t, cut to the real
    vocabulary and divided by T; log-prob of token t + 1 = its score - logsumexp, entropy =
    -sum p log p in float64. Padded and weight-0 positions read 0 (causal: the plain forward)."""
    torch.manual_seed(0)
    model = tiny_qwen_model(vocab_size=300).eval()
    tags, vocab, T = TagIds(*range(250, 256)), 256, 0.7  # 44 padded rows beyond the policy's vocabulary
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    replies = [[20, 250, 252, 21, 253, 251, 254, 22, 255], [30, 31], [40, 41, 42, 43, 44]]
    weights = [[1.0] * 9, [1.0, 0.0], [0.0, 1.0, 1.0, 0.0, 1.0]]
    batch = make_batch(prompts, replies, weights, PAD)
    with torch.no_grad():
        got, entropy = trace_logprobs(model, batch, Policy(tags, "causal", T, vocab), with_entropy=True,
                                      head_read="plain")  # [B, T-1] each
    want, want_entropy = torch.zeros_like(got), torch.zeros_like(got)
    for i, (prompt, reply) in enumerate(zip(prompts, replies)):
        ids = prompt + reply
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()  # [n, 300]
        for j, w in enumerate(weights[i]):
            t = len(prompt) - 1 + j  # position t predicts ids[t + 1] = reply[j]
            if w:
                scores = logits[t, :vocab] / T  # [256]
                logp = scores - torch.logsumexp(scores, -1)
                want[i, t], want_entropy[i, t] = logp[reply[j]], -(logp.exp() * logp).sum()
    close(got, want)
    close(entropy, want_entropy)
    assert (got[batch.target_mask == 0] == 0).all() and (got[batch.target_mask > 0] < 0).all()


def test_auto_reads_a_small_vocabulary_plainly_and_a_real_one_chunk_by_chunk():
    assert head_read_for("auto", 130) == "plain" and head_read_for("auto", REAL) == "chunked"
    assert head_read_for("auto", CHUNKED_HEAD_FROM_VOCAB - 1) == "plain"
    assert head_read_for("plain", REAL) == "plain" and head_read_for("chunked", 130) == "chunked"
    for make in (lambda: head_read_for("full", 130), lambda: GRPOSettings(head_read="full"),
                 lambda: sft_step(None, None, [[1]], [[2]], Policy(QWEN_TAGS), PAD, head_read="full")):
        with pytest.raises(NanoparError, match="unknown head read 'full': use one of plain, chunked, auto") as error:
            make()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("mode, temperature", [("structured", 1.0), ("structured", 0.7), ("causal", 0.0)])
def test_chunked_read_equals_the_plain_read(real_vocab_model, mode, temperature):
    """Log-probs, entropy and the gradient of every parameter, at several chunk sizes (1 position,
    a size that does not divide the positions, all in one); T = 0 reads at T = 1."""
    model = real_vocab_model.train()
    prompts, replies, weights = responses()
    batch = make_batch(prompts, replies, weights, PAD)
    policy = Policy(QWEN_TAGS, mode, temperature, WORDS + 6)
    where = batch.target_mask > 0
    scale = torch.randn(where.shape, generator=torch.Generator().manual_seed(1)) * batch.target_mask  # [B, T-1]

    def read(fn, **chunk):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = fn(model, batch, policy, with_entropy=True, **chunk)
        (logprobs * scale).sum().backward()
        return logprobs[where], entropy[where], trainable_grads(model)

    want_logprobs, want_entropy, want_grads = read(trace_logprobs, head_read="plain")
    assert len(want_grads) == len(list(model.parameters()))
    for chunk in (1, 7, None):
        logprobs, entropy, grads = read(trace_logprobs, chunk=chunk, head_read="chunked")
        close(logprobs, want_logprobs)
        close(entropy, want_entropy)
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            close(grad, want_grads[name])
    assert (want_entropy > 0).all() and where.sum() > 40


def capture_gradients(monkeypatch, into: list):
    """apply_gradients records the gradients of each optimiser step, then does its work."""
    real = nanopar.grpo.apply_gradients

    def record(model, optimizer, *args):
        into.append(trainable_grads(model))
        return real(model, optimizer, *args)

    monkeypatch.setattr(nanopar.grpo, "apply_gradients", record)
    monkeypatch.setattr(nanopar.sft, "apply_gradients", record)


@pytest.mark.parametrize("mode", ["structured", "causal"])
@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "updates=2,kl"])
def test_grpo_update_is_the_same_with_either_read(real_vocab_model, mode, off_policy, monkeypatch):
    """Loss, entropy, logprob gap and the gradient of every optimiser step; off-policy with a KL
    reference too (pi_old and the reference read without grad, then the second update's read)."""
    prompts, replies, weights = responses()
    rollouts = [text_rollout(p, r, QWEN_TAGS) for p, r in zip(prompts, replies)]
    for rollout, w in zip(rollouts, weights):
        rollout.sampled = [bool(x) for x in w]
        rollout.logprobs = [-12.0] * len(w)  # as if recorded by a sampler: the gap is the same on both paths
    policy = Policy(QWEN_TAGS, mode, 0.8, WORDS + 6)
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75])
    runs = []
    for head_read in ("chunked", "plain"):
        settings = GRPOSettings(micro_batch=3, updates=2 if off_policy else 1, kl_beta=0.1 if off_policy else 0.0,
                                head_read=head_read)
        model = copy.deepcopy(real_vocab_model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        reference = Reference(model) if off_policy else None
        if off_policy:  # the reference differs from the policy, so the KL term has a gradient
            with torch.no_grad():
                model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
        grads = []
        with monkeypatch.context() as patch:
            capture_gradients(patch, grads)
            metrics = grpo_update(model, optimizer, rollouts, advantages, policy, settings, PAD, reference)
        runs.append((metrics, grads))
    (metrics, grads), (want, want_grads) = runs
    for key in ("loss", "entropy", "logprob_gap", "grad_norm"):
        assert metrics[key] == pytest.approx(want[key], rel=RTOL), key
    assert len(grads) == settings.updates
    for step, want_step in zip(grads, want_grads):
        for name, grad in want_step.items():
            close(step[name], grad)


@pytest.mark.parametrize("mode", ["structured", "causal"])
def test_sft_step_is_the_same_with_either_read(real_vocab_model, mode, monkeypatch):
    prompts, replies, _ = responses(seed=2)
    runs = []
    for head_read in ("chunked", "plain"):
        model = copy.deepcopy(real_vocab_model)
        grads = []
        with monkeypatch.context() as patch:
            capture_gradients(patch, grads)
            metrics = sft_step(model, torch.optim.SGD(model.parameters(), lr=0.05), prompts, replies,
                               Policy(QWEN_TAGS, mode, 0.5, WORDS + 6), PAD, micro_batch=3, head_read=head_read)
        runs.append((metrics, grads[0]))
    (metrics, grads), (want, want_grads) = runs
    assert metrics["loss"] == pytest.approx(want["loss"], rel=RTOL) and metrics["tokens"] == want["tokens"]
    for name, grad in want_grads.items():
        close(grads[name], grad)


@pytest.mark.parametrize("tied", [True, False])
def test_a_lora_head_with_trainable_tag_rows_gets_its_gradients(tied, tmp_path):
    """The head is peft's TrainableTokensWrapper (tied: sharing the embedding's [6, d] tag rows;
    untied: its own): its rows get the gradient of the plain read, LoRA too."""
    if tied:
        model, tokenizer = load_char_model(tmp_path, lora=True)
    else:
        tiny_qwen_model(vocab_size=128, hidden_size=64, tie_word_embeddings=False).save_pretrained(tmp_path)
        char_tokenizer().save_pretrained(tmp_path)
        torch.manual_seed(0)
        model, tokenizer = load_model(ModelSettings(str(tmp_path), lora=True))
    with torch.no_grad():  # LoRA B starts at 0: move it, so every LoRA matrix has a gradient
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    policy = Policy.for_tokenizer(tokenizer, "structured")
    text = ["ab<Parallel><Path>cd</Path><Path>e</Path></Parallel><Summary>f</Summary>g", "xyz"]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in text]
    batch = make_batch([i[:2] for i in ids], [i[2:] for i in ids], [[1.0] * len(i[2:]) for i in ids], PAD)
    got = {}
    for name in ("chunked", "plain"):
        model.train().zero_grad(set_to_none=True)
        logprobs, _ = trace_logprobs(model, batch, policy, head_read=name)
        (logprobs * batch.target_mask).sum().backward()
        got[name] = trainable_grads(model)
    rows = [n for n in got["plain"] if "trainable_tokens_delta" in n]
    assert len(rows) == (1 if tied else 2) and any("lm_head" in n for n in rows) != tied
    assert got["chunked"].keys() == got["plain"].keys() and len(got["plain"]) > len(rows)
    for name, grad in got["plain"].items():
        assert grad.abs().sum() > 0, name
        close(got["chunked"][name], grad)


def test_a_head_with_dropout_draws_the_same_masks_in_the_recompute():
    """The backward recomputes the head's logits: the random state is replayed, so a dropout
    mask is the one the forward drew (the gradient is that of the forward's function)."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(8, 300)).train()
    hidden = torch.randn(10, 8, requires_grad=True)
    targets = torch.randint(0, 290, (10,))
    weights = torch.randn(10)
    got = []
    for chunked in (True, False):
        torch.manual_seed(1)
        hidden.grad = None
        head.zero_grad()
        if chunked:  # one chunk: the forward draws the same mask as the plain read below
            logprobs, _ = head_logprobs(hidden, targets, head, 1.0, 290, chunk=10)
        else:
            logprobs = policy_logprobs(head(hidden), 1.0, 290).gather(-1, targets[:, None]).squeeze(-1)
        (logprobs * weights).sum().backward()
        got.append((logprobs.detach(), hidden.grad.clone(), head[1].weight.grad.clone()))
    for a, b in zip(*got):
        close(a, b)
    with pytest.raises(NanoparError, match="positions per chunk must be >= 1"):
        head_logprobs(hidden, targets, head, 1.0, 290, chunk=-1)


def tag_row_head(tmp_path, dtype):
    """(the head load_model builds on a tiny untied model, its tag rows moved off their start, the tokenizer)"""
    from nanopar.head import decoder_and_head
    tiny_qwen_model(vocab_size=128, hidden_size=64, tie_word_embeddings=False).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelSettings(str(tmp_path), lora=True))
    _, head = decoder_and_head(model.to(dtype))
    rows = head.token_adapter.trainable_tokens_delta["default"]
    with torch.no_grad():
        rows.add_(torch.randn(rows.shape, generator=torch.Generator().manual_seed(2)).to(rows.dtype))
    return head, rows, tokenizer


@pytest.mark.parametrize("dtype, temperature, cut", [(torch.float32, 0.7, False), (torch.float32, 1.0, False),
                                                     (torch.float32, 0.0, True), (torch.float32, 0.7, True),
                                                     (torch.bfloat16, 0.7, False)])
def test_the_tag_row_head_takes_its_slopes_in_the_forward(tmp_path, monkeypatch, dtype, temperature, cut):
    """The head load_model builds (a frozen linear head, its tag rows trainable) reads no recompute:
    the head runs once per chunk, and the log-probs and the gradients of the hidden states and of
    the tag rows are those of the plain read (autograd through log_softmax of the full logits), with
    tag ids among the targets, the policy's vocabulary below the head's rows (`cut`: below the last
    tag's row too), and a short last chunk. A read under no_grad takes no slopes."""
    import nanopar.head as head_module
    head, rows, tokenizer = tag_row_head(tmp_path, dtype)
    tags = torch.as_tensor(head.token_adapter.token_indices["default"])
    vocab = int(tags.max()) if cut else len(tokenizer)  # cut: the last tag row is not in the policy
    assert vocab < 128 and head_module._linear_head(head, [rows], vocab) is not None
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(23, 64, generator=g).to(dtype).requires_grad_(True)  # [n, d]
    targets = torch.randint(0, vocab, (23,), generator=g)  # [n]
    targets[::4] = tags[tags < vocab][torch.arange(6) % int((tags < vocab).sum())]  # some targets are tags
    weights = torch.randn(23, generator=g)  # [n] the loss's incoming numbers

    def plain():
        return policy_logprobs(head(hidden), temperature, vocab).gather(-1, targets[:, None]).squeeze(-1)

    calls, slopes = [], []
    base = head.token_adapter.base_layer
    monkeypatch.setattr(base, "forward", lambda x, real=base.forward: calls.append(1) or real(x))
    real_slopes = head_module._LinearHead.slopes
    monkeypatch.setattr(head_module._LinearHead, "slopes", lambda *a, **k: slopes.append(1) or real_slopes(*a, **k))
    got = {}
    for name, read in (("slopes", lambda: head_logprobs(hidden, targets, head, temperature, vocab, chunk=5)[0]),
                       ("plain", plain)):
        hidden.grad, rows.grad, calls[:] = None, None, []
        chosen = read()
        (chosen * weights).sum().backward()
        got[name] = (chosen.detach().float(), hidden.grad.float(), rows.grad.float(), len(calls))
    assert got["slopes"][3] == 5 and got["plain"][3] == 1 and len(slopes) == 5  # 5 chunks, each read once
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(got["slopes"][:3], got["plain"][:3]):
        close(a, b, rtol=tolerance)
    assert got["plain"][2].abs().sum() > 0
    if cut:  # the tag row beyond the policy's vocabulary gets no gradient
        assert (got["slopes"][2][tags.argmax()] == 0).all() and (got["plain"][2][tags.argmax()] == 0).all()
    with torch.no_grad():  # a read for no backward (pi_old, a reference): one product per chunk, no slopes
        calls[:] = []
        unread = head_logprobs(hidden, targets, head, temperature, vocab, chunk=5)[0]
    assert len(slopes) == 5 and len(calls) == 5 and torch.equal(unread, got["slopes"][0].to(unread.dtype))


def test_a_tag_row_head_with_a_hook_or_its_adapter_disabled_takes_the_recompute(tmp_path):
    """A forward hook may change the logits, a disabled adapter reads the base's rows: both go the
    recompute's road, and their gradients are the plain read's."""
    import nanopar.head as head_module
    head, rows, tokenizer = tag_row_head(tmp_path, torch.float32)
    vocab = len(tokenizer)
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    targets = torch.randint(0, vocab, (9,), generator=torch.Generator().manual_seed(5))
    base = head.token_adapter.base_layer
    hook = base.register_forward_hook(lambda module, args, out: out * 2)
    assert head_module._linear_head(head, [rows], vocab) is None
    for setting in ("hook", "disabled"):
        if setting == "disabled":
            hook.remove()
            head.token_adapter.enable_adapters(False)
            assert head_module._linear_head(head, [rows], vocab) is None
        read = {}
        for name in ("chunked", "plain"):
            hidden.grad = None
            if name == "chunked":
                chosen = head_logprobs(hidden, targets, head, 0.7, vocab, chunk=4)[0]
            else:
                chosen = policy_logprobs(head(hidden), 0.7, vocab).gather(-1, targets[:, None]).squeeze(-1)
            (chosen * torch.arange(9)).sum().backward()
            read[name] = (chosen.detach(), hidden.grad.clone())
        for a, b in zip(read["chunked"], read["plain"]):
            close(a, b)
    head.token_adapter.enable_adapters(True)
    assert head_module._linear_head(head, [rows], vocab) is not None


def test_a_head_it_cannot_read_as_linear_takes_the_recompute():
    """A bias, a trainable weight or a module that is not a linear layer: no slopes, the recompute."""
    from nanopar.head import _linear_head
    frozen = torch.nn.Linear(4, 9, bias=False).requires_grad_(False)
    assert _linear_head(frozen, [], None) is not None
    biased = torch.nn.Linear(4, 9).requires_grad_(False)
    trained = torch.nn.Linear(4, 9, bias=False)
    assert _linear_head(biased, [], None) is None and _linear_head(trained, [trained.weight], None) is None
    assert _linear_head(torch.nn.Sequential(frozen), [], None) is None
