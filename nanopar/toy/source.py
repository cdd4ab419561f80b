"""The toy world as a data source: the tokenizer and model, and problems and traces by name.

    SOURCE.problems("toy:easy")      # 20,000 seeded training problems ("toy:easy:heldout": the split)
    SOURCE.traces("toy:parallel")    # 4,000 teacher traces, a mix of TEACHER_MIXES, as SFT records
    SOURCE.model("toy:model", ...)   # (model, tokenizer): a ~0.8M-parameter Qwen3, seed 0

`toy_tokenizer` is word-level: the task's words whole, every other character a token, the tags
special tokens. `SOURCE` is data.SOURCES["toy"]: the general modules reach the toy through it (and
through grading.CHECKERS["countdown"]) and never import it.

Not here: the task and its checker (task.py), how a trace is written (teacher.py).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from .. import NanoparError
from ..data import Problem, Source
from ..tags import PARALLEL_R1, TagSchema, add_tag_tokens
from ..tiny import tiny_qwen_config, word_tokenizer
from .task import FINAL, LEVELS, heldout, make_problems
from .committed import committed_parallel_trace, committed_sequential_trace
from .teacher import TRACE_KINDS, npr_trace, parallel_trace, sequential_trace


# --------------------------------------------------------------------------- tokenizer and model


WORDS = [FINAL, "numbers", "target", "yes", "no", "vs", " so "]  # whole tokens; everything else is a character


def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer (`tiny.word_tokenizer`): the task's words, then one token per
    printable ASCII character, tab and newline, so any ASCII text round-trips exactly (spaces
    included); the six tags are single (special) tokens, added last. EOS is also the pad token, as
    in `tiny.char_tokenizer` and base Qwen: nanopar never infers a loss mask from padding, every
    batch carries an explicit mask.
    """
    tokenizer = word_tokenizer(WORDS, whitespace="\t\n", clean_up_tokenization_spaces=False)
    add_tag_tokens(tokenizer)
    return tokenizer


def toy_model_config(tokenizer=None, hidden_size: int = 128, num_layers: int = 4):
    """The toy model's Qwen3 config: ~0.8M parameters (hidden 128, 4 layers, 4 heads / 2 KV heads,
    MLP 384), vocabulary = the tokenizer's size rounded up to 64 (128 for `toy_tokenizer()`)."""
    tokenizer = tokenizer or toy_tokenizer()
    config = tiny_qwen_config("qwen3", vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=hidden_size,
                              num_layers=num_layers, num_heads=4, num_kv_heads=2,
                              intermediate_size=3 * hidden_size, max_positions=1024)
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    return config


MODEL_NAME = "toy:model"  # what `model.load_model` builds through SOURCE


