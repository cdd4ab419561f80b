"""The parallel-branch sampler against independent computations on tiny Qwen models."""

import pytest
import torch

from conftest import (A, A_, EOS, NPR_TAGS, P, P_, S, TAGS, V, bias_logits, follow_bias, load_char_model, npr_writer,
                      rule_model, tag_biased_model, token_logprobs, trainer_gap)
from nanopar.layout import build_layout
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample
from nanopar.tags import PARALLEL_R1, TagIds
from nanopar.tiny import tiny_qwen_model
from nanopar.trace import parse_trace, read_tag, trace_stats

PROMPTS = [[1, 2, 3], [4, 5, 6, 8, 9, 10, 11], [12, 13, 14, 15, 16]]


def reread(model, rollout, mode, tags=TAGS, vocab_size=None, path_stride=0):
    """Training-style forward of prompt + response with the layout -> log-probs of the response."""
    ids = torch.tensor([rollout.prompt_ids + rollout.ids])
    layout = build_layout(ids, tags, mode, prompt_lengths=[len(rollout.prompt_ids)], path_stride=path_stride)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=layout.attention_mask, position_ids=layout.position_ids).logits
    n = len(rollout.prompt_ids)
    return token_logprobs(logits[0, n - 1 : -1], ids[0, n:], 1.0, vocab_size)  # [len(response)]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_greedy_without_tags_equals_generate(arch):
    model = tiny_qwen_model(arch=arch, vocab_size=V, seed=1)
    rollouts = sample(model, PROMPTS, Policy(TAGS, temperature=0), SamplerSettings(max_new_tokens=24), eos_ids=[])
    T = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in PROMPTS])
    reference = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None
    )[:, T:]
    for rollout, expected in zip(rollouts, reference.tolist()):
        assert not set(rollout.ids) & set(TAGS.all())  # the premise: no tag was sampled
        assert rollout.ids == expected and all(rollout.sampled)
    # EOS ends a response: stop at the first EOS of the reference
    eos = reference[0, 5].item()
    (stopped,) = sample(model, PROMPTS[:1], Policy(None, temperature=0), SamplerSettings(max_new_tokens=24), eos_ids=[eos])
    assert stopped.ids == reference[0, : reference[0].tolist().index(eos) + 1].tolist() and stopped.finish == "eos"


@pytest.fixture(scope="module", params=[0, 14], ids=["shared", "disjoint"])
def structured_rollouts(request):
    """Tag-heavy structured rollouts, paths at shared positions (stride 0) or disjoint ones
    (stride 14 = max_path_tokens + <Path> + </Path>: no path's range reaches the next one's)."""
    model = tag_biased_model(tag_bias=2.5, eos_bias=1.0)
    settings = SamplerSettings(max_new_tokens=60, max_path_tokens=12, paths=3, seed=0)
    policy = Policy(TAGS, path_stride=request.param)
    return model, policy, sample(model, PROMPTS, policy, settings, eos_ids=[EOS], samples_per_prompt=4)


def test_forked_paths_match_separate_unforked_runs(structured_rollouts):
    """Each path's log-probs equal a plain causal run of prompt + response prefix + that path alone
    (path k placed at its block's start + k * stride)."""
    model, policy, rollouts = structured_rollouts
    checked = 0
    for rollout in rollouts:
        full = rollout.prompt_ids + rollout.ids
        n = len(rollout.prompt_ids)
        for block in rollout.trace.blocks[:1]:  # the first block: its prefix is plain causal text
            prefix = full[: n + block.paths[0].start]
            for k, path in enumerate(block.paths):
                alone = torch.tensor([prefix + full[n + path.start : n + path.end]])
                positions = torch.arange(alone.shape[1])  # [T]
                positions[len(prefix) :] += k * policy.path_stride
                with torch.no_grad():
                    logits = model(input_ids=alone, position_ids=positions[None]).logits[0]
                expected = token_logprobs(logits[len(prefix) - 1 : -1], alone[0, len(prefix) :], 1.0, None)
                got = torch.tensor(rollout.logprobs[path.start : path.end])
                sampled = torch.tensor(rollout.sampled[path.start : path.end])
                assert (got - expected)[sampled].abs().max() <= 1e-5
                checked += int(sampled.sum())
    assert checked > 50  # the premise: forks happened and paths were sampled


