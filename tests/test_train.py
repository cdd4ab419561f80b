"""train.py end to end on the toy world: stages, checkpoints, resume, Ctrl-C, bad input."""

import json
import statistics

import pytest
import torch

import nanopar.distill
import nanopar.grpo
import nanopar.heldout
import nanopar.model
import nanopar.results
import nanopar.runner
import nanopar.stage_steps
import train
from conftest import one_line, read_metrics, reward_file, text_rollout
from nanopar import NanoparError, toy
from nanopar.checkpoint import latest_checkpoint, save_checkpoint
from nanopar.curriculum import baseline_of, recipe
from nanopar.data import read_jsonl
from nanopar.distill import Distilled
from nanopar.format import check_parallel
from nanopar.model import ModelSettings, load_model
from nanopar.results import evaluation_key
from nanopar.show import STAGE_ROWS
from nanopar.tags import NPR, schema_named

SMALL = ["--pretrain-steps", "3", "--sft-steps", "2", "--rl-easy-steps", "3", "--rl-hard-steps", "2",
         "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "40", "--max-path-tokens", "12",
         "--sft-batch", "8", "--checkpoint-every", "1", "--keep-checkpoints", "0", "--lr", "1e-3",
         "--easy-reward", "format", "--hard-reward", "format",  # untrained: format varies, accuracy is all -1
         "--eval-problems", "2", "--eval-samples", "1"]


def weights(folder):
    model, _ = load_model(ModelSettings(str(folder)))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def final_weights(run):
    return weights(run / "4-rl-hard" / "final")


def crash_on_call(monkeypatch, n, error):
    """Make the n-th call of the sampler inside a GRPO step raise `error`."""
    real, calls = nanopar.grpo.sample, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(nanopar.grpo, "sample", flaky)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    straight = train.main(["--out", str(tmp_path / "a"), *SMALL, "--save-rollouts"])
    metrics = read_metrics(straight)
    assert [m["step"] for m in metrics if m.get("stage") == "rl-easy" and "step" in m] == [1, 2, 3]
    assert (straight / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    # the same run, killed during rl-easy's third step (the 3rd sampling call), then run again
    crash_on_call(monkeypatch, 3, RuntimeError("power cut"))
    with pytest.raises(RuntimeError, match="power cut"):
        train.main(["--out", str(tmp_path / "b"), *SMALL, "--save-rollouts"])
    assert latest_checkpoint(tmp_path / "b" / "3-rl-easy").name == "checkpoint-2"
    monkeypatch.undo()
    resumed = train.main(["--out", str(tmp_path / "b"), *SMALL, "--save-rollouts"])
    a, b = final_weights(straight), final_weights(resumed)
    saved = [read_jsonl(run / "3-rl-easy" / "rollouts.jsonl") for run in (straight, resumed)]  # step 3's once
    assert [r["step"] for r in saved[1]] == [1] * 8 + [2] * 8 + [3] * 8
    assert [(r["ids"], r["paid"]) for r in saved[0]] == [(r["ids"], r["paid"]) for r in saved[1]]
    assert max((a[n] - b[n]).abs().max().item() for n in a) <= 1e-6
    assert any((a[n] - weights(tmp_path / "a" / "2-sft" / "final")[n]).abs().max() > 0 for n in a)  # training did move them
    lines = read_metrics(resumed)
    assert [m["step"] for m in lines if m.get("stage") == "rl-easy" and "step" in m] == [1, 2, 3]


def test_a_stage_killed_before_its_first_checkpoint_starts_over_and_logs_each_step_once(tmp_path, monkeypatch):
    args = ["--out", str(tmp_path), *SMALL, "--checkpoint-every", "0"]
    crash_on_call(monkeypatch, 3, RuntimeError("out of memory"))  # rl-easy's third step, before any checkpoint
    with pytest.raises(RuntimeError, match="out of memory"):
        train.main(args)
    assert latest_checkpoint(tmp_path / "3-rl-easy") is None
    assert [m["step"] for m in read_metrics(tmp_path) if m.get("stage") == "rl-easy" and "step" in m] == [1, 2]
    monkeypatch.undo()
    train.main(args)
    assert [m["step"] for m in read_metrics(tmp_path) if m.get("stage") == "rl-easy" and "step" in m] == [1, 2, 3]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_the_same_command_resumes(tmp_path, monkeypatch):
    args = ["--out", str(tmp_path), *SMALL, "--checkpoint-every", "0"]
    crash_on_call(monkeypatch, 2, KeyboardInterrupt())
    with pytest.raises(SystemExit, match="interrupted: saved .*checkpoint-1; the same command resumes"):
        train.main(args)
    assert latest_checkpoint(tmp_path / "3-rl-easy").name == "checkpoint-1"
    monkeypatch.undo()
    train.main(args)
    assert (tmp_path / "4-rl-hard" / "final").is_dir()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rl_easy_steps"] == 3 and config["model"] == "toy:model"


def test_an_interrupted_save_leaves_no_checkpoint_folder(tmp_path, monkeypatch):
    model, tokenizer = load_model(ModelSettings("toy:model"))
    save_checkpoint(tmp_path / "checkpoint-1", model, tokenizer, step=1)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "checkpoint-2", model, tokenizer, step=2)
    assert not (tmp_path / "checkpoint-2").exists()
    assert latest_checkpoint(tmp_path).name == "checkpoint-1"
    with pytest.raises(OSError):  # replacing an existing checkpoint keeps the old one whole
        save_checkpoint(tmp_path / "checkpoint-1", model, tokenizer, step=5)
    assert (tmp_path / "checkpoint-1" / "trainer_state.pt").is_file()


def half_right_sampler(monkeypatch):
    """A stand-in for the sampler of a distill stage over the first 6 toy problems of each level (NPR's
    rejection reads both): a teacher trace in the policy's schema for every other problem, a wrong
    answer for the rest."""
    import random

    from nanopar.toy import npr_trace, parallel_trace, toy_problems

    problems = {p.question: p for level in ("easy", "hard") for p in toy_problems(f"toy:{level}")[:6]}
    wrong = {question: k % 2 for k, question in enumerate(problems)}  # every other problem of each level
    tokenizers = {}  # schema name -> the toy tokenizer with its tags
    seen = []  # (decoded prompt, attention mode) of every prompt sampled

    def fake_sample(model, prompts, policy, settings, eos, samples_per_prompt):
        schema = policy.tag_ids.schema
        if schema.name not in tokenizers:
            tokenizers[schema.name] = load_model(ModelSettings("toy:model"), schema)[1]
        tokenizer = tokenizers[schema.name]
        rollouts = []
        for i, prompt in enumerate(prompts):
            seen.append((tokenizer.decode(prompt), policy.mode))
            question = tokenizer.decode(prompt).strip().splitlines()[-1]  # the question: the last line
            write = npr_trace if schema.planned else parallel_trace
            good = write(problems[question], random.Random(i), schema=schema)
            texts = [good.replace("Final Answer:", "Final Answer: 99+") if wrong[question] else good] * samples_per_prompt
            for text in texts:
                rollouts.append(text_rollout(prompt, tokenizer.encode(text) + [tokenizer.eos_token_id], policy.tag_ids))
        return rollouts

    monkeypatch.setattr(nanopar.distill, "sample", fake_sample)
    monkeypatch.setattr(nanopar.toy.source, "TOY_TRAIN_PROBLEMS", 6)
    return seen


