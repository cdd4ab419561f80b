"""What a run reads: its training problems, SFT traces, prompts, and held-out problems, checked.

    RunInputs(config, stages, schema)
      .problems("toy:easy")       a training set, less what an evaluation set holds out of it
      .traces(stage)              SFT traces: a distill stage's traces.jsonl or a data spec
      .check_traces(stage)        a data spec's traces, checked: present, and parallel where they must be
      .sft_example(record, stage, tok)  a trace as (prompt ids, response ids + EOS)
      .prompt(problem, tok, stage)  the prompt ids, with the stage's instructions
      .eval_sets() / .eval_problems(spec)   the resolved --eval-data and its first N problems
      .batch_of_step(items, n, stage, step)  what step `step` trains on (seeded, resumable)
      .check(chosen)              every setting and input of the stages, checked before any model loads

Loaded sets are kept for the run; `check` fails on a bad setting or input before any model loads
(not an hour in). Not here: models (runner.py), held-out evaluation (heldout.py), what "auto"
evaluation data means (defaults.py).
"""

from __future__ import annotations

import random
from pathlib import Path

from . import NanoparError, distributed
from .curriculum import Stage, TrainConfig, eval_sets, stage_folder
from .data import MIX, Problem, load_problems, load_traces, mix_parts, split_slice
from .format import check_parallel
from .forward import head_read_for
from .grpo import GRPOSettings
from .policy import Policy
from .prompts import build_prompt, instructions_named
from .rewards import schedule_from_string
from .sampler import SamplerSettings
from .tags import SCHEMAS, TagSchema

PARALLEL_SFT = "sft"  # the SFT stage that teaches the schema: Parallel-R1's cold start, NPR's parallel SFT