def test_structured_training_forward_reproduces_every_sampled_logprob(structured_rollouts):
    model, policy, rollouts = structured_rollouts
    for rollout in rollouts:
        expected = reread(model, rollout, "structured", path_stride=policy.path_stride)
        sampled = torch.tensor(rollout.sampled)
        assert (torch.tensor(rollout.logprobs) - expected)[sampled].abs().max() <= 1e-5
    assert sum(r.stats.forks for r in rollouts) >= 6 and any(b.valid for r in rollouts for b in r.trace.blocks)
    assert any(len(r.trace.blocks) >= 2 for r in rollouts)  # a merged cache decoded a second block


@pytest.fixture(scope="module")
def causal_rollouts():
    """Seen mode on a tag-heavy model that tends to follow a tag with the next one (<Parallel> ->
    <Path>, </Path> -> <Path> or </Parallel>, </Parallel> -> <Summary>): it writes every tag
    itself, so its blocks have 1, 2, 3, ... paths."""
    model = follow_bias(tag_biased_model(tag_bias=2.5, eos_bias=0.5), {(P, A): 5.0, (A_, A): 3.0, (A_, P_): 3.0, (P_, S): 5.0})
    rollouts = []
    for seed in range(3):
        settings = SamplerSettings(max_new_tokens=60, max_path_tokens=8, max_blocks=2, seed=seed)
        rollouts += [(settings, r) for r in sample(model, PROMPTS, Policy(TAGS, "causal"), settings, eos_ids=[EOS],
                                                    samples_per_prompt=12)]
    return model, rollouts


def test_causal_training_forward_reproduces_every_sampled_logprob(causal_rollouts):
    """Seen: the trainer's causal read (forward.trace_logprobs) gives every sampled token the
    log-prob it was drawn with: paths 2..K saw their siblings while written, as in training."""
    model, rollouts = causal_rollouts
    rollouts = [r for _, r in rollouts]
    worst, _ = trainer_gap(model, Policy(TAGS, "causal"), rollouts)
    assert worst <= 1e-5, worst  # float32 rounding; the measured gap: docs/sampling-and-eval.md
    paths = [len(b.paths) for r in rollouts for b in r.trace.blocks]
    # the premise: the model chose blocks of several paths (measured: 25 of 2, 19 of 3 or more)
    assert sum(n == 2 for n in paths) >= 10 and sum(n >= 3 for n in paths) >= 10
    assert sum(b.valid for r in rollouts for b in r.trace.blocks) >= 5
    later = sum(sum(r.sampled[p.start : p.end]) for r in rollouts for b in r.trace.blocks for p in b.paths[1:])
    assert later > 300  # sampled tokens of paths 2..K, each seeing the paths before it


def test_causal_mode_inserts_only_budget_closures_and_reads_its_stats_from_the_trace(causal_rollouts):
    _, rollouts = causal_rollouts
    for settings, r in rollouts:
        inserted = [t for t, s in zip(r.ids, r.sampled) if not s]
        assert set(inserted) <= {A_} and len(inserted) == r.stats.cut_paths  # only long paths closed
        assert r.stats.sampled_tokens == sum(r.sampled) <= settings.max_new_tokens
        assert r.stats.forks == len(r.trace.blocks) <= settings.max_blocks
        assert r.stats.path_lengths == [[len(p) for p in b.paths] for b in r.trace.blocks]
        assert r.stats.stray_tags == len(r.trace.stray)
        assert r.stats.critical_path == trace_stats(r.trace).critical_path
        state, in_path = "main", 0  # sampled tokens of the open path (its </Path> included), as read
        for token, sampled in zip(r.ids, r.sampled):
            in_path += state == "path" and sampled
            assert in_path <= settings.max_path_tokens
            if token in TAGS.names():
                state, structural = read_tag(state, TAGS.names()[token])
                in_path = 0 if structural and state == "path" else in_path
        assert r.finish == "eos" or r.stats.sampled_tokens == settings.max_new_tokens
    assert sum(r.stats.cut_paths for _, r in rollouts) >= 10 and sum(r.finish == "eos" for _, r in rollouts) >= 10
    assert any(r.stats.forks == settings.max_blocks for settings, r in rollouts)