def test_distill_keeps_one_correct_valid_trace_per_problem(tmp_path, monkeypatch):
    """Cold-start data: with a 'model' that writes a teacher trace for half the tries and a wrong
    answer for the rest, the stage keeps exactly the problems with a correct, valid trace."""
    half_right_sampler(monkeypatch)
    with pytest.raises(NanoparError, match="rl-easy starts from stage sft, which is not done"):
        train.main(["--out", str(tmp_path), "--sft-data", "", "--pretrain-data", "", "--stages",
                    "cold-start-data,rl-easy", "--distill-tries", "2"])
    kept = read_jsonl(tmp_path / "1-cold-start-data" / "traces.jsonl")
    assert len(kept) == 3 and all("Final Answer: 99+" not in r["response"] for r in kept)
    log = read_metrics(tmp_path)
    assert [r["kept_fraction"] for r in log if r.get("event") == "distill"] == [0.5]


def test_a_teacher_writes_the_cold_start_data(tmp_path, monkeypatch, capsys):
    """--teacher: cold-start-data samples the named model, not its input model (here the
    pretrain stage's final/, which does not even exist); NPR's rejection stage ignores it."""
    half_right_sampler(monkeypatch)
    loaded, real = [], nanopar.model.load_model
    monkeypatch.setattr(nanopar.model, "load_model",
                        lambda settings, schema: loaded.append(settings.name_or_path) or real(ModelSettings("toy:model"), schema))
    train.main(["--out", str(tmp_path), "--sft-data", "", "--stages", "cold-start-data",
                "--teacher", "Qwen/Qwen2.5-7B-Instruct"])
    assert loaded == ["Qwen/Qwen2.5-7B-Instruct"]
    assert len(read_jsonl(tmp_path / "2-cold-start-data" / "traces.jsonl")) == 3
    assert [r["kept_fraction"] for r in read_metrics(tmp_path) if r.get("event") == "distill"] == [0.5]
    assert "cold-start-data: kept 3 of 6 problems (50.0%)" in capsys.readouterr().out
    config = train.resolved_config(["--recipe", "npr", "--teacher", "Qwen/Qwen2.5-7B-Instruct"])[0]
    assert [s.teacher for s in recipe(config)] == [""] * 5  # self-distillation


@pytest.mark.parametrize(
    "args, message",
    [
        (["--easy-reward", "acuracy"], "unknown reward 'acuracy'"),
        (["--recipe", "grpo"], "unknown recipe 'grpo': use one of parallel-r1, npr"),
        (["--stages", "sft,rl"], "unknown stage(s) rl: this recipe has pretrain, sft, rl-easy, rl-hard"),
        (["--instructions", "verbose"], "unknown instructions 'verbose'"),
        (["--easy-data", "missing.jsonl"], "benchmark or file not found: missing.jsonl"),
        (["--preset", "huge"], "unknown preset 'huge': use one of long"),
        (["--eval-data", "toy:medium:heldout"], "unknown toy data 'toy:medium:heldout'"),
        (["--skip", "rl-esay"], "unknown stage(s) rl-esay: this recipe has pretrain, sft, rl-easy, rl-hard"),
        (["--sft-data", "", "--skip", "cold-start-data"], "--skip cold-start-data: stage sft reads its traces"),
        (["--stages", "sft", "--hard-reward", "acuracy"], "unknown reward 'acuracy'"),  # a stage not run
        (["--paths", "0"], "paths per block must be between 2 and 8, got 0"),
        (["--lr", "0"], "--lr must be > 0, not 0"),
        (["--group-size", "1"], "--group-size must be >= 2 (GRPO compares a prompt's responses), not 1"),
        (["--sft-lr", "-0.001"], "--sft-lr must be > 0, not -0.001"),
    ],
)
def test_bad_flags_are_one_line_errors(args, message, tmp_path):
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path), *SMALL, "--stages", "rl-easy", *args]
                   if "--stages" not in args else ["--out", str(tmp_path), *SMALL, *args])
    assert one_line(error).startswith(message)


def test_bad_input_fails_before_any_model_loads(tmp_path, monkeypatch):
    """A misspelt reward of a later stage, a bad sampler setting, an empty traces file: each is a
    one-line error before a model loads, and no stage folder is left behind."""
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(nanopar.model, "load_model", no_model)
    (tmp_path / "empty.jsonl").write_text("")
    for args, message in ((["--stages", "sft", "--hard-reward", "acuracy"], "unknown reward 'acuracy'"),
                          (["--stages", "sft", "--paths", "0"], "paths per block must be between 2 and 8"),
                          (["--stages", "sft", "--eval-batch", "0"], "--eval-batch must be >= 1"),
                          (["--stages", "sft", "--sft-data", str(tmp_path / "empty.jsonl")],
                           f"sft: no traces in {tmp_path / 'empty.jsonl'}")):
        with pytest.raises(NanoparError) as error:
            train.main(["--out", str(tmp_path / "run"), *SMALL, "--pretrain-data", "", *args])
        assert one_line(error).startswith(message)
        assert not [p for p in (tmp_path / "run").glob("*") if p.is_dir()]


def test_ctrl_c_during_an_evaluation_is_one_line(tmp_path, monkeypatch):
    """Ctrl-C while a stage's model is evaluated: one line saying the model is saved, no traceback;
    the next run evaluates it again."""
    def interrupted(self, stage):
        raise KeyboardInterrupt

    monkeypatch.setattr(nanopar.heldout.HeldOut, "evaluate", interrupted)
    with pytest.raises(SystemExit) as stop:
        train.main(["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--stages", "sft"])
    assert str(stop.value) == (f"interrupted during the evaluation of sft: its model is saved in "
                               f"{tmp_path / '1-sft' / 'final'}; the same command evaluates it again")
    assert (tmp_path / "1-sft" / "final").is_dir()


