"""bench/memory.py: the plan's figures against a hand computation from the stored coefficients, its
recommendations against the rule they state, and its command line (--help starts nothing, a bad model
name is one line). The measurement itself takes minutes of real-shape models: not here."""

import json
import sys

import pytest

from conftest import ROOT

sys.path.append(str(ROOT / "bench"))  # as `python bench/memory.py` has it: its helpers beside it
import memory  # noqa: E402

GiB = 2**30
STORED = json.loads((ROOT / "docs" / "memory_coefficients.json").read_text())


def test_the_default_plan_is_its_components_computed_by_hand():
    """Qwen2.5-0.5B, 8 prompts x 8 samples x 1,024 new tokens, prompts of 320, 2 paths, 4 blocks,
    micro-batch 2 with checkpointing, the library's chunk: each component from the JSON's numbers."""
    c, depth = STORED["models"]["qwen2.5-0.5b"], 24
    T = 320 + 1024 + 4 * (2 * 2 + 2)  # prompt + sampled + per block K <Path>, K </Path>, </Parallel>, <Summary>
    weights = c["weights"]["fixed"] + depth * c["weights"]["per_layer"]
    lora = c["lora"]["fixed"] + depth * c["lora"]["per_layer"]
    adam = c["adam"]["fixed"] + depth * c["adam"]["per_layer"]
    kv = c["kv_per_token_layer"] * depth * T * (8 * 8 * 2)  # every response inside a 2-path block
    d = c["decode"]
    decode = max(c["embedding_forward"], 128 * (d["per_row"] + d["per_row_column"] * T), d["head_const"] + 128 * d["head_per_row"])
    a, mask = c["activations"]["checkpointing"], c["mask_bytes_per_element"]
    activations = 2 * ((a["fixed"] + depth * a["per_layer"] - mask * c["T0"] ** 2) * T / c["T0"] + mask * T**2)
    chunk = c["chunk"]["const"] + 221 * c["chunk"]["per_token"]  # 221 positions: below the largest measured chunk
    plan = memory.predict("qwen2.5-0.5b")
    assert T == 1368 and memory.DEFAULT_CHUNK == 221 and activations + chunk > c["embedding_train"]  # the premises
    assert plan["weights"] == int(weights) and plan["lora"] == plan["grads"] == int(lora) and plan["adam"] == int(adam)
    assert plan["kv_cache"] == kv and plan["kv_cache_no_fork"] == kv // 2 and plan["decode_step"] == int(decode)
    assert plan["activations"] == int(activations) and plan["logits_chunk"] == int(chunk)
    assert plan["sampling_peak"] == int(weights) + int(lora) + int(adam) + kv + int(decode)
    assert plan["training_peak"] == int(weights) + 2 * int(lora) + int(adam) + int(activations) + int(chunk)
    assert round(plan["sampling_peak"] / GiB, 2) == 2.95 and round(plan["training_peak"] / GiB, 2) == 1.28  # docs/gpu.md's


def test_the_plain_read_and_a_chunk_past_the_measured_ones_scale_by_tokens():
    c = STORED["models"]["qwen3-1.7b"]
    read = 2 * (1368 - 1)  # micro-batch 2 reads every position but the last of each row
    plain = memory.predict("qwen3-1.7b", chunk_tokens=0)["logits_chunk"]
    assert plain == int(read * STORED["plain_read_per_token"]["qwen3-1.7b"])
    largest = c["chunk"]["at"]["442"]
    assert memory.predict("qwen3-1.7b", chunk_tokens=884)["logits_chunk"] == int(largest * 2)


def test_a_recommendation_fits_its_card_and_the_next_larger_setting_does_not():
    config = memory.PlanConfig()
    for name in memory.MODELS:
        for gib in (12, 24):
            r = memory.recommend(name, gib, config, memory.STORED["models"][name])
            assert r is not None and r["sampling"] * 1.1 + GiB <= gib * GiB and r["training"] * 1.1 + GiB <= gib * GiB
            larger = memory.predict(name, prompts=r["prompts"], micro_batch=2 * r["micro_batch"],
                                    checkpointing=r["checkpointing"])["training_peak"]
            assert r["micro_batch"] == 16 or larger * 1.1 + GiB > gib * GiB
    # the docs' Qwen3-0.6B on 12 GiB: sampling decides, 2 prompts
    assert memory.recommend("qwen3-0.6b", 12, config, memory.STORED["models"]["qwen3-0.6b"])["prompts"] == 2


def test_help_starts_nothing_and_a_bad_model_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        memory.main(["--help"])
    assert stop.value.code == 0 and "--measure" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        memory.main(["--model", "qwen9"])
    assert str(stop.value.code).startswith("bench/memory.py: unknown model 'qwen9'") and "\n" not in str(stop.value.code)


def test_the_plan_prints_the_documented_figures(capsys):
    memory.main(["--model", "qwen2.5-1.5b"])
    out = capsys.readouterr().out
    assert "SAMPLING PEAK" in out and " 6.36" in out and " 8.88" in out  # docs/gpu.md's Qwen2.5-1.5B peaks
    assert "--prompts-per-step 8 --micro-batch 2 (or --micro-batch-tokens 2736)" in out


@pytest.mark.slow
def test_the_measurement_runs_on_a_micro_qwen_and_counts_the_lora_by_hand(monkeypatch):
    """--measure's every phase on a Qwen2 of hidden 64 and a 1,024-id vocabulary (seconds, not the hour of
    the real shapes): every coefficient the plan reads comes out, LoRA r4 and the tag rows are the bytes a
    hand count gives, the KV cache the formula's."""
    monkeypatch.setattr(memory, "VOCAB", 1024)
    monkeypatch.setitem(memory.MODELS, "micro", ("qwen2", 64, 24, 4, 2, 16, 128, 900))
    monkeypatch.setattr(memory, "CHUNKS", (8, 16))
    c = memory.measure_model("micro", 64, 8, 4)
    assert sorted(c) == sorted(STORED["models"]["qwen2.5-0.5b"])
    projections = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]  # q k v o gate up down
    assert c["lora"] == {"fixed": 6 * 64 * 4, "per_layer": sum(4 * (n_in + n_out) * 4 for n_in, n_out in projections)}
    assert c["adam"] == {k: 2 * v for k, v in c["lora"].items()}
    assert abs(c["kv_per_token_layer"] - 2 * 2 * 16 * 2) <= 0.05 * 128  # K and V x kv heads x head_dim x bf16 bytes
    assert memory.predict("micro", coefficients=c)["sampling_peak"] > c["weights"]["fixed"]
