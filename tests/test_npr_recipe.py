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
                       eos, tries=2, chunk=2, keep=keep).records


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


# --- traces the sampler's budgets cut are not kept (distill.budget_cuts)

LONG = TWO.replace("2:2*2=4", "2:4").replace("\n", "\nFinal Answer: 4")  # step 1 "1:2+2=4": 7 tokens after <step>
SHORT = LONG.replace("1:2+2=4", "1:4")  # steps of 3 tokens


def scripted_teacher(tokenizer, scripts: dict[str, str]):
    """The toy model made to write `scripts[question]` (then EOS) by a +100 logit on each next
    token, prompt by prompt (one lane per sampler call). Where the sampler inserts </step> in a
    step the script has not finished, the script goes on after its own </step>: a teacher whose
    step was cut and who carries on with the round. -> the model"""
    model, _ = load_model(ModelSettings("toy:model"), NPR)
    by_prompt = {tuple(tokenizer.encode(q + "\n")): tokenizer.encode(text) for q, text in scripts.items()}
    close, eos = tokenizer.convert_tokens_to_ids("</step>"), tokenizer.eos_token_id
    state = {}

    def write(module, args, kwargs, out):
        fed = kwargs["input_ids"][0].tolist()
        if len(fed) > 1:  # the prefill: a new prompt
            state["script"], state["at"] = by_prompt[tuple(fed)], 0
        elif state["at"] < len(state["script"]) and fed[0] == state["script"][state["at"]]:
            state["at"] += 1
        elif fed[0] == close:  # inserted: skip the rest of the step
            state["at"] = state["script"].index(close, state["at"]) + 1
        script, at = state["script"], state["at"]
        out.logits[:, -1, script[at] if at < len(script) else eos] += 100.0

    model.register_forward_hook(write, with_kwargs=True)
    return model


def distil_scripted(scripts: dict[str, str], settings: SamplerSettings):
    """keep_traces with the real sampler (causal, NPR's filter) over one problem per script, gold 4."""
    _, tokenizer = load_model(ModelSettings("toy:model"), NPR)
    model = scripted_teacher(tokenizer, scripts)
    policy = Policy.for_tokenizer(tokenizer, "causal", schema=NPR)
    problems = [Problem(q, q, "4") for q in scripts]
    prompts = [tokenizer.encode(q + "\n") for q in scripts]
    return model, tokenizer, policy, keep_traces(model, tokenizer, policy, problems, prompts, settings,
                                                 stop_ids(model, tokenizer), tries=1, chunk=1, keep="structured")


def test_a_trace_whose_step_the_path_budget_cut_is_not_kept():
    """A teacher whose step 1 runs 7 tokens, sampled with --max-path-tokens 5: the sampler closes
    the step after "1:2+2" and the teacher carries on, so the response is a correct, well-formed
    round that NPR's filter keeps; it is dropped as cut. A teacher whose steps fit is kept."""
    from nanopar.distill import keeps
    from nanopar.rewards import response_text
    from nanopar.sampler import sample

    settings = SamplerSettings(max_path_tokens=5, seed=0)
    model, tokenizer, policy, distilled = distil_scripted({"long": LONG, "short": SHORT}, settings)
    # the cut, read from the sampler's own output: an inserted </step>, and the filter accepts it
    (cut,) = sample(model, [tokenizer.encode("long\n")], policy, settings, stop_ids(model, tokenizer))
    text = response_text(cut, tokenizer, stop_ids(model, tokenizer))
    assert text == LONG.replace("1:2+2=4", "1:2+2")
    close = tokenizer.convert_tokens_to_ids("</step>")
    assert [s for t, s in zip(cut.ids, cut.sampled) if t == close] == [False, True]
    assert keeps("structured", text, cut.trace, Problem("long", "long", "4"))
    assert [r["response"] for r in distilled.records] == [SHORT]
    assert distilled.dropped == 1 and distilled.cuts == {"path": 1, "blocks": 0, "plans": 0, "length": 0}


@pytest.mark.parametrize("budget, cut", [({"max_blocks": 1}, "blocks"), ({"paths": 2}, "plans"),
                                         ({"max_new_tokens": 36}, "length"), ({}, None)])
def test_a_trace_a_budget_ban_or_the_response_budget_shaped_is_not_kept(budget, cut):
    """The short teacher (one round of two plans, 36 tokens before EOS): with --max-blocks 1 the
    block tag was banned after its round, with a plan cap of 2 a third plan after its second, and
    with 36 new tokens the response ends before its EOS (the answer written): each is dropped;
    at the default budgets it is kept."""
    _, tokenizer = load_model(ModelSettings("toy:model"), NPR)
    assert len(tokenizer.encode(SHORT)) == 36
    *_, distilled = distil_scripted({"short": SHORT}, SamplerSettings(seed=0, **budget))
    assert [r["response"] for r in distilled.records] == ([] if cut else [SHORT])
    assert distilled.dropped == (1 if cut else 0)
    assert {name for name, n in distilled.cuts.items() if n} == ({cut} if cut else set())