def test_a_broken_traces_file_names_its_line(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text('{"question": "q", "answer": "1", "response": "r"}\n{"question": \n')
    with pytest.raises(NanoparError, match=r"traces.jsonl:2: not valid JSON"):
        train.main(["--out", str(tmp_path / "run"), *SMALL, "--pretrain-data", "", "--sft-data", str(path)])


def test_a_reward_file_adds_a_reward_selectable_by_name(tmp_path, registry):
    path = reward_file(tmp_path, "short_and_right", shorter_than=50)
    args = ["--out", str(tmp_path / "run"), *SMALL, "--reward-file", str(path), "--easy-reward",
            "short_and_right:1,format:0.1", "--stages", "rl-easy"]
    with pytest.raises(NanoparError, match="rl-easy starts from stage sft"):  # validation passed first
        train.main(args)
    from nanopar.rewards import score
    from nanopar.toy import make_problems
    from nanopar.trace import parse_trace

    problem = make_problems("easy", 1, seed=0)[0]  # numbers 7 7 1 target 49, answer 7*(7*1)
    assert problem.extra["numbers"] == [7, 7, 1] and problem.extra["target"] == 49
    assert score("short_and_right", "Final Answer: 7*7*1", parse_trace(""), problem).total == 1.0
    with pytest.raises(NanoparError, match="reward file not found: nope.py"):
        train.main(["--out", str(tmp_path / "run"), "--reward-file", "nope.py"])


def test_the_baseline_starts_from_the_base_and_every_stage_is_evaluated(tmp_path):
    args = ["--out", str(tmp_path), *SMALL, "--baseline", "--pretrain-steps", "1", "--checkpoint-every", "0",
            "--micro-batch-tokens", "300"]  # SFT and GRPO micro-batches packed by a token budget
    train.main(args)
    config = train.resolved_config(args)[0]
    stages = recipe(config)
    runner = nanopar.runner.Runner(config, stages)
    names = [s.name for s in stages]
    assert names == ["pretrain", "sft", "rl-easy", "rl-hard", "baseline-rl-easy", "baseline-rl-hard"]
    assert runner.input_model(stages[4]) == str(tmp_path / "1-pretrain" / "final")  # the base, not the SFT model
    assert runner.input_model(stages[5]) == str(tmp_path / "5-baseline-rl-easy" / "final")
    log = read_metrics(tmp_path)
    assert {r["reward_spec"]["accuracy"] for r in log if r.get("stage", "").startswith("baseline") and "step" in r} == {1.0}
    assert all(r["kv_cache_mb"] > 0 for r in log if "reward_spec" in r)  # every GRPO step logs the sampler's cache
    evaluated = [r["stage"] for r in log if r.get("event") == "eval"]
    assert evaluated == names  # once each, in order
    for stage, folder in zip(stages, sorted(tmp_path.glob("[0-9]-*"))):
        results = json.loads((folder / "eval.json").read_text())["results"]
        assert list(results) == ["toy:easy:heldout", "toy:hard:heldout"]
        assert all(r["problems"] == 2 and r["samples"] == 2 and len(r["per_problem"]) == 2 for r in results.values())
    assert not any("per_problem" in result for r in log if r.get("event") == "eval" for result in r["results"].values())
    table = train.summary(config, stages, stages)  # STAGE_ROWS, "vs its start", "vs baseline" and "its reward" per set
    shown = [row for row in STAGE_ROWS if not row.optional]  # the toy's sets hold no reference traces
    assert [c.header for c in table.columns] == ["", *names] and table.row_count == 3 + 2 * (len(shown) + 3)
    rows = list(table.columns[0].cells)
    hard = json.loads((tmp_path / "4-rl-hard" / "eval.json").read_text())["results"]["toy:hard:heldout"]
    start = json.loads((tmp_path / "3-rl-easy" / "eval.json").read_text())["results"]["toy:hard:heldout"]
    assert list(table.columns[4].cells)[rows.index("hard: accuracy")] == f"{100 * hard['accuracy']:.1f}%"
    # rl-hard's own reward is `format` (SMALL): its cell is the held-out mean of that reward, then the
    # change over rl-easy's model paired problem by problem, computed here from the two eval.json files
    assert nanopar.results.own_reward(stages[3]) == "format"
    reward_row = rows.index("hard: its reward (vs start)")

    def reward_cell(after, before):
        change = [after[k] - before[k] for k in sorted(after)]
        return f"{statistics.fmean(after.values()):.2f} ({statistics.fmean(change):+.2f} ± " \
               f"{statistics.stdev(change) / len(change) ** 0.5:.2f})"

    assert hard["reward_means"]["format"] == pytest.approx(statistics.fmean(hard["rewards"]["format"].values()))
    assert list(table.columns[4].cells)[reward_row] == reward_cell(hard["rewards"]["format"], start["rewards"]["format"])
    # rl-hard against the baseline's rl-hard, the same way, from that stage's eval.json on the same problems
    twin = json.loads((tmp_path / "6-baseline-rl-hard" / "eval.json").read_text())["results"]["toy:hard:heldout"]
    gap = [hard["per_problem"][k] - twin["per_problem"][k] for k in sorted(hard["per_problem"])]
    assert list(table.columns[4].cells)[rows.index("hard: vs baseline")] == \
        f"{100 * statistics.fmean(gap):+.1f} ± {100 * statistics.stdev(gap) / len(gap) ** 0.5:.1f}"
    assert list(table.columns[2].cells)[reward_row] == "-"  # sft trains on no reward
    # the tiny run changes no hard problem's reward: give rl-hard's evaluation known, unequal ones
    # (its key kept, so the table reads them) and check the paired change's sign and size by hand
    saved = json.loads((tmp_path / "4-rl-hard" / "eval.json").read_text())
    before = start["rewards"]["format"]
    after = {k: before[k] + shift for k, shift in zip(sorted(before), (1.0, 0.5))}
    saved["results"]["toy:hard:heldout"]["rewards"]["format"] = after
    saved["results"]["toy:hard:heldout"]["reward_means"]["format"] = statistics.fmean(after.values())
    (tmp_path / "4-rl-hard" / "eval.json").write_text(json.dumps(saved))
    cell = list(train.summary(config, stages, stages).columns[4].cells)[reward_row]
    assert cell == f"{statistics.fmean(after.values()):.2f} (+0.75 ± 0.25)"  # differences 1.0 and 0.5
    train.main(args)  # everything done: nothing is trained or evaluated again
    again = read_metrics(tmp_path)
    assert len(again) == len(log)
    train.main([*args, "--eval-problems", "3"])  # other evaluation flags: evaluated again, not trained
    third = read_metrics(tmp_path)
    assert [r["event"] for r in third[len(log):]] == ["eval"] * 6
    assert all(r["problems"] == 3 for r in third[-1]["results"].values())


def test_a_preset_sets_its_fields_but_explicit_flags_win():
    argv = ["--preset", "long", "--sft-steps", "7"]
    config = train.resolved_config(argv)[0]
    assert (config.out, config.sft_steps) == ("runs/long", 7)
    # the long preset evaluates on every problem of the toy's held-out sets, none fewer
    assert config.eval_problems == len(toy.heldout("easy")) == len(toy.heldout("hard")) == 560
    assert config.pretrained_base == train.resolved_config([])[0].pretrained_base != ""  # the same shipped base


def test_the_committed_preset_pretrains_its_own_base_and_gives_both_arms_the_same_rl_steps():
    """--preset committed: no shipped base is pretrained on committed chains, so the run pretrains
    one; its cold start is the committed teacher's, half of it hard; the baseline starts from the
    same base with the same RL steps and data as the parallel arm."""
    config = train.resolved_config(["--preset", "committed"])[0]
    stages = {s.name: s for s in recipe(config)}
    assert config.pretrained_base == "" and not stages["pretrain"].shipped and stages["pretrain"].traces == "toy:committed"
    assert list(stages) == ["pretrain", "sft", "rl-easy", "rl-hard", "baseline-rl-easy", "baseline-rl-hard"]
    assert stages["sft"].traces == "toy:parallel-committed-half"
    for arm in ("rl-easy", "rl-hard"):
        ours, theirs = stages[arm], stages[f"baseline-{arm}"]
        assert (ours.steps, ours.data) == (theirs.steps, theirs.data) and theirs.reward == "accuracy", arm
    assert stages["rl-hard"].steps == 40 and stages["baseline-rl-easy"].start == "pretrain"
    hard = [r for r in toy.teacher_traces("toy:parallel-committed-half", n=400) if r["id"].startswith("toy-hard")]
    assert len(hard) == 200 and sum("<Parallel>" in r["response"] for r in hard) >= 95  # a quarter of all: hard blocks


def test_a_shipped_base_is_copied_as_the_pretrain_stage_and_a_bad_one_is_a_one_line_error(tmp_path):
    """--pretrained-base: the folder becomes 1-pretrain/final byte for byte, nothing is trained
    (no step in metrics.jsonl), the next stage starts from it; a folder without a model fails
    before any stage folder is made."""
    base = tmp_path / "base"
    made = train.main(["--out", str(tmp_path / "made"), *SMALL, "--stages", "pretrain"])
    (made / "1-pretrain" / "final").rename(base)
    run = train.main(["--out", str(tmp_path / "run"), *SMALL, "--pretrained-base", str(base),
                      "--stages", "pretrain,sft"])
    final = run / "1-pretrain" / "final"
    assert sorted(p.name for p in final.iterdir()) == sorted(p.name for p in base.iterdir())
    assert all((final / p.name).read_bytes() == p.read_bytes() for p in base.iterdir())
    log = read_metrics(run)
    assert [r for r in log if r.get("stage") == "pretrain" and r.get("event") == "shipped"][0]["from"] == str(base)
    assert not [r for r in log if r.get("stage") == "pretrain" and "step" in r]
    assert json.loads((run / "config.json").read_text())["resolved_stages"][0]["shipped"] == str(base)
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path / "bad"), *SMALL, "--pretrained-base", str(tmp_path / "nothing")])
    assert one_line(error).startswith(f"--pretrained-base {tmp_path / 'nothing'}: not a model folder")
    assert not (tmp_path / "bad" / "1-pretrain").exists()