def test_at_temperature_zero_shared_positions_give_identical_paths_and_disjoint_ones_do_not():
    """Paths differ in nothing but their positions (forced <Path>, no tags inside, greedy): with
    shared positions every branch sees the same context, so the K paths are token-identical;
    with disjoint positions each has its own place. Measured (3 model seeds, 5 prompts, K = 3):
    stride 0: 15 of 15 blocks identical; stride 12: 0 of 15, 14 with three distinct paths."""
    model = tiny_qwen_model(vocab_size=V, seed=0, tie_word_embeddings=False)  # untied: not an echo of its input
    bias_logits(model, dict.fromkeys(TAGS.all(), -30.0))
    follow_bias(model, {(99, P): 100.0})  # <Parallel> right after the prompt's last token, nowhere else
    prompts = [p + [99] for p in PROMPTS] + [[20, 21, 99], list(range(30, 45)) + [99]]
    settings = SamplerSettings(paths=3, max_new_tokens=60, max_path_tokens=10, max_blocks=1)
    distinct = {}
    for stride in (0, 12):  # 12 = max_path_tokens + <Path> + </Path>: disjoint
        rollouts = sample(model, prompts, Policy(TAGS, temperature=0, path_stride=stride), settings, eos_ids=[EOS])
        assert all(len(r.trace.blocks[0].paths) == 3 for r in rollouts)
        distinct[stride] = [len({tuple(r.ids[p.start : p.end]) for p in r.trace.blocks[0].paths}) for r in rollouts]
    assert distinct[0] == [1] * 5
    assert min(distinct[12]) >= 2 and sum(n == 3 for n in distinct[12]) >= 4


def detokenize(ids):
    tag_text = dict(zip(TAGS.all(), PARALLEL_R1.all()))
    return "".join(tag_text.get(t, f" w{t}") for t in ids)


def test_two_hundred_tag_heavy_rollouts_stay_within_budgets_and_read_back():
    model = tag_biased_model(tag_bias=3.0, eos_bias=0.5)
    rollouts = []
    for seed in range(4):
        settings = SamplerSettings(
            max_new_tokens=48, max_path_tokens=10, max_blocks=2, paths=2 + seed % 3, seed=seed
        )
        rollouts += [(settings, r) for r in sample(model, PROMPTS, Policy(TAGS), settings, eos_ids=[EOS], samples_per_prompt=17)]
    assert len(rollouts) >= 200
    kinds = set()
    for settings, r in rollouts:
        assert r.stats.sampled_tokens == sum(r.sampled) <= settings.max_new_tokens
        assert r.stats.forks == len(r.trace.blocks) <= settings.max_blocks
        assert all(len(paths) == settings.paths for paths in r.stats.path_lengths)
        for block in r.trace.blocks:
            for path in block.paths:
                assert sum(r.sampled[path.start : path.end]) <= settings.max_path_tokens
        # the structure the sampler built is the one the reader finds, in ids and in text
        assert [[len(p) for p in b.paths] for b in r.trace.blocks] == r.stats.path_lengths
        assert len(r.trace.stray) == r.stats.stray_tags
        text = parse_trace(detokenize(r.ids))
        assert [len(b.paths) for b in text.blocks] == [len(b.paths) for b in r.trace.blocks]
        assert len(text.stray) == len(r.trace.stray) and text.truncated == r.trace.truncated
        # inserted tokens: K <Path> per fork, </Parallel> + <Summary> per merge, one </Path> per cut
        merged = sum(b.close is not None for b in r.trace.blocks)
        inserted = [t for t, s in zip(r.ids, r.sampled) if not s]
        assert len(inserted) == settings.paths * r.stats.forks + 2 * merged + r.stats.cut_paths
        assert set(inserted) <= {A, A_, P_, S}
        assert all(lp == 0.0 for lp, s in zip(r.logprobs, r.sampled) if not s)
        assert all(lp < 0.0 for lp, s in zip(r.logprobs, r.sampled) if s)
        kinds |= {r.finish, "stray" if r.stats.stray_tags else "", "cut" if r.stats.cut_paths else ""}
        kinds |= {"truncated" if r.trace.truncated else "", "valid" if any(b.valid for b in r.trace.blocks) else ""}
    assert kinds >= {"eos", "length", "stray", "cut", "truncated", "valid"}  # every rule was exercised


