"""bench/trl.py: --help starts nothing; without TRL it stops in one line before loading a model; the
TRL it imports is the package, never the script itself (whose name it shares); with TRL installed, a
--quick run on a tiny model finishes with both sides' updates run."""

import importlib.util
import sys

import pytest

from conftest import ROOT

BENCH = ROOT / "bench"
sys.path.append(str(BENCH))  # as `python bench/trl.py` has it: its helpers beside it
_spec = importlib.util.spec_from_file_location("trl_bench", BENCH / "trl.py")  # not "trl": that is TRL's name
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # (dataclasses look their module up)
_spec.loader.exec_module(bench)


def test_help_starts_nothing(capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--help"])
    assert stop.value.code == 0 and "--quick" in capsys.readouterr().out


def test_without_trl_it_stops_in_one_line_before_loading_a_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # what an environment without TRL gives `import trl`
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--quick", "--model", "tiny:qwen2"])
    assert stop.value.code == "bench/trl.py needs TRL, which is not installed: pip install -e .[bench]"


def test_the_trl_it_imports_is_never_this_script(monkeypatch):
    """`python bench/trl.py` puts bench/ first on sys.path, where `import trl` would find the script."""
    monkeypatch.delitem(sys.modules, "trl", raising=False)
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        trl = bench.import_trl()
    except SystemExit as stop:  # TRL not installed: the one line, not this file imported as TRL
        assert "needs TRL" in str(stop.code) and "trl" not in sys.modules
    else:
        assert hasattr(trl, "GRPOTrainer") and trl.__file__ != str(BENCH / "trl.py")
    assert sys.path[0] == str(BENCH)  # the path is given back as it was


@pytest.mark.slow
def test_a_quick_run_times_both_sides(tmp_path):
    try:
        bench.import_trl()
    except SystemExit:
        pytest.skip("TRL, the [bench] extra, is not installed")
    report = bench.main(["--quick", "--model", "tiny:qwen2", "--out", str(tmp_path / "trl.json")])
    assert [r["round"] for r in report["rounds"]] == ["warm-up", 1]
    for side in ("nanopar", "TRL"):
        figures = report["best"][side]
        assert 0 < figures["generate"] < figures["step"] and figures["update"] > 0
    assert (tmp_path / "trl.json").exists()