def test_gradient_checkpointing_is_a_flag_that_reaches_the_model(tmp_path):
    """With --gradient-checkpointing the model the runner trains recomputes each decoder layer in
    backward (the layer's MLP runs twice per training step), and the gradients do not change."""
    grads, calls = {}, {}
    for flags in ([], ["--gradient-checkpointing"]):
        config = train.resolved_config(["--out", str(tmp_path), *flags])[0]
        model, tokenizer, policy = nanopar.model.load_with_policy(config, config.model, config.mode,
                                                                  schema_named(config.schema))
        mlp, count = model.model.layers[0].mlp, []  # counted in forward itself: hooks do not run in a recompute
        mlp.forward = lambda *args, real=mlp.forward, **kwargs: count.append(1) or real(*args, **kwargs)
        model.train()
        ids = torch.tensor([tokenizer.encode("numbers 3 7 5 target 26\n(3*7)+5")])
        model(input_ids=ids, labels=ids).loss.backward()
        calls[bool(flags)] = len(count)
        grads[bool(flags)] = model.model.embed_tokens.weight.grad.clone()
    assert calls == {False: 1, True: 2}
    assert torch.allclose(grads[False], grads[True], atol=1e-6)


def test_the_tag_rows_rate_scales_in_sft_and_not_in_grpo(tmp_path):
    """--tag-lr-scale serves the stages that teach the tags: the optimiser a LoRA run saves holds
    the tag rows at scale x the rate in SFT, at the rate itself in GRPO."""
    train.main(["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--skip", "rl-hard", "--sft-steps", "1",
                "--rl-easy-steps", "1", "--eval-problems", "0", "--lora", "--tag-lr-scale", "10",
                "--sft-lr", "3e-3", "--lr", "2e-4"])
    rates = {}
    for stage in ("1-sft", "2-rl-easy"):
        groups = torch.load(tmp_path / stage / "final" / "trainer_state.pt", weights_only=False)["optimizer"]["param_groups"]
        rates[stage] = [group["initial_lr"] for group in groups]  # [the rest, the tag rows]
    assert rates == {"1-sft": [3e-3, pytest.approx(3e-2)], "2-rl-easy": [2e-4, 2e-4]}


def test_skip_leaves_a_stage_out_and_the_next_starts_where_it_did(tmp_path):
    """The ablation "no stage-1 RL": --skip rl-easy makes `--stages sft,rl-hard` a run, rl-hard
    starting from sft's final/; folders are numbered over the stages that remain."""
    args = ["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--checkpoint-every", "0",
            "--stages", "sft,rl-hard", "--skip", "rl-easy"]
    train.main(args)
    config = train.resolved_config(args)[0]
    stages = recipe(config)
    runner = nanopar.runner.Runner(config, stages)
    assert [s.name for s in stages] == ["sft", "rl-hard"]
    assert runner.input_model(stages[1]) == str(tmp_path / "1-sft" / "final")
    assert sorted(f.name for f in tmp_path.glob("[0-9]-*")) == ["1-sft", "2-rl-hard"]
    log = read_metrics(tmp_path)
    assert [r["stage"] for r in log if r.get("event") == "done"] == ["sft", "rl-hard"]
    assert [r["step"] for r in log if r.get("stage") == "rl-hard" and "step" in r] == [1, 2]
    assert [r["stage"] for r in log if r.get("event") == "eval"] == ["sft", "rl-hard"]
    # a skipped stage with its own start passes it on: the baseline still starts from the base
    config = train.resolved_config(["--baseline", "--skip", "baseline-rl-easy,rl-easy"])[0]
    stages = {s.name: s for s in recipe(config)}
    assert list(stages) == ["pretrain", "sft", "rl-hard", "baseline-rl-hard"]
    assert (stages["rl-hard"].start, stages["baseline-rl-hard"].start) == ("sft", "pretrain")


@pytest.mark.parametrize("flags", [["--mode", "causal"], ["--max-path-tokens", "7"], ["--top-k", "5"],
                                   ["--top-p", "0.9"], ["--max-blocks", "1"], ["--instructions", "parallel"],
                                   ["--no-chat"], ["--seed", "1"], ["--temperature", "0.5"]])
def test_held_out_results_are_reused_only_while_nothing_that_changes_the_samples_changes(tmp_path, flags):
    base = ["--out", str(tmp_path), "--eval-problems", "1", "--eval-samples", "1", "--max-new-tokens", "8"]

    def evaluations(*more):
        config = train.resolved_config([*base, *more])[0]
        runner = nanopar.runner.Runner(config, recipe(config))
        stage = runner.stages[1]  # sft: its prompt and mode are the flags' (pretraining always reads causally)
        if not (runner.folder(stage) / "final").exists():
            save_checkpoint(runner.folder(stage) / "final", *load_model(ModelSettings("toy:model")))
        runner.heldout.evaluate(stage)
        return len([r for r in read_metrics(tmp_path) if r.get("event") == "eval"])

    assert evaluations() == 1
    assert evaluations("--checkpoint-every", "3", "--lr", "1") == 1  # not a sampling setting
    assert evaluations(*flags) == 2