class RunInputs:
    """The data of one run, read through its config (every placeholder already resolved)."""

    def __init__(self, config: TrainConfig, stages: list[Stage], schema: TagSchema):
        self.config, self.stages, self.schema = config, stages, schema
        self._problems: dict[str, list[Problem]] = {}  # loaded training sets, by spec

    def problems(self, spec: str) -> list[Problem]:
        """A training set (--limit: its first N), less any tail of it an evaluation set holds out:
        with the evaluation set "x.jsonl[-100:]" the run trains on "x.jsonl[:-100]" (in a mix, each
        part less its own)."""
        if spec not in self._problems:
            config = self.config
            tails = list(map(_tail, self.eval_sets()))

            def kept(part: str) -> str:
                held = max((count for base, count in tails if base == part), default=0)
                return f"{part}[:-{held}]" if held else part
            self._problems[spec] = load_problems(MIX.join(map(kept, mix_parts(spec))), config.question_field or None,
                                                 config.answer_field or None, config.limit or None)
            if not self._problems[spec]:
                raise NanoparError(f"no problems in {spec}")
        return self._problems[spec]

    def traces(self, stage: Stage) -> list[dict]:
        """The SFT traces: a distill stage's output, or a data spec (a .jsonl, toy:parallel, ...)."""
        by_name = {s.name: s for s in self.stages}
        spec = (str(stage_folder(self.config.out, self.stages, by_name[stage.traces]) / "traces.jsonl")
                if stage.traces in by_name else stage.traces)
        try:
            return load_traces(spec, self.schema)
        except NanoparError as error:  # the same error, saying which stage asked
            raise NanoparError(f"{stage.name}: {error}") from None

    def check_traces(self, stage: Stage) -> str | None:
        """An SFT stage's traces from a data spec, checked before any model loads (a distill
        stage's are judged by its own filter as it writes them). None at all is a one-line
        NanoparError; so is, for the stage that teaches the schema (`PARALLEL_SFT`), none that is a
        valid parallel trace in the run's schema (`format.check_parallel`): a file in the other
        schema would train as plain text. Pretraining reads sequential text (the toy's instruct
        mix: mostly) and is not judged. -> the line to print when some traces are not parallel."""
        records = self.traces(stage)
        if not records:
            raise NanoparError(f"{stage.name}: no traces in {stage.traces}")
        if stage.name != PARALLEL_SFT:
            return None
        failed = [check.reason for r in records if not (check := check_parallel(r["response"], self.schema)).ok]
        if len(failed) == len(records):
            others = [s.name for s in SCHEMAS.values() if s != self.schema
                      and any(check_parallel(r["response"], s).ok for r in records)]
            hint = f"; they are written in the {others[0]} schema (--schema {others[0]})" if others else ""
            raise NanoparError(f"{stage.name}: none of the {len(records)} traces in {stage.traces} is a valid parallel "
                               f"trace in the {self.schema.name} schema (the first: {failed[0]}){hint}")
        if failed:
            return (f"{stage.name}: {len(records) - len(failed)} of {len(records)} traces are valid parallel traces "
                    f"in the {self.schema.name} schema; the other {len(failed)} train as they are written")
        return None

    def sft_example(self, record: dict, stage: Stage, tokenizer) -> tuple[list[int], list[int]]:
        """A trace as (prompt ids, response ids + EOS); a record that names its own "instructions"
        (the toy's instruction-following traces) is prompted with them. In structured mode the
        response is first written as the sampler writes it (`TagSchema.as_sampled`: the tags it
        inserts back to back), so the model learns what it will be fed. Tokenized when a step takes
        it: a short run reads a few of thousands."""
        problem = Problem(str(record.get("id", "")), record["question"], record.get("answer", ""))
        response = tokenizer.encode(self.as_trained(record["response"], stage), add_special_tokens=False)
        return self.prompt(problem, tokenizer, stage, record.get("instructions")), response + [tokenizer.eos_token_id]

    def as_trained(self, response: str, stage: Stage) -> str:
        """A trace's response as a stage trains on it (and reads a held-out one): as the sampler
        writes it in structured mode, as written in causal mode (the model writes every tag)."""
        return self.schema.as_sampled(response) if stage.mode == "structured" else response

    def prompt(self, problem: Problem, tokenizer, stage: Stage, instructions: str | None = None) -> list[int]:
        """The prompt ids of a problem, with the stage's instructions (or the named ones) as the
        stage's data source words them."""
        return build_prompt(problem, tokenizer, self.instructions(stage, instructions), chat=self.config.chat)

    def instructions(self, stage: Stage, name: str | None = None) -> str:
        """The text before each question of a stage: its instructions (or the named ones) as the
        stage's data source words them."""
        return instructions_named(name or stage.instructions, stage.data or stage.traces, self.schema)

    def batch_of_step(self, items: list, count: int, stage: Stage, step: int, stream: str = "") -> list:
        """The `count` items step `step` trains on: a seeded shuffle per epoch, so a resumed run
        takes the same ones. Another `stream` ("more": --filter-groups' further draws) shuffles the
        same items otherwise."""
        orders = {}  # epoch -> its shuffled order, drawn once per call (a step spans one or two epochs)
        picked = []
        for position in range(step * count, (step + 1) * count):
            epoch, index = divmod(position, len(items))
            if epoch not in orders:
                orders[epoch] = list(range(len(items)))
                random.Random(f"{self.config.seed}/{stage.name}/{stream + '/' if stream else ''}{epoch}").shuffle(
                    orders[epoch])
            picked.append(items[orders[epoch][index]])
        return picked

    def eval_sets(self) -> list[str]:
        """The --eval-data sets (`curriculum.eval_sets`)."""
        return eval_sets(self.config)

    def eval_problems(self, spec: str) -> list[Problem]:
        """The first --eval-problems problems of an evaluation set (a fixed list: every stage sees the same)."""
        config = self.config
        return load_problems(spec, config.question_field or None, config.answer_field or None, config.eval_problems)

    def check(self, chosen: list[Stage]) -> list[str]:
        """Fail on a bad setting, reward, data set or traces file before any model loads (not an
        hour in): the sampler's settings and every stage's prompt, mode and reward for the whole
        recipe (a misspelt reward of a later stage too), the data of the stages `chosen` to run.
        -> the lines to print about traces that are not all parallel (`check_traces`)."""
        config, notes = self.config, []
        SamplerSettings.from_flags(config).check()
        if config.eval_batch < 1:
            raise NanoparError(f"--eval-batch must be >= 1, not {config.eval_batch}")
        kinds = {stage.kind for stage in chosen if not stage.shipped}
        if "grpo" in kinds:  # torchrun: every process samples whole groups, the same number of them
            distributed.check_divides(config.prompts_per_step, "--prompts-per-step")
            if config.group_size < 2:  # a lone response has no group to be better or worse than
                raise NanoparError(f"--group-size must be >= 2 (GRPO compares a prompt's responses), not "
                                   f"{config.group_size}")
        if "sft" in kinds:
            distributed.check_divides(config.sft_batch, "--sft-batch")
        head_read_for(config.head_read, 0)  # a known training read
        for stage in self.stages:
            instructions_named(stage.instructions)
            Policy(None, stage.mode)  # a known attention mode
            if stage.kind == "grpo":
                schedule_from_string(stage.reward)
                try:  # the stage's GRPO settings (PAPO's single update, a known loss aggregation)
                    GRPOSettings.from_flags(config, stage)
                except NanoparError as error:
                    raise NanoparError(f"{stage.name}: {error}") from None
        for stage in chosen:
            if stage.shipped and not (Path(stage.shipped) / "config.json").is_file():
                raise NanoparError(f"--pretrained-base {stage.shipped}: not a model folder (no config.json); "
                                   "give a stage's final/ folder, or '' to pretrain here")
            if stage.kind in ("grpo", "distill"):
                self.problems(stage.data)
            if stage.kind == "sft" and stage.traces not in {s.name for s in self.stages}:
                notes += [note] if (note := self.check_traces(stage)) else []
        for spec in self.eval_sets() if config.eval_problems else []:
            self.eval_problems(spec)
        return notes


def _tail(spec: str) -> tuple[str, int]:
    """"x.jsonl[-100:]" -> ("x.jsonl", 100); a spec that is not a tail -> (spec, 0)."""
    name, part = split_slice(spec)
    if part is not None and part.start is not None and part.start < 0 and part.stop is None:
        return name, -part.start
    return spec, 0
