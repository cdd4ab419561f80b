"""bench/races.py: every race at its --quick size on the CPU, both sides checked here against each other or a
hand computation (not through the harness's own check); --help starts nothing; bad flags are one-line errors."""

import filecmp
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # as `python bench/races.py` has it

import races  # noqa: E402
from conftest import ROOT, one_line, tiny_qwen_gguf  # noqa: E402
from nanopar import head  # noqa: E402
from nanopar.draw_in_place import sample_in_blocks  # noqa: E402
from nanopar.policy import sample_categorical  # noqa: E402

QUICK = races.RacesConfig(quick=True, rounds=1)


def close_to_largest(a: torch.Tensor, b: torch.Tensor, within: float) -> bool:
    """The largest |a - b| is at most `within` of b's largest entry."""
    return bool((a - b).abs().max() <= within * b.abs().max())


def raced(name: str) -> races.Result:
    """The race at its quick size, through the harness; both sides timed."""
    result = races.measure(name, QUICK)
    assert all(seconds > 0 for seconds in result.seconds) and "->" in result.load
    return result


def test_help_starts_nothing(monkeypatch, capsys):
    monkeypatch.setattr(races, "measure", lambda *args: pytest.fail("--help ran a race"))
    with pytest.raises(SystemExit) as done:
        races.main(["--help"])
    assert done.value.code == 0 and "--only" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [(["--only", "draw,nope"], "unknown race nope: the races are head_read"),
                                         (["--only", "draw", "--sizes", "tokens=3"], "--sizes tokens"),
                                         (["--sizes", "lanes"], "give name=value pairs"),
                                         (["--rounds", "0"], "--rounds 0")])
def test_bad_flags_are_one_line_errors(monkeypatch, argv, words):
    monkeypatch.setattr(races, "measure", lambda *args: pytest.fail("a bad flag ran a race"))
    with pytest.raises(SystemExit) as error:
        races.main(argv)
    assert words in one_line(error)


def test_a_race_whose_need_is_missing_says_so_in_one_line(capsys):
    races.main(["--only", "data_parallel"])  # one process: torchrun's are missing
    out = capsys.readouterr().out
    assert "data_parallel: skipped, needs 2 processes: torchrun --nproc_per_node 2 bench/races.py" in out
    assert races.missing("model", races.RacesConfig(model="pypi:no-such-model"), {}) == ""  # load_model's to refuse
    assert races.missing("model", races.RacesConfig(model="tiny:qwen2"), {}) == ""


def test_sizes_change_in_their_defaults_type():
    config = races.RacesConfig(quick=True, sizes="lanes=7,with_signal=2")
    assert races.sizes_for(races.RACES["draw"], config) == dict(vocab=9000, real_vocab=8990, lanes=7)
    assert races.sizes_for(races.RACES["row_skip"], config)["with_signal"] == 2
    assert races.RacesConfig().model == "pypi:qwen2.5-coder-0.5b" and QUICK.model == "tiny:qwen2"


def test_head_read_chunked_reads_what_the_full_logits_give():
    (ours, our_grads), (theirs, their_grads) = raced("head_read").outputs
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert close_to_largest(our_grads, their_grads, 1e-5)  # float32: summed in another order