def test_other_rewards_on_the_same_samples_are_scored_on_the_saved_responses(tmp_path, monkeypatch):
    """An evaluation keeps its responses beside eval.json: a run that only scores other rewards (a
    GRPO stage's reward changed, a stage skipped) scores them on those responses and samples
    nothing; what it scores is what sampling scored (format) and what the grades say (accuracy =
    2 x correct - 1); a sampling flag changed samples again and keeps only the new responses."""
    base = ["--out", str(tmp_path), "--eval-problems", "3", "--eval-samples", "2", "--max-new-tokens", "8",
            "--hard-reward", "format"]

    def evaluate(*more):
        config = train.resolved_config([*base, *more])[0]
        runner = nanopar.runner.Runner(config, recipe(config))
        stage = runner.stages[1]
        if not (runner.folder(stage) / "final").exists():
            save_checkpoint(runner.folder(stage) / "final", *load_model(ModelSettings("toy:model")))
        return runner.heldout.evaluate(stage)["toy:easy:heldout"], runner.folder(stage)

    sampled, folder = evaluate("--easy-reward", "format")
    assert list(sampled["rewards"]) == ["format"]
    real_evaluate = nanopar.heldout.evaluate
    monkeypatch.setattr(nanopar.heldout, "evaluate", lambda *a, **k: pytest.fail("sampled again"))
    both, _ = evaluate("--easy-reward", "accuracy")
    assert sorted(both["rewards"]) == ["accuracy", "format"] and both["rewards"]["format"] == sampled["rewards"]["format"]
    assert both["rewards"]["accuracy"] == {k: 2 * v - 1 for k, v in sampled["per_problem"].items()}
    assert both["reward_means"]["accuracy"] == pytest.approx(statistics.fmean(both["rewards"]["accuracy"].values()))
    assert both["reward_splits"]["format"] == sampled["reward_splits"]["format"]
    assert {k: v for k, v in both.items() if k not in ("rewards", "reward_means", "reward_splits")} == \
        {k: v for k, v in sampled.items() if k not in ("rewards", "reward_means", "reward_splits")}
    assert nanopar.results.saved_evaluation(*(lambda c: (c, recipe(c), recipe(c)[1]))(
        train.resolved_config([*base, "--easy-reward", "accuracy"])[0]))["toy:easy:heldout"] == both
    again, _ = evaluate("--easy-reward", "format")
    assert again == sampled  # the first run's numbers, scored from its saved responses
    monkeypatch.setattr(nanopar.heldout, "evaluate", real_evaluate)
    kept = list(folder.glob("eval_records.*.jsonl"))
    evaluate("--easy-reward", "format", "--temperature", "0.5")
    assert len(list(folder.glob("eval_records.*.jsonl"))) == 1 and not kept[0].exists()
    (folder / "eval.json").write_text('{"how": {"data"')  # cut short by hand: a one-line error naming it
    with pytest.raises(NanoparError, match=r"eval.json: not JSON .*move it away") as error:
        evaluate()
    assert "\n" not in str(error.value)


def jsonl_problems(path, problems):
    path.write_text("".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n"
                            for p in problems))
    return str(path)


def test_default_held_out_data_follows_the_run_and_is_never_trained_on(tmp_path, monkeypatch):
    """--eval-data auto on a .jsonl run: the last --eval-problems problems of each set are
    evaluated and never trained on; config.json says so."""
    from nanopar.toy import toy_problems

    easy = jsonl_problems(tmp_path / "easy.jsonl", toy_problems("toy:easy")[:12])
    hard = jsonl_problems(tmp_path / "hard.jsonl", toy_problems("toy:hard")[:12])
    trained, evaluated = set(), set()
    real_step, real_evaluate = nanopar.stage_steps.grpo_step, nanopar.heldout.evaluate
    monkeypatch.setattr(nanopar.stage_steps, "grpo_step", lambda model, tokenizer, optimizer, batch, *rest, **named:
                        trained.update(p.id for p in batch) or real_step(model, tokenizer, optimizer, batch, *rest,
                                                                         **named))
    monkeypatch.setattr(nanopar.heldout, "evaluate", lambda model, tokenizer, problems, *rest, **named:
                        evaluated.update(p.id for p in problems) or real_evaluate(model, tokenizer, problems, *rest,
                                                                                  **named))
    run = tmp_path / "run"
    train.main(["--out", str(run), *SMALL, "--pretrain-data", "", "--easy-data", easy, "--hard-data", hard,
                "--eval-problems", "4", "--prompts-per-step", "4", "--rl-easy-steps", "2", "--rl-hard-steps", "2"])
    assert json.loads((run / "config.json").read_text())["eval_data"] == f"{easy}[-4:],{hard}[-4:]"
    assert evaluated == {f"{level}:{n}" for level in ("easy", "hard") for n in range(9, 13)}
    assert trained == {f"{level}:{n}" for level in ("easy", "hard") for n in range(1, 9)}  # one epoch each


def test_auto_eval_data_for_toy_shipped_and_explicit_sets(tmp_path):
    def sets(*flags):
        config = train.resolved_config(["--out", str(tmp_path), *flags])[0]
        return nanopar.runner.Runner(config, recipe(config)).inputs.eval_sets()

    assert sets() == ["toy:easy:heldout", "toy:hard:heldout"]  # the default run's sets, as before
    assert sets("--easy-data", "gsm8k_train", "--hard-data", "aime24") == ["gsm8k", "aime24[-15:]"]
    assert sets("--hard-data", "math500", "--eval-data", "aime25") == ["aime25"]  # explicit wins
    assert sets("--eval-problems", "0") == []