# schema, mode -> a tiny model that writes that schema's tags often, in that mode
TAG_WRITERS = {
    ("parallel-r1", "structured"): lambda: tag_biased_model(tag_bias=3.0, eos_bias=0.5),
    ("parallel-r1", "causal"): lambda: follow_bias(tag_biased_model(tag_bias=2.5, eos_bias=0.5),
                                                   {(P, A): 5.0, (A_, A): 3.0, (A_, P_): 3.0, (P_, S): 5.0}),
    ("npr", "structured"): npr_writer,
    ("npr", "causal"): lambda: npr_writer(causal=True),
}


@pytest.mark.parametrize("schema, mode", sorted(TAG_WRITERS), ids=["-".join(key) for key in sorted(TAG_WRITERS)])
def test_every_fork_is_paired_with_its_branch_lengths(schema, mode):
    """One rule for the stats in both schemas and both modes: `forks` counts the block tags the
    policy wrote (the reader's blocks), and `path_lengths` has one entry per fork, in order: its
    branches' lengths as the reader finds them, [] for a block the response ended in before any
    branch opened (NPR: a guideline cut before </guideline>)."""
    model, tags = TAG_WRITERS[schema, mode](), NPR_TAGS if schema == "npr" else TAGS
    rollouts = []
    for seed in range(3):
        settings = SamplerSettings(paths=2 + seed, max_new_tokens=(40, 70, 100)[seed], max_path_tokens=8, max_blocks=3,
                                   seed=seed)
        rollouts += sample(model, PROMPTS, Policy(tags, mode), settings, eos_ids=[EOS], samples_per_prompt=16)
    for r in rollouts:
        blocks = r.trace.blocks
        assert r.stats.forks == len(blocks) == len(r.stats.path_lengths), (r.stats.forks, r.stats.path_lengths)
        assert r.stats.path_lengths == [[len(p) for p in b.paths] for b in blocks]
        saved = sum(sum(lengths) - max(lengths, default=0) for lengths in r.stats.path_lengths)
        assert r.stats.critical_path == len(r.ids) - saved
    # the premise: many forks, and (NPR) many responses that ended inside a guideline, before its
    # fork. Measured over 144 rollouts: forks 192 / 140 / 147 / 136 (p-r1 structured, causal, npr
    # structured, causal), blocks ended before their paths 0 / 13 / 83 / 78
    assert sum(r.stats.forks for r in rollouts) >= 100
    if schema == "npr":
        assert sum(not b.paths for r in rollouts for b in r.trace.blocks) >= 40