def toy_model(name: str = MODEL_NAME, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """(model, tokenizer): the toy model (`toy_model_config`) initialised with seed 0, eval mode."""
    if name != MODEL_NAME:
        raise NanoparError(f"unknown toy model {name!r}: use {MODEL_NAME}")
    tokenizer = toy_tokenizer()
    config = toy_model_config(tokenizer)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------- as data for the stages

TOY_TRAIN_PROBLEMS = 20_000  # problems per level behind "toy:easy" / "toy:hard" (seeded, may repeat)


def toy_problems(spec: str) -> list[Problem]:
    """Problems named "toy:easy", "toy:hard" (training) or "toy:easy:heldout", "toy:hard:heldout"."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1] not in LEVELS or (len(parts) == 3 and parts[2] != "heldout"):
        raise NanoparError(f"unknown toy data {spec!r}: use toy:easy, toy:hard, toy:easy:heldout or toy:hard:heldout")
    if len(parts) == 3:
        return heldout(parts[1])
    return list(_training_problems(parts[1], TOY_TRAIN_PROBLEMS))


@functools.lru_cache(maxsize=4)
def _training_problems(level: str, n: int) -> tuple[Problem, ...]:
    """Generated once per process."""
    return tuple(make_problems(level, n, seed={"easy": 1, "hard": 2}[level]))


INSTRUCTIONS = {"parallel": "in parallel", "plain": "", "none": ""}  # what the toy's prompts say, by name

TEACHER_MIXES = {  # trace set name -> (level, kind, share) parts
    "toy:sequential": [("easy", "sequential", 0.5), ("hard", "sequential", 0.5)],  # a base model (Parallel-R1's)
    # an instruct model (NPR's): it follows the parallel instructions some of the time, since a
    # tenth of its traces are prompted "in parallel" and written as a parallel trace, in the tags of
    # the schema asked for, and a twentieth on hard problems: with easy ones only, its rounds apply
    # 3-number routines to 4 numbers and no NPR stage ever sees a correct hard round (docs/results.md)
    "toy:instruct": [("easy", "sequential", 0.45), ("hard", "sequential", 0.4), ("easy", "instructed", 0.1),
                     ("hard", "instructed", 0.05)],
    # the cold start (in NPR's tags: NPR's cold start): easy parallel traces, some hard sequential
    # ones so the model does not apply 3-number patterns to 4-number problems, and a few hard
    # parallel (exploring) ones: Parallel-R1's cold start is GSM8K only, but the toy model does
    # not carry the format from easy to hard problems as an LLM carries it from GSM8K to DAPO
    # (docs/toy.md: what happens without either)
    "toy:parallel": [("easy", "parallel", 0.75), ("hard", "parallel", 0.1), ("hard", "sequential", 0.15)],
    # the cold start with correction traces: a slip of the kind the base makes (a miss said to check
    # out) caught by a block of checks that says "no", then more tries (teacher.py); what a block
    # can buy beyond time, tried as the default and not kept: it did not raise accuracy (docs/toy.md)
    "toy:checked": [("easy", "parallel", 0.55), ("easy", "correction", 0.15), ("hard", "parallel", 0.1),
                    ("hard", "correction", 0.05), ("hard", "sequential", 0.15)],
    # the committed teacher's world (committed.py): a chain that stays with an approach and varies
    # it, a block whose paths are different approaches; a base in the shares of toy:sequential, and
    # two cold starts: the shares of toy:parallel, and "-half" half hard (a quarter of hard blocks,
    # a quarter of hard chains), whose cold start costs the base's hard chains less (docs/toy.md:
    # both measured). Parallel-R1's tags only; `--preset committed` runs it
    "toy:committed": [("easy", "committed-sequential", 0.5), ("hard", "committed-sequential", 0.5)],
    "toy:parallel-committed": [("easy", "committed-parallel", 0.75), ("hard", "committed-parallel", 0.1),
                               ("hard", "committed-sequential", 0.15)],
    "toy:parallel-committed-half": [("easy", "committed-parallel", 0.5), ("hard", "committed-parallel", 0.25),
                                    ("hard", "committed-sequential", 0.25)],
}


def teacher_traces(spec: str, schema: TagSchema = PARALLEL_R1, n: int = 4000, seed: int = 3) -> list[dict]:
    """`n` teacher traces as SFT records (question, answer, response) for a name of TEACHER_MIXES;
    an "instructed" record also names its prompt's instructions ("parallel"). The parallel and
    instructed traces are written in `schema`'s tags (`npr_trace` for a schema with plans, else
    `parallel_trace`); the sequential ones have no tags and do not depend on it. Fresh records each
    call, from one generation per process (a run reads its traces more than once)."""
    if spec not in TEACHER_MIXES:
        raise NanoparError(f"unknown toy traces {spec!r}: use one of {', '.join(TEACHER_MIXES)}")
    return [dict(record) for record in _generated_traces(spec, schema, n, seed)]


@functools.lru_cache(maxsize=8)
def _generated_traces(spec: str, schema: TagSchema, n: int, seed: int) -> tuple[dict, ...]:
    """`teacher_traces`' records, generated once per process for each set of arguments."""
    rng, records = random.Random(seed), []
    parallel = npr_trace if schema.planned else parallel_trace
    write = {"sequential": lambda p: sequential_trace(p, rng),
             "committed-sequential": lambda p: committed_sequential_trace(p, rng),
             "committed-parallel": lambda p: committed_parallel_trace(p, rng, schema=schema)}
    for level, kind, share in TEACHER_MIXES[spec]:
        for problem in make_problems(level, round(n * share), seed=seed * 7 + len(records)):
            response = write[kind](problem) if kind in write else parallel(
                problem, rng, schema=schema, kind=kind if kind in TRACE_KINDS else None)
            records.append({"id": problem.id, "question": problem.question, "answer": problem.answer,
                            "response": response} | ({"instructions": "parallel"} if kind == "instructed" else {}))
    rng.shuffle(records)
    return tuple(records)


# The base of each recipe, pretrained by that recipe's own pretrain stage at train.py's defaults and
# shipped with the package (bases/README.md: the command that rebuilds one, what it reaches)
SHIPPED_BASES = {recipe: str(Path(__file__).parent / "bases" / recipe) for recipe in ("parallel-r1", "npr")}

# the toy world as a data source (data.SOURCES["toy"]): "toy:easy" problems, "toy:parallel" traces, "toy:model"
SOURCE = Source(problems=toy_problems, traces=teacher_traces, model=toy_model, model_names=(MODEL_NAME,),
                instructions=INSTRUCTIONS, bases={"parallel-r1": "toy:sequential", "npr": "toy:instruct"},
                shipped_bases=SHIPPED_BASES, heldout_sets={f"toy:{level}": f"toy:{level}:heldout" for level in LEVELS})