def test_each_stage_samples_trains_and_is_evaluated_with_its_own_prompt_and_mode(tmp_path, monkeypatch):
    """The recipes set prompts and modes as the papers do, whatever the global flags say: the
    cold-start data is generated with the parallel instructions (the toy words them "in
    parallel") by plain generation, the accuracy-only baseline gets the plain prompt even under
    --instructions parallel (any other prompt kept) and decodes causally, NPR samples causally until its parallel SFT;
    config.json keeps the resolved values."""
    seen = half_right_sampler(monkeypatch)
    train.main(["--out", str(tmp_path / "r1"), "--sft-data", "", "--pretrain-data", "", "--stages", "cold-start-data",
                "--eval-problems", "0"])
    assert seen and all(prompt.startswith("in parallel\n\nnumbers") for prompt, _ in seen)
    stages = json.loads((tmp_path / "r1" / "config.json").read_text())["resolved_stages"]
    assert {s["name"]: (s["instructions"], s["mode"]) for s in stages} == {
        "cold-start-data": ("parallel", "causal"), "sft": ("none", "structured"),  # the teacher: plain generation
        "rl-easy": ("none", "structured"), "rl-hard": ("none", "structured")}

    def resolved(*flags):
        config = train.resolved_config(list(flags))[0]
        return {s.name: (s.instructions, s.mode) for s in recipe(config)}

    assert resolved("--instructions", "parallel", "--baseline", "--mode", "causal") == {
        "pretrain": ("parallel", "causal"), "sft": ("parallel", "causal"), "rl-easy": ("parallel", "causal"),
        "rl-hard": ("parallel", "causal"), "baseline-rl-easy": ("plain", "causal"),
        "baseline-rl-hard": ("plain", "causal")}
    assert {name: prompt for name, (prompt, _) in resolved("--instructions", "answer", "--baseline").items()
            if name.startswith("baseline")} == {"baseline-rl-easy": "answer", "baseline-rl-hard": "answer"}
    assert resolved("--recipe", "npr") == {
        "pretrain": ("none", "causal"), "format-rl": ("parallel", "causal"), "rejection": ("parallel", "causal"),
        "sft": ("parallel", "structured"), "parallel-rl": ("parallel", "structured")}

    # a GRPO stage samples with its own prompt and mode, and is evaluated with them
    prompts, real = [], nanopar.grpo.sample
    monkeypatch.setattr(nanopar.grpo, "sample", lambda model, ids, policy, *rest: prompts.append(
        (ids[0], policy.mode)) or real(model, ids, policy, *rest))
    args = ["--out", str(tmp_path / "base"), *SMALL, "--baseline", "--instructions", "parallel", "--stages",
            "pretrain,baseline-rl-easy", "--eval-problems", "2", "--mode", "causal"]
    train.main(args)
    tokenizer = load_model(ModelSettings("toy:model"))[1]
    assert prompts and all(not tokenizer.decode(ids).startswith("in parallel") and mode == "causal"
                           for ids, mode in prompts)  # plain: the toy says nothing
    how = json.loads((tmp_path / "base" / "5-baseline-rl-easy" / "eval.json").read_text())["how"]
    pretrain = json.loads((tmp_path / "base" / "1-pretrain" / "eval.json").read_text())["how"]
    assert how["instructions"] == ["", ""] and pretrain["instructions"] == ["in parallel", "in parallel"]


def test_the_toy_base_learns_to_follow_the_parallel_instructions_from_some_of_its_traces():
    """NPR's toy base: a tenth of its pretraining traces are prompted "in parallel" and answered
    with an easy parallel trace, a twentieth with a hard one, so it follows the instructions some
    of the time, as an instruct model; Parallel-R1's base never saw the marker."""
    from nanopar.format import check_parallel
    from nanopar.toy import teacher_traces

    records = teacher_traces("toy:instruct")
    instructed = [r for r in records if r.get("instructions") == "parallel"]
    assert sum(r["id"].startswith("toy-easy") for r in instructed) == len(records) // 10
    assert sum(r["id"].startswith("toy-hard") for r in instructed) == len(records) // 20
    assert all(check_parallel(r["response"]).ok for r in instructed)
    assert not any(check_parallel(r["response"]).ok for r in records if "instructions" not in r)
    assert not any("instructions" in r for r in teacher_traces("toy:sequential"))  # Parallel-R1's base model
    config = train.resolved_config(["--recipe", "npr"])[0]
    runner = nanopar.runner.Runner(config, recipe(config))
    pretrain = runner.stages[0]
    assert pretrain.traces == "toy:instruct"  # --pretrain-data auto: NPR starts from an instruct model
    tokenizer = load_model(ModelSettings("toy:model"))[1]
    examples = [runner.inputs.sft_example(r, pretrain, tokenizer) for r in runner.inputs.traces(pretrain)]
    marked = [tokenizer.decode(p) for p, _ in examples if tokenizer.decode(p).startswith("in parallel")]
    assert len(marked) == len(instructed)


@pytest.mark.slow
def test_the_npr_recipe_runs_end_to_end(tmp_path, monkeypatch):
    """--recipe npr: format RL, rejection sampling (a stand-in model that is right half the time),
    parallel SFT on the kept traces, parallel RL; every stage evaluated, the table printed."""
    half_right_sampler(monkeypatch)
    inputs, real_input = {}, nanopar.runner.Runner.input_model
    monkeypatch.setattr(nanopar.runner.Runner, "input_model",
                        lambda self, stage: inputs.setdefault(stage.name, real_input(self, stage)))
    out = train.main(["--out", str(tmp_path), "--recipe", "npr", *SMALL, "--distill-tries", "2",
                      "--eval-problems", "2"])
    # format RL writes the data; the parallel SFT fine-tunes the base (NPR's code: the instruct model)
    assert inputs["sft"] == str(out / "1-pretrain" / "final") != inputs["parallel-rl"]
    assert inputs["rejection"] == str(out / "2-format-rl" / "final")
    # each checkpoint says the attention it was trained in, which eval.py and sample.py then use
    saved = {stage: json.loads((out / stage / "final" / "run_config.json").read_text())
             for stage in ("1-pretrain", "2-format-rl", "4-sft", "5-parallel-rl")}
    assert {stage: run["mode"] for stage, run in saved.items()} == {
        "1-pretrain": "causal", "2-format-rl": "causal", "4-sft": "structured", "5-parallel-rl": "structured"}
    # and the prompt: NPR's from format RL on, whatever the run's --instructions ("none")
    assert {stage: run["instructions"] for stage, run in saved.items()} == {
        "1-pretrain": "none", "2-format-rl": "parallel", "4-sft": "parallel", "5-parallel-rl": "parallel"}
    kept = read_jsonl(out / "3-rejection" / "traces.jsonl")
    # the rejection reads easy and hard problems mixed, as NPR's whole training set: half of each kept
    assert [r["id"].split(":")[0] for r in kept].count("toy-hard") == 3 and len(kept) == 6
    # the NPR recipe writes NPR's tags: the kept traces are NPR rounds
    assert all(check_parallel(r["response"], NPR).ok and "<Parallel>" not in r["response"] for r in kept)
    assert json.loads((out / "config.json").read_text())["schema"] == "npr"
    log = read_metrics(out)
    assert [r["stage"] for r in log if r.get("event") == "eval"] == ["pretrain", "format-rl", "sft", "parallel-rl"]
    assert all(r["reward_spec"] == {"npr_format": 1.0} for r in log if r.get("stage") == "format-rl" and "step" in r)
    assert (out / "5-parallel-rl" / "final").is_dir()


def test_an_npr_rejection_that_keeps_nothing_says_what_npr_needs(tmp_path, monkeypatch):
    """A model that never writes NPR's format (every try rejected): the run stops at the
    rejection stage with one line that says what NPR needs, and writes no traces file."""
    monkeypatch.setattr(nanopar.runner, "keep_traces", lambda *args, **kwargs: Distilled([], 0, {}))
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path), "--recipe", "npr", *SMALL, "--rl-easy-steps", "1",
                    "--distill-problems", "4", "--eval-problems", "0"])
    assert one_line(error) == (
        "rejection: no correct trace in the schema's format in 4 problems; the model cannot write them yet: "
        "NPR distils its own traces, so it needs a model that follows its format some of the time (an instruct "
        "model prompted with it): raise --distill-tries or --rl-easy-steps (format RL), or run --recipe "
        "parallel-r1, whose cold start reads --sft-data")
    assert not (tmp_path / "3-rejection" / "traces.jsonl").exists()