def test_greedy_output_does_not_depend_on_the_batch():
    model = rule_model()
    settings, greedy = SamplerSettings(max_new_tokens=40, max_path_tokens=6, paths=2), Policy(TAGS, temperature=0)
    alone = [sample(model, [p], greedy, settings, eos_ids=[EOS])[0] for p in PROMPTS]
    together = sample(model, PROMPTS + [[20, 21], list(range(30, 45))], greedy, settings, eos_ids=[EOS])
    fork_offsets = [b.open for r in together for b in r.trace.blocks]
    assert len(set(fork_offsets)) >= 3 and sum(b.valid for r in together for b in r.trace.blocks) >= 1
    for a, b in zip(alone, together):
        assert a.ids == b.ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


def test_the_kept_draw_buffer_samples_what_new_tensors_sample(monkeypatch):
    """At a real vocabulary (9,000 ids: the in-place draw, two-level inverse CDF) the sampler's draw
    buffer, kept for the call and grown as forks add lanes, gives the tokens and log-probs that a new
    tensor each step gives, bit for bit."""
    from nanopar.draw_in_place import CallDraw

    vocab = 9000
    tags = TagIds(*range(vocab - 6, vocab))
    model = tiny_qwen_model(arch="qwen3", vocab_size=vocab, seed=0)
    bias_logits(model, {**dict.fromkeys(tags.all(), 4.0), EOS: 1.0})
    policy, settings = Policy(tags), SamplerSettings(max_new_tokens=40, max_path_tokens=10, paths=3, seed=0)
    grown = []
    kept_buffer = CallDraw.buffer

    def watched(self, logits):
        buffer = kept_buffer(self, logits)
        grown.append(buffer.untyped_storage().data_ptr())
        return buffer

    monkeypatch.setattr(CallDraw, "buffer", watched)
    kept = sample(model, PROMPTS, policy, settings, eos_ids=[EOS], samples_per_prompt=2)
    monkeypatch.setattr(CallDraw, "buffer", lambda self, logits: None)
    fresh = sample(model, PROMPTS, policy, settings, eos_ids=[EOS], samples_per_prompt=2)
    assert sum(r.stats.forks for r in kept) > 0 and len(set(grown)) > 1  # forks grew the buffer
    assert len(set(grown)) < len(grown) / 4  # and most steps reused it
    assert [r.ids for r in kept] == [r.ids for r in fresh]
    assert [r.logprobs for r in kept] == [r.logprobs for r in fresh]


def test_bad_settings_are_clear_errors():
    model = tiny_qwen_model(vocab_size=V)
    with pytest.raises(Exception, match="paths per block must be between 2 and 8, got 9"):
        sample(model, PROMPTS, Policy(TAGS), SamplerSettings(paths=9), eos_ids=[])
    with pytest.raises(Exception, match="unknown attention mode 'seen'"):
        sample(model, PROMPTS, Policy(TAGS, "seen"), SamplerSettings(), eos_ids=[])


@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "4bit-lora"])
def test_lora_and_4bit_models_sample_consistently(four_bit, tmp_path):
    model, tokenizer = load_char_model(tmp_path, load_in_4bit=four_bit, lora=True)
    with torch.no_grad():  # a LoRA that is not the identity
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    tags = TagIds.from_tokenizer(tokenizer)
    bias_logits(model, dict.fromkeys(tags.all(), 3.0))
    settings = SamplerSettings(max_new_tokens=40, max_path_tokens=8, seed=0)
    prompts = [tokenizer.encode("12+30=", add_special_tokens=False), tokenizer.encode("7*6=", add_special_tokens=False)]
    rollouts = sample(model, prompts, Policy(tags, vocab_size=len(tokenizer)), settings, [tokenizer.eos_token_id],
                      samples_per_prompt=4)
    assert not model.training and sum(r.stats.forks for r in rollouts) >= 2
    for rollout in rollouts:
        expected = reread(model, rollout, "structured", tags, len(tokenizer))
        sampled = torch.tensor(rollout.sampled)
        assert (torch.tensor(rollout.logprobs) - expected)[sampled].abs().max() <= 1e-4
        assert max(rollout.ids) < len(tokenizer)  # the padded vocabulary is never drawn


