"""One reward number everywhere: what `eval.py --rescore` computes for a saved response is what
GRPO paid for it, because both read the trace the sampler read from the token ids."""

import statistics

import pytest

import eval as eval_script
import train
from conftest import text_rollout
from nanopar.data import Problem, read_jsonl, write_jsonl
from nanopar.evaluation import read_from_text, record_trace, rescore, sample_record
from nanopar.prompts import stop_ids
from nanopar.rewards import REWARDS, score
from nanopar.tags import TagIds, add_tag_tokens
from nanopar.tiny import char_tokenizer, tiny_qwen_model
from nanopar.trace import parse_ids, parse_trace, trace_stats

BUILT_IN = sorted(REWARDS)  # at import: before any test registers its own
RUN = ["--model", "tiny:qwen3", "--skip", "pretrain,sft", "--stages", "rl-easy", "--rl-easy-steps", "2",
       "--prompts-per-step", "3", "--group-size", "4", "--max-new-tokens", "40", "--max-path-tokens", "12",
       "--eval-problems", "0", "--save-rollouts"]


USER_REWARD = """
from nanopar.rewards import register
from nanopar.trace import trace_stats

@register("saved_share")  # the README's kind of reward: it reads the trace's lengths (tokens in training)
def saved_share(text, trace, problem):
    stats = trace_stats(trace)
    return 1 - stats.critical_path / stats.length if stats.length else 0.0
"""


@pytest.mark.slow
def test_rescoring_a_stages_saved_rollouts_gives_what_it_paid_for_every_reward(tmp_path, capsys, registry):
    """A random tiny model writes tags anywhere (stray tags, cut blocks, blocks of 1-3 paths): every
    built-in reward and a user's that reads lengths, each at its own power of ten so that no two
    can trade off, re-scored from rollouts.jsonl equals the reward the GRPO step paid, response by
    response."""
    (tmp_path / "mine.py").write_text(USER_REWARD)
    spec = ",".join(f"{name}:{10 ** i}" for i, name in enumerate([*BUILT_IN, "saved_share"]))
    run = train.main(["--out", str(tmp_path / "run"), *RUN, "--easy-reward", spec, "--reward-file",
                      str(tmp_path / "mine.py")])
    records = read_jsonl(run / "1-rl-easy" / "rollouts.jsonl")
    assert [r["step"] for r in records] == [1] * 12 + [2] * 12
    assert any(r["blocks"] for r in records) and any(r["structure"]["stray"] for r in records)
    paid = [r["paid"] for r in records]
    assert len(set(paid)) > 2  # the rewards vary: the comparison can fail
    assert [result.total for result in rescore(records, spec)] == pytest.approx(paid, abs=1e-9)
    steps = [m for m in read_jsonl(run / "metrics.jsonl") if "reward" in m]
    assert [m["reward"] for m in steps] == pytest.approx([statistics.fmean(paid[:12]), statistics.fmean(paid[12:])])
    assert any(0 < r.components["saved_share"] < 1 for r in rescore(records, spec))  # some responses forked
    report = eval_script.main(["--rescore", str(run / "1-rl-easy" / "rollouts.jsonl"), "--reward", spec,
                               "--reward-file", str(tmp_path / "mine.py")])
    assert report["all"]["mean"] == pytest.approx(statistics.fmean(paid))
    assert "read from the text" not in capsys.readouterr().out


def blocked_response(tokenizer, tag_ids: TagIds) -> list[int]:
    """ids of a valid block whose first path writes "<Path>" as characters (not the tag token),
    then a correct answer and EOS."""
    piece = lambda text: [i for c in text for i in tokenizer.encode(c, add_special_tokens=False)]  # by character
    path = lambda text: [tag_ids.path_open] + piece(text) + [tag_ids.path_close]
    return (piece("so ") + [tag_ids.block_open] + path("try <Path> 2+2") + path("4") + [tag_ids.block_close]
            + [tag_ids.summary_open] + piece("4") + [tag_ids.summary_close] + piece("Final Answer: 4")
            + [tokenizer.eos_token_id])


def test_a_record_keeps_the_trace_the_sampler_read_not_the_one_its_text_spells(tmp_path, capsys):
    """Tags written as characters are text to the sampler and the trainer, tags to a reading of
    the text; lengths are tokens to training and characters to the text. The record's trace is the
    sampler's; a record without token ids is read from its text, and eval.py says how many."""
    tokenizer = char_tokenizer()
    tag_ids = add_tag_tokens(tokenizer, tiny_qwen_model(vocab_size=128))
    problem = Problem("p1", "2+2?", "4")
    rollout = text_rollout(tokenizer.encode("2+2?", add_special_tokens=False), blocked_response(tokenizer, tag_ids),
                           tag_ids)
    record = sample_record(rollout, problem, 0, tokenizer, stop_ids(None, tokenizer))
    sampled = record_trace(record)
    assert sampled == parse_ids(rollout.ids, tag_ids) and not read_from_text(record)
    spelled = parse_trace(record["response"])
    assert spelled.stray == [23] and sampled.stray == []  # the spelled <Path>: a tag inside a path, stray
    assert trace_stats(spelled).length == len(record["response"]) != trace_stats(sampled).length == len(rollout.ids)
    for name in ("format", "parallel-strict", "valid_parallel"):  # format reads the text (Algorithm 1) either way
        assert rescore([record], name)[0].total == score(name, record["response"], rollout.trace, problem).total
    assert rescore([record], "parallel-strict")[0].total == 1.0  # as sampled: correct in a valid block
    assert score("parallel-strict", record["response"], spelled, problem).total == -1.0  # as spelled: a stray tag
    old = {k: v for k, v in record.items() if k != "tag_ids"}  # saved before records kept the tag ids
    assert read_from_text(old) and rescore([old], "parallel-strict")[0].total == -1.0
    write_jsonl(tmp_path / "samples.jsonl", [record, old])
    eval_script.main(["--rescore", str(tmp_path / "samples.jsonl"), "--reward", "parallel-strict"])
    assert "1 of 2 responses keep no token ids: their traces are read from the text" in capsys.readouterr().out


def test_a_records_tag_ids_must_be_its_schemas():
    record = {"id": "p", "answer": "4", "response": "x", "ids": [5], "tag_ids": {"block_open": 1}}
    with pytest.raises(Exception, match=r"samples.jsonl:3: tag ids by role \['block_open'\]: schema 'parallel-r1'"):
        record_trace(record, "samples.jsonl:3")