def test_each_schema_runs_with_each_recipe(tmp_path, monkeypatch):
    """--schema crosses the recipes: Parallel-R1's curriculum cold-starts on NPR rounds (the toy
    teacher writes them), and NPR's curriculum runs in Parallel-R1's tags."""

    sft_batches = []
    real_step = nanopar.stage_steps.sft_step
    monkeypatch.setattr(nanopar.stage_steps, "sft_step", lambda model, optimizer, prompts, responses, *rest, **kw:
                        sft_batches.append(responses) or real_step(model, optimizer, prompts, responses, *rest, **kw))
    out = train.main(["--out", str(tmp_path / "p"), "--schema", "npr", "--stages", "sft", "--pretrain-data", "",
                      *SMALL])
    config = json.loads((out / "config.json").read_text())
    assert config["schema"] == "npr" and config["recipe"] == "parallel-r1"
    tokenizer = load_model(ModelSettings("toy:model"), NPR)[1]
    cold = [tokenizer.decode(ids) for batch in sft_batches for ids in batch]
    assert any(check_parallel(text.split("<|endoftext|>")[0], NPR).ok for text in cold)  # NPR rounds, not <Parallel>
    assert not any("<Parallel>" in text for text in cold)
    half_right_sampler(monkeypatch)
    out = train.main(["--out", str(tmp_path / "n"), "--recipe", "npr", "--schema", "parallel-r1", *SMALL,
                      "--stages", "pretrain,format-rl,rejection", "--distill-tries", "2"])
    kept = read_jsonl(out / "3-rejection" / "traces.jsonl")
    assert kept and all(check_parallel(r["response"]).ok and "<guideline>" not in r["response"] for r in kept)


def test_the_evaluation_batch_is_its_own_setting(tmp_path, monkeypatch):
    """Held-out evaluation decodes --eval-batch problems per sampler call, whatever the GRPO step's
    size (a small RL run used to evaluate two problems at a time)."""
    calls = []
    real = nanopar.heldout.evaluate
    monkeypatch.setattr(nanopar.heldout, "evaluate", lambda model, tokenizer, problems, policy, settings, samples,
                        instructions, chat, batch_size, **kw: calls.append((len(problems), batch_size))
                        or real(model, tokenizer, problems, policy, settings, samples, instructions, chat,
                                batch_size, **kw))
    train.main(["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--stages", "sft", "--eval-batch", "5"])
    assert calls and all(batch == 5 for _, batch in calls)
    with pytest.raises(NanoparError, match="--eval-batch must be >= 1"):
        train.main(["--out", str(tmp_path / "b"), *SMALL, "--pretrain-data", "", "--stages", "sft",
                    "--eval-batch", "0"])


def test_grpo_alone_on_your_own_model(tmp_path):
    """The README's "GRPO alone" command: --stages rl-easy --skip sft starts rl-easy from --model."""
    out = train.main(["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--stages", "rl-easy", "--skip", "sft"])
    assert (out / "1-rl-easy" / "final").is_dir()  # the recipe without sft: rl-easy, rl-hard
    assert [r["stage"] for r in read_metrics(out) if r.get("event") == "done"] == ["rl-easy"]


def test_the_table_of_stages_shows_each_stages_change_over_the_one_it_started_from(tmp_path, monkeypatch):
    """The "vs its start" rows: a stage's held-out accuracy minus that of the stage it started
    from, ± the standard error of the per-problem differences, read from the two eval.json files
    (no model loads); "-" for the first stage, whose input (--model) is not evaluated here."""
    import math
    import statistics

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(nanopar.model, "load_model", load_model)  # every script loads through it
    config = train.resolved_config(["--out", str(tmp_path), "--pretrain-data", "", "--eval-problems", "4"])[0]
    stages = recipe(config)
    runner = nanopar.runner.Runner(config, stages)
    easy, hard = runner.inputs.eval_sets()
    accuracies = {"sft": [0, 0.5, 0.5, 1], "rl-easy": [0.5, 1, 0.5, 1], "rl-hard": [0.5, 1, 1, 1]}
    for stage in stages:
        (runner.folder(stage) / "final").mkdir(parents=True)
        per_problem = {f"toy/{i}": a for i, a in enumerate(accuracies[stage.name])}
        result = {"accuracy": statistics.fmean(accuracies[stage.name]), "accuracy_se": 0.1, "per_problem": per_problem}
        (runner.folder(stage) / "eval.json").write_text(json.dumps({"how": evaluation_key(config, stages, stage), "results": {
            easy: result, hard: result | {"per_problem": dict(list(per_problem.items())[:2])}}}))
    (tmp_path / "metrics.jsonl").write_text("")
    table = train.summary(config, stages, stages)
    names = list(table.columns[0].cells)

    def cells(row):
        return [list(column.cells)[names.index(row)] for column in table.columns[1:]]

    def expected(before, after):
        differences = [b - a for a, b in zip(accuracies[before], accuracies[after])]
        return f"{100 * statistics.fmean(differences):+.1f} ± {100 * statistics.stdev(differences) / math.sqrt(4):.1f}"

    assert names.index("easy: vs its start") == names.index("easy: accuracy SE") + 1
    assert cells("easy: vs its start") == ["-", expected("sft", "rl-easy"), expected("rl-easy", "rl-hard")]
    assert cells("easy: vs its start")[1:] == ["+25.0 ± 14.4", "+12.5 ± 12.5"]
    assert cells("hard: vs its start") == ["-", "+50.0 ± 0.0", "+0.0 ± 0.0"]  # the first 2 problems only: 0.5, 0.5
    assert "easy: vs baseline" not in names  # no --baseline, no row