@pytest.mark.parametrize("kind", ["lazy", "plain"])
def test_nothing_of_a_sampler_call_outlives_it_without_the_cyclic_collector(kind):
    """With the cyclic collector off, the lane cache of a finished call (forks, merges and finished
    lanes on the way) and every keys/values tensor its layers ever held are freed when `sample`
    returns: on a GPU they would otherwise stay allocated through the training read after it."""
    import gc
    import weakref

    from nanopar.kvcache import LaneCache, LazyLaneCache

    seen = []  # weak references: the lane cache, and every layer buffer it held at any step

    class Watched(LazyLaneCache if kind == "lazy" else LaneCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(weakref.ref(self))

        def appended(self):
            super().appended()
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values, getattr(layer, "key_buffer", layer.keys)):
                    seen.append(weakref.ref(t))

    model = tag_biased_model(tag_bias=2.5, eos_bias=1.0)
    settings = SamplerSettings(max_new_tokens=40, max_path_tokens=8, paths=3, seed=0)
    gc.collect()
    gc.disable()
    try:
        rollouts = sample(model, PROMPTS, Policy(TAGS), settings, eos_ids=[EOS], samples_per_prompt=2,
                          lane_cache=Watched)
        alive = sum(ref() is not None for ref in seen)
    finally:
        gc.enable()
    assert sum(r.stats.forks for r in rollouts) > 0 and len(seen) > 100  # the premise: forks and many steps
    assert alive == 0


class _HostTraffic:
    """Counts, over a sampler call's decode steps (from its first draw on), what a GPU would wait for:
    tensors made from Python data of one element or more (`torch.tensor`: a copy to the device each;
    0-dim ones are scalars, passed by value), and values read back (`tolist`; `item`, `bool` of a
    tensor: `aten._local_scalar_dense`). Also the decode forwards and the rebuilds."""

    def __init__(self, monkeypatch, model):
        from torch.utils._python_dispatch import TorchDispatchMode

        from nanopar import draw_in_place, kvcache

        self.decoding, self.steps, self.rebuilds, self.to_device, self.to_host = False, 0, 0, 0, 0
        counts = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if counts.decoding and func is torch.ops.aten.lift_fresh.default and args[0].dim() > 0:
                    counts.to_device += 1
                if counts.decoding and func is torch.ops.aten._local_scalar_dense.default:
                    counts.to_host += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        draw, tolist, rebuild = draw_in_place.draw, torch.Tensor.tolist, kvcache.LaneCache.rebuild

        def counted_draw(*args, **kwargs):
            counts.decoding = True
            return draw(*args, **kwargs)

        def counted_tolist(tensor):
            counts.to_host += counts.decoding
            return tolist(tensor)

        def counted_rebuild(cache, keep, extra):
            counts.rebuilds += counts.decoding
            return rebuild(cache, keep, extra)

        monkeypatch.setattr(draw_in_place, "draw", counted_draw)
        monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
        monkeypatch.setattr(kvcache.LaneCache, "rebuild", counted_rebuild)
        model.register_forward_pre_hook(lambda module, args, kwargs: setattr(self, "steps", self.steps + self.decoding),
                                        with_kwargs=True)


