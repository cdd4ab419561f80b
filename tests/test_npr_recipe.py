"""NPR's rejection stage: what its filter keeps, beside Parallel-R1's cold-start filter (distill.py)."""

import pytest

import nanopar.distill
from conftest import text_rollout
from nanopar import NanoparError
from nanopar.data import Problem
from nanopar.distill import keep_traces
from nanopar.model import ModelSettings, load_model
from nanopar.policy import Policy
from nanopar.prompts import stop_ids
from nanopar.sampler import SamplerSettings
from nanopar.tags import NPR

ROUND = "<guideline><plan>1:add</plan>{more}</guideline><step>1:2+2=4</step>{steps}<takeaway>4</takeaway>\n"
TWO = ROUND.format(more="<plan>2:double</plan>", steps="<step>2:2*2=4</step>")
ONE = ROUND.format(more="", steps="")
TRIES = {  # problem id -> its tries (gold 4), and the first try each filter keeps (None: none)
    "two plans": ([TWO + "Final Answer: 5", TWO + "Final Answer: 4"], {"parallel": 1, "structured": 1}),
    "one plan": ([ONE + "Final Answer: 4", TWO + "Final Answer: 5"], {"parallel": None, "structured": 0}),
    "no tag": (["2+2=4\nFinal Answer: 4", "Final Answer: 4"], {"parallel": None, "structured": None}),
    "no label": ([TWO.replace("2:2*2", "2*2") + "Final Answer: 4", ONE + "Final Answer: 4"],
                 {"parallel": 0, "structured": 1}),  # the reading is parallel; NPR's text rules fail
    "wrong": ([TWO + "Final Answer: 3", ONE + "Final Answer: 3"], {"parallel": None, "structured": None}),
}


def scripted_keep(monkeypatch, keep):
    """keep_traces over TRIES with a stand-in sampler that returns each problem's tries."""
    model, tokenizer = load_model(ModelSettings("toy:model"), NPR)
    policy = Policy.for_tokenizer(tokenizer, "causal", schema=NPR)
    eos = stop_ids(model, tokenizer)
    problems = [Problem(name, f"question {name}", "4") for name in TRIES]
    prompts = {p.id: tokenizer.encode(p.question + "\n") for p in problems}
    by_prompt = {tuple(prompts[name]): tries for name, (tries, _) in TRIES.items()}

    def fake_sample(model, prompt_ids, policy, settings, eos_ids, samples):
        return [text_rollout(prompt, tokenizer.encode(text) + [eos_ids[0]], policy.tag_ids)
                for prompt in prompt_ids for text in by_prompt[tuple(prompt)][:samples]]

    monkeypatch.setattr(nanopar.distill, "sample", fake_sample)
    return keep_traces(model, tokenizer, policy, problems, [prompts[p.id] for p in problems], SamplerSettings(),
                       eos, tries=2, chunk=2, keep=keep)


@pytest.mark.parametrize("keep", ["parallel", "structured"])
def test_each_filter_keeps_the_first_correct_try_it_accepts(monkeypatch, keep):
    """"parallel" (Parallel-R1's cold start): correct and a valid parallel trace, read from the ids;
    "structured" (NPR's rejection): correct and in NPR's format, a round of one plan too, the text
    rules kept; a tagless answer passes neither."""
    kept = scripted_keep(monkeypatch, keep)
    expected = {name: TRIES[name][0][first] for name, (_, firsts) in TRIES.items() if (first := firsts[keep]) is not None}
    assert {record["id"]: record["response"] for record in kept} == expected


def test_an_unknown_filter_is_a_one_line_error(monkeypatch):
    with pytest.raises(NanoparError, match="unknown distill filter 'parallell': use one of parallel, structured"):
        scripted_keep(monkeypatch, "parallell")


KEPT_FLOOR = 0.6  # measured (seed 0, 48 problems x 8 tries after 3 format-RL steps): 39 kept, 81%


@pytest.mark.slow
def test_the_npr_recipe_keeps_traces_from_the_shipped_base_with_the_real_sampler(tmp_path):
    """The toy NPR recipe end to end up to its rejection stage, nothing scripted: the shipped
    instruct base, a few format-RL steps, then rejection sampling with the real sampler. The
    stage keeps a correct round in NPR's format for at least KEPT_FLOOR of its problems, and each
    kept trace passes NPR's filter when judged again from its text."""
    import train
    from conftest import read_metrics
    from nanopar.data import read_jsonl
    from nanopar.format import check_structured

    run = train.main(["--out", str(tmp_path), "--recipe", "npr", "--stages", "pretrain,format-rl,rejection",
                      "--rl-easy-steps", "3", "--prompts-per-step", "8", "--group-size", "8",
                      "--distill-problems", "48", "--eval-problems", "0", "--checkpoint-every", "0"])
    event = next(r for r in read_metrics(run) if r.get("event") == "distill")
    assert event["problems"] == 48 and event["kept_fraction"] >= KEPT_FLOOR, event
    kept = read_jsonl(run / "3-rejection" / "traces.jsonl")
    assert len(kept) == event["kept"] and all(check_structured(r["response"], NPR).ok for r in kept)