def hand_read(chunk: int):
    """head_chunk's quick head and hidden states, built as the race builds them, and their read by hand in float64:
    -> (the race's two sides, the log-probs, their sum's gradient)"""
    sizes = dict(races.RACES["head_chunk"].quick, chunk=chunk)
    contest = races.head_chunk(QUICK, **sizes)
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 40, bias=False, dtype=torch.float64).requires_grad_(False)
    hidden = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (13,))
    expected = torch.log_softmax(linear(hidden)[:, :37] / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    (grad,) = torch.autograd.grad(expected.sum(), hidden)
    assert head._linear_head(linear, [], 37) is not None  # the library's side takes the slopes road here
    return contest, expected.detach(), grad


@pytest.mark.parametrize("chunk", [1, 4, 13, 50])
def test_head_chunk_both_sides_read_what_the_full_logits_give(chunk):
    contest, expected, grad = hand_read(chunk)
    for side in (contest.library, contest.plain):
        chosen, their_grad = side()
        torch.testing.assert_close(chosen, expected.float())  # float32 scores, as the read keeps them
        torch.testing.assert_close(their_grad, grad, rtol=1e-5, atol=1e-6)


def test_reused_buffers_read_what_fresh_tensors_read():
    """Bit for bit: the log-probs, entropy and gradient of the chunked read through its buffers and through a fresh
    tensor per chunk (the race's plain buffers), in bf16 at T = 0.7 and float32 at T = 1 and 0.5, a short last chunk."""
    for dtype, temperature in ((torch.bfloat16, 0.7), (torch.float32, 1.0), (torch.float32, 0.5)):
        torch.manual_seed(0)
        linear = torch.nn.Linear(8, 40, bias=False, dtype=dtype).requires_grad_(False)
        hidden = torch.randn(13, 8, dtype=dtype, requires_grad=True)
        targets = torch.randint(0, 37, (13,))
        read = []
        for get in (races.fresh_buffer, head._ChunkBuffers.get):
            with races.patched((head._ChunkBuffers, "get", get)):
                hidden.grad = None
                chosen, entropy = head.head_logprobs(hidden, targets, linear, temperature, 37, with_entropy=True, chunk=4)
                (chosen * torch.arange(13)).sum().backward()
            read.append((chosen.detach(), entropy, hidden.grad.clone()))
        assert all(torch.equal(a, b) for a, b in zip(*read)), (dtype, temperature)


def test_draw_both_sides_take_the_same_tokens_at_float64_log_probs():
    (ours, our_logprobs), (theirs, their_logprobs) = raced("draw").outputs
    logits = (3 * torch.randn(5, 9000, generator=torch.Generator().manual_seed(5))).bfloat16()
    exact = torch.log_softmax(logits[:, :8990].double() / 0.7, -1)  # [N, V']
    assert torch.equal(ours, theirs) and not torch.isin(ours, torch.arange(8984, 8990)).any()  # the bans held
    assert (our_logprobs.double() - exact.gather(-1, ours[:, None]).squeeze(-1)).abs().max() < 1e-5
    assert (their_logprobs.double() - exact.gather(-1, theirs[:, None]).squeeze(-1)).abs().max() < 1e-4
    weights = exact.exp()  # the inverse CDF alone: two levels draw what one cumulative sum draws
    assert torch.equal(sample_in_blocks(weights, torch.Generator().manual_seed(1)),
                       sample_categorical(weights, torch.Generator().manual_seed(1)))


def test_policy_scores_both_forms_give_the_scores():
    ours, theirs = raced("policy_scores").outputs
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert torch.equal(ours, theirs) and ours.dtype == torch.float32 and ours.shape == (4, 60)
    torch.testing.assert_close(ours.double(), logits[:, :60].double() / 0.7)


def test_kv_append_both_caches_sample_the_same_tokens_past_the_spare_columns():
    ours, theirs = raced("kv_append").outputs
    assert ours == theirs and len(ours) == 4 and all(len(ids) == 70 for ids, _ in ours)  # 70 > SPARE_COLUMNS


def test_lora_casts_kept_and_made_every_call_sample_the_same_tokens():
    from nanopar import lora_dtype
    library = lora_dtype.casts_kept
    ours, theirs = raced("lora_casts").outputs
    assert ours == theirs and len(ours) == 2 and all(len(ids) == 8 for ids, _ in ours)
    assert lora_dtype.casts_kept is library


def test_lora_output_2d_output_and_2d_view_read_the_same():
    from nanopar import lora_dtype
    library = lora_dtype.BaseDtypeLora.forward
    (ours, our_grads), (theirs, their_grads) = raced("lora_output").outputs
    assert torch.equal(ours, theirs)
    assert F.cosine_similarity(our_grads.double(), their_grads.double(), dim=0) > 0.999  # bf16 sums in another order
    assert lora_dtype.BaseDtypeLora.forward is library


def test_row_skip_reads_the_rows_with_a_signal_and_keeps_the_gradient():
    ours, theirs = raced("row_skip").outputs
    assert ours["read_rows"] == 0.5 and theirs["read_rows"] == 1.0  # 1 group of 2 with a signal
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)  # the 1e-6 rows add ~1e-6


def test_tag_rows_row_wise_reads_what_peft_reads():
    (ours, our_grads), (theirs, their_grads) = raced("tag_rows").outputs
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert close_to_largest(our_grads, their_grads, 1e-5)  # the head's tag columns: float rounding


@pytest.mark.slow
def test_dtype_both_take_a_cold_start_step_of_the_same_loss():
    ours, theirs = raced("dtype").outputs
    assert 0 < ours["loss"] == pytest.approx(theirs["loss"], rel=0.02)


def test_gguf_convert_one_reader_writes_what_three_write(tmp_path):
    """On a tiny Qwen2 under Qwen's tokenizer cut to 4,096 ids, not the race's quick size (SmolLM2's 98 MB GGUF,
    a minute of the suite for the same check); the real files' conversions are tests/test_real_checkpoint.py's."""
    contest = races.gguf_convert(QUICK, gguf=str(tiny_qwen_gguf(tmp_path)))
    ours, theirs = contest.library(), contest.plain()
    names = sorted(p.name for p in ours.iterdir())
    assert ours != theirs and names == sorted(p.name for p in theirs.iterdir()) and "config.json" in names
    assert all(filecmp.cmp(ours / name, theirs / name, shallow=False) for name in names)


@pytest.mark.slow
def test_data_parallel_under_torchrun_sums_what_each_process_holds():
    import subprocess
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "bench/races.py",
                           "--only", "data_parallel", "--rounds", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the same summed gradients, bit for bit" in done.stdout  # and each 3 x the weights: the race's check