@pytest.mark.parametrize("mode", ["structured", "causal"])
def test_a_decode_step_copies_to_the_device_once_and_reads_back_once(mode, monkeypatch):
    """On a GPU every copy between host and device waits for the device. A decode step makes one each
    way: what the lanes are fed (tokens, positions, the tag each may not draw next) before the
    forward, the drawn tokens and their log-probs after the draw; a rebuild (forks, merges, finished
    lanes) adds one, its kept rows and their padding. Counted on a CPU, over calls with all of those."""
    model = tag_biased_model(tag_bias=2.5, eos_bias=1.0)
    traffic = _HostTraffic(monkeypatch, model)
    banned = []
    from nanopar import sampler as sampler_module

    kept_banned = sampler_module._Decoder.banned
    monkeypatch.setattr(sampler_module._Decoder, "banned",
                        lambda self, bans, ids: banned.append(max(bans) >= 0) or kept_banned(self, bans, ids))
    settings = SamplerSettings(max_new_tokens=40, max_path_tokens=8, paths=3, max_blocks=1, seed=0)
    with traffic.mode:
        rollouts = sample(model, PROMPTS, Policy(TAGS, mode), settings, eos_ids=[EOS], samples_per_prompt=4)
    # the premise: many steps, rebuilds, and steps whose draw had bans (max_blocks reached)
    assert traffic.steps >= 30 and traffic.rebuilds >= 5 and sum(banned) >= 10
    assert mode == "causal" or sum(r.stats.forks for r in rollouts) >= 5
    assert traffic.to_device == traffic.steps + traffic.rebuilds
    assert traffic.to_host == traffic.steps + 1  # one read back per draw (the last one has no forward after it)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("mode", ["structured", "causal"])
def test_decode_steps_read_each_kv_head_once(arch, mode, monkeypatch):
    """transformers' sdpa path repeats K and V to every query head when a mask is passed, except for
    a step of one query per row, where it folds each KV head's query heads into the query length
    (`pack_gqa`) and the kernel reads each KV head once. The sampler's decode steps are such steps
    (padded rows, hence a mask, in every call here): K and V are never repeated after the prefill, and
    every attention kernel of a decode step is handed the KV heads alone."""
    import transformers.integrations.sdpa_attention as sdpa
    from torch.utils._python_dispatch import TorchDispatchMode

    model = tiny_qwen_model(arch=arch, vocab_size=V, seed=0)  # 4 query heads, 2 KV heads
    bias_logits(model, {**dict.fromkeys(TAGS.all(), 2.5), EOS: 1.0})
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    assert heads > kv_heads and model.config._attn_implementation == "sdpa"
    decoding, repeats, kernels = [False], [], []
    model.register_forward_pre_hook(lambda module, args, kwargs: decoding.__setitem__(0, kwargs["input_ids"].shape[1] == 1),
                                    with_kwargs=True)
    repeat_kv = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda states, n: repeats.append(decoding[0]) or repeat_kv(states, n))

    class Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if decoding[0] and func.__name__.startswith("_scaled_dot_product"):
                kernels.append((args[1].shape[1], args[2].shape[1], (kwargs or {}).get("attn_mask")))  # (q, k, v, ...)
            return func(*args, **(kwargs or {}))

    settings = SamplerSettings(max_new_tokens=24, max_path_tokens=6, paths=2, seed=0)
    with Kernels():
        sample(model, PROMPTS, Policy(TAGS, mode), settings, eos_ids=[EOS], samples_per_prompt=2)
    assert repeats and not any(repeats)  # the prefill repeats (prompts of several tokens); no decode step does
    assert len(kernels) >= 20 and all(k == v == kv_heads for k, v, _ in kernels)
    assert sum(mask is not None for _, _, mask in kernels) >= 20  # the premise: masked steps


@pytest.mark.parametrize("vocab, kind", [(V, "LaneCache"), (9000, "LazyLaneCache")])
def test_the_lane_cache_follows_the_vocabulary(vocab, kind, monkeypatch):
    """Under the draw's threshold (the toy, tiny models) a call runs the plain LaneCache, whose rebuild
    copies where a reader looks; from it (a real vocabulary) the lazy one."""
    from nanopar import kvcache

    made, init = [], kvcache.LaneCache.__init__

    def watched(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(kvcache.LaneCache, "__init__", watched)
    model = tiny_qwen_model(vocab_size=vocab, seed=0)
    sample(model, PROMPTS, Policy(TagIds(*range(vocab - 6, vocab))), SamplerSettings(max_new_tokens=4), eos_ids=[])
    assert made == [kind]
