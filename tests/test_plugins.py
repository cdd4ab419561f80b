"""The two plug-in points for synthetic worlds, and the toy world as a leaf behind them.

`data.SOURCES` (spec prefix -> Source: problems, traces, model) and `grading.CHECKERS` (checker
name -> exact checker) are the only roads from the general modules into nanopar/toy/.
"""

import subprocess
import sys

import pytest

from nanopar import NanoparError, data, grading
from nanopar.data import Problem, Source, load_problems, load_traces, register_source
from nanopar.grading import Grade, grade, register_checker
from nanopar.model import ModelSettings, load_model
from nanopar.tiny import tiny_named


@pytest.fixture
def registries(monkeypatch):
    """Copies of both registries, so a test's registrations end with it."""
    monkeypatch.setattr(data, "SOURCES", dict(data.SOURCES))
    monkeypatch.setattr(grading, "CHECKERS", dict(grading.CHECKERS))


def test_general_modules_do_not_import_the_toy():
    modules = "nanopar.data, nanopar.grading, nanopar.tiny, nanopar.model, nanopar.tags, nanopar.rewards"
    code = f"import sys, {modules}; assert 'nanopar.toy' not in sys.modules, 'toy imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_toy_is_reached_through_its_registry_entries(registries):
    data.SOURCES["toy"], grading.CHECKERS["countdown"] = "nanopar.toy:SOURCE", "nanopar.toy:grade_countdown"
    problem = load_problems("toy:easy", limit=3)[0]  # resolves "nanopar.toy:SOURCE"
    from nanopar import toy

    assert data.SOURCES["toy"] is toy.SOURCE and problem == toy.toy_problems("toy:easy")[0]
    assert grade(f"Final Answer: {problem.answer}", problem) == Grade(True, problem.answer)
    assert grading.CHECKERS["countdown"] is toy.grade_countdown
    assert load_traces("toy:parallel") == toy.teacher_traces("toy:parallel")
    register_source("toy", Source(problems=lambda spec: [problem], traces=lambda spec, schema: [{"spec": spec}]))
    register_checker("countdown", lambda text, p: Grade(False, "replaced"))
    assert load_problems("toy:hard") == [problem] and load_traces("toy:parallel") == [{"spec": "toy:parallel"}]
    assert grade(f"Final Answer: {problem.answer}", problem) == Grade(False, "replaced")  # no road around them


def test_a_user_world_plugs_in_like_the_toy(registries):
    built = []

    def model(name, dtype, attn_implementation):
        built.append(name)
        return tiny_named("tiny:qwen3", dtype, attn_implementation)

    parity = Problem("maze:1", "is 7 odd?", "yes", "maze", {"checker": "parity"})
    register_source("maze", Source(problems=lambda spec: [parity] * 3,
                                   traces=lambda spec, schema: [{"question": spec, "response": "yes"}],
                                   model=model, model_names=("maze:model",)))
    register_checker("parity", lambda text, problem: Grade(text.endswith(problem.answer), text[-3:]))
    assert load_problems("maze:small", limit=2) == [parity, parity]
    assert load_traces("maze:small") == [{"question": "maze:small", "response": "yes"}]
    assert grade("so: yes", parity) == Grade(True, "yes") and not grade("no", parity).correct
    loaded, tokenizer = load_model(ModelSettings("maze:model", device="cpu"))
    assert built == ["maze:model"] and loaded.config._name_or_path == "maze:model"
    with pytest.raises(NanoparError, match=r"^unknown tiny model 'tiny:x': use tiny:qwen2, tiny:qwen3, toy:model "
                                           r"or maze:model$"):
        load_model(ModelSettings("tiny:x", device="cpu"))


def test_unknown_checker_or_bad_entries_are_one_line_errors(registries):
    with pytest.raises(NanoparError, match=r"^unknown checker 'exact' \(problem p\): use one of countdown$"):
        grade("Final Answer: 1", Problem("p", "q", "1", extra={"checker": "exact"}))
    register_checker("broken", "nanopar.nothing:here")
    with pytest.raises(NanoparError, match=r"^cannot load the plug-in 'nanopar.nothing:here': No module named"):
        grade("x", Problem("p", "q", "1", extra={"checker": "broken"}))
    register_source("bad", "nanopar.data:Problem")
    with pytest.raises(NanoparError, match=r"^the plug-in 'nanopar.data:Problem' is a type, not a Source$"):
        load_problems("bad:x")
    register_source("quiet", Source(problems=list))
    with pytest.raises(NanoparError, match=r"^quiet:x: the source 'quiet' has no traces$"):
        load_traces("quiet:x")
    with pytest.raises(NanoparError, match="without ':'"):
        register_source("a:b", Source(problems=list))