def test_the_table_of_stages_shows_each_rl_stage_against_the_baseline_with_its_steps(tmp_path, monkeypatch):
    """With --baseline, the "vs baseline" rows: a recipe GRPO stage's held-out accuracy minus that of
    accuracy-only GRPO from the same base with the same RL steps (rl-easy against baseline-rl-easy,
    rl-hard against baseline-rl-hard), paired problem by problem from the two eval.json files; "-"
    for every other stage. NPR's GRPO stages pair the same way, by place from the last."""
    import math
    import statistics

    monkeypatch.setattr(nanopar.model, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    config = train.resolved_config(["--out", str(tmp_path), "--pretrain-data", "", "--eval-problems", "4",
                                    "--baseline"])[0]
    stages = recipe(config)
    runner = nanopar.runner.Runner(config, stages)
    easy, hard = runner.inputs.eval_sets()
    accuracies = {"sft": [0, 0.5, 0.5, 1], "rl-easy": [0.5, 1, 0.5, 1], "rl-hard": [0.5, 1, 1, 1],
                  "baseline-rl-easy": [1, 0.5, 0, 1], "baseline-rl-hard": [0.5, 0.5, 1, 0]}
    for stage in stages:
        (runner.folder(stage) / "final").mkdir(parents=True)
        per_problem = {f"toy/{i}": a for i, a in enumerate(accuracies[stage.name])}
        result = {"accuracy": statistics.fmean(accuracies[stage.name]), "accuracy_se": 0.1, "per_problem": per_problem}
        (runner.folder(stage) / "eval.json").write_text(json.dumps({"how": evaluation_key(config, stages, stage), "results": {
            easy: result, hard: result | {"per_problem": dict(list(per_problem.items())[1:3])}}}))
    (tmp_path / "metrics.jsonl").write_text("")
    table = train.summary(config, stages, stages)
    names = list(table.columns[0].cells)

    def cells(row):
        return [list(column.cells)[names.index(row)] for column in table.columns[1:]]

    def expected(baseline, stage, problems=slice(0, 4)):
        differences = [b - a for a, b in zip(accuracies[baseline][problems], accuracies[stage][problems])]
        mean, se = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(len(differences))
        return f"{100 * mean:+.1f} ± {100 * se:.1f}"

    assert [s.name for s in stages] == ["sft", "rl-easy", "rl-hard", "baseline-rl-easy", "baseline-rl-hard"]
    assert names.index("easy: vs baseline") == names.index("easy: vs its start") + 1
    assert cells("easy: vs baseline") == ["-", expected("baseline-rl-easy", "rl-easy"),
                                          expected("baseline-rl-hard", "rl-hard"), "-", "-"]
    assert cells("easy: vs baseline")[1:3] == ["+12.5 ± 23.9", "+37.5 ± 23.9"]
    assert cells("hard: vs baseline") == ["-", expected("baseline-rl-easy", "rl-easy", slice(1, 3)),
                                          expected("baseline-rl-hard", "rl-hard", slice(1, 3)), "-", "-"]
    npr = recipe(train.resolved_config(["--recipe", "npr", "--baseline", "--out", str(tmp_path / "npr")])[0])
    assert {s.name: getattr(baseline_of(npr, s), "name", None) for s in npr} == {
        "pretrain": None, "format-rl": "baseline-rl-easy", "rejection": None, "sft": None,
        "parallel-rl": "baseline-rl-hard", "baseline-rl-easy": None, "baseline-rl-hard": None}


def test_cold_start_traces_are_judged_in_the_runs_schema_before_any_model_loads(tmp_path, monkeypatch, capsys):
    """--sft-data is read in the run's schema: a file of NPR rounds given to a Parallel-R1 run is a
    one-line error before a model loads (it would train as plain text); a file with some sequential
    traces says how many and trains. Pretraining's traces are sequential and not judged."""
    from nanopar.data import load_traces, write_jsonl

    teacher = load_traces("toy:parallel")  # Parallel-R1's tags: 85% parallel, the rest sequential
    parallel = [r for r in teacher if "<Parallel>" in r["response"]]
    sequential = [r for r in teacher if "<" not in r["response"]]
    rounds = [r for r in load_traces("toy:parallel", NPR) if "<guideline>" in r["response"]]
    write_jsonl(tmp_path / "npr.jsonl", rounds[:12])
    write_jsonl(tmp_path / "mixed.jsonl", parallel[:9] + sequential[:3])
    real_load = nanopar.model.load_model

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the traces were checked")

    monkeypatch.setattr(nanopar.model, "load_model", no_model)
    with pytest.raises(NanoparError) as error:
        train.main(["--out", str(tmp_path / "npr"), *SMALL, "--stages", "pretrain,sft",
                    "--sft-data", str(tmp_path / "npr.jsonl")])
    assert one_line(error) == (f"sft: none of the 12 traces in {tmp_path / 'npr.jsonl'} is a valid parallel trace in "
                               "the parallel-r1 schema (the first: no valid parallel block); they are written in "
                               "the npr schema (--schema npr)")
    assert not (tmp_path / "npr").exists() or not [p for p in (tmp_path / "npr").glob("*") if p.is_dir()]
    monkeypatch.setattr(nanopar.model, "load_model", real_load)
    capsys.readouterr()
    out = train.main(["--out", str(tmp_path / "mixed"), *SMALL, "--stages", "pretrain,sft", "--eval-problems", "0",
                      "--sft-data", str(tmp_path / "mixed.jsonl")])
    printed = capsys.readouterr().out
    assert "sft: 9 of 12 traces are valid parallel traces in the parallel-r1 schema; the other 3 train as" in printed
    assert printed.count("valid parallel traces") == 1  # pretraining's 4,000 sequential traces: not judged
    assert (out / "2-sft" / "final").is_dir()


# torch's report on a CUDA card, as torch 2.13 words it
TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which 1.21 GiB "
             "is free. Of the allocated memory 19.80 GiB is allocated by PyTorch, and 2.10 GiB is reserved by PyTorch "
             "but unallocated. If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
             "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\nmore lines")
TORCH_SAID = TORCH_OOM.split("  See documentation")[0]


def test_out_of_memory_says_the_phase_what_torch_said_and_which_flags_resume(tmp_path, monkeypatch):
    """A GPU that runs out of memory while sampling, in the training read, or evaluating (a stage's
    model or the given one): one line naming the phase, torch's own first line (the allocation and
    what is reserved but unallocated), the checkpoint the same command resumes from and the flags
    that fit it in without --restart, or that need it."""
    run = ["--out", str(tmp_path), *SMALL, "--pretrain-data", "", "--skip", "sft", "--stages", "rl-easy"]
    crash_on_call(monkeypatch, 2, torch.OutOfMemoryError(TORCH_OOM))
    with pytest.raises(NanoparError) as error:
        train.main(run)
    assert one_line(error) == (f"out of memory in rl-easy, step 2, sampling: {TORCH_SAID} -> "
                               f"{tmp_path / '1-rl-easy' / 'checkpoint-1'} resumes with less only with a run that "
                               "samples less: --prompts-per-step, --group-size or --max-new-tokens, with --restart "
                               "(or another --out); docs/gpu.md, Out of memory")
    monkeypatch.undo()
    def no_room(*args, **kwargs):  # the first training read runs out (a step before it may have had no signal)
        raise torch.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(nanopar.grpo, "grpo_update", no_room)
    with pytest.raises(NanoparError) as error:
        train.main([*run, "--restart", "--micro-batch-tokens", "600"])
    last = latest_checkpoint(tmp_path / "1-rl-easy")  # the steps before it had nothing to learn
    step = int(last.name.split("-")[1]) + 1 if last else 1
    assert one_line(error) == (f"out of memory in rl-easy, step {step}, the training read: {TORCH_SAID} -> the "
                               f"same command resumes from {last or 'the start of rl-easy'} with "
                               "--micro-batch-tokens 300 or --gradient-checkpointing (no --restart); docs/gpu.md, "
                               "Out of memory")
    monkeypatch.undo()
    monkeypatch.setattr(nanopar.heldout, "evaluate", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError()))
    for stage, given in (("rl-easy", []), ("model", ["--eval-model"])):  # a stage's model, and the given one first
        with pytest.raises(NanoparError) as error:
            train.main([*run, "--eval-batch", "16", *given])
        assert one_line(error) == (f"out of memory in {stage}, the evaluation: (torch gave no message) -> "
                                   "the same command with --eval-batch 8 evaluates it again (the stage's model is "
                                   "saved; no --restart); docs/gpu.md, Out of memory")
