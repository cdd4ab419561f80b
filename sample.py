"""Sample parallel-thinking traces from a model and show them as trees.

    python sample.py --model Qwen/Qwen3-0.6B --prompt "What is 17 * 23?" --paths 2
    python sample.py --model runs/toy/stage3 --prompts-file problems.jsonl --samples 4 --json out.json

The model is a hub id, a local model folder, or a nanopar checkpoint (a folder with a LoRA
adapter and its tokenizer). Prompts come from --prompt or a file: plain text (one prompt per
line) or JSON Lines with a "prompt", "problem" or "question" field. Every sampler knob of
`nanopar.sampler.SamplerSettings` is a flag. Not here: grading answers (eval.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from nanopar import NanoparError
from nanopar.config import parse_config
from nanopar.model import ModelSettings, load_model
from nanopar.sampler import SamplerSettings, sample
from nanopar.show import rollout_record, trace_tree
from nanopar.tags import TagIds

PROMPT_FIELDS = ("prompt", "problem", "question")


@dataclass
class SampleConfig(SamplerSettings):
    model: str = ""  # hub id, local model folder, or nanopar checkpoint folder (required)
    prompt: str = ""  # one prompt (or use --prompts-file)
    prompts_file: str = ""  # text file, one prompt per line, or JSON Lines with prompt/problem/question
    samples: int = 1  # responses per prompt
    chat: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    system: str = ""  # system message for the chat template ("" = none)
    temperature: float = 0.7  # 0 = greedy
    load_in_4bit: bool = False  # quantise the base model to NF4 (bitsandbytes)
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto
    device: str = "auto"  # cpu / cuda / auto
    json: str = ""  # write machine-readable results here ("-" = stdout, no trees)
    seed: int | None = 0  # seeds the draws


def read_prompts(config: SampleConfig) -> list[str]:
    """The prompts of --prompt and --prompts-file, in order; a bad line is a one-line error."""
    prompts = [config.prompt] if config.prompt else []
    if config.prompts_file:
        path = Path(config.prompts_file)
        if not path.is_file():
            raise NanoparError(f"prompts file not found: {path}")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix != ".jsonl":
                prompts.append(line)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise NanoparError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            field = next((f for f in PROMPT_FIELDS if isinstance(record, dict) and f in record), None)
            if field is None:
                raise NanoparError(f"{path}:{number}: no {'/'.join(PROMPT_FIELDS)} field")
            prompts.append(str(record[field]))
    if not prompts:
        raise NanoparError("no prompt: give --prompt or --prompts-file")
    return prompts


def encode_prompt(tokenizer, text: str, config: SampleConfig) -> list[int]:
    """Token ids of a prompt, through the chat template when asked for and available."""
    if config.chat and tokenizer.chat_template:
        messages = ([{"role": "system", "content": config.system}] if config.system else []) + [
            {"role": "user", "content": text}
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def stop_ids(model, tokenizer) -> list[int]:
    """EOS ids of the tokenizer and of the model's generation config (Qwen chat: <|im_end|>)."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
    return sorted(i for i in ids if i is not None)


def main(argv: list[str] | None = None) -> list[dict]:
    config = parse_config(SampleConfig, argv, description=__doc__.split("\n")[0])
    if not config.model:
        raise NanoparError("--model is required (hub id, local folder or nanopar checkpoint)")
    settings = SamplerSettings(**{f: getattr(config, f) for f in SamplerSettings.__dataclass_fields__})
    settings.check()  # before the (slow) model load
    prompts = read_prompts(config)
    model, tokenizer = load_model(
        ModelSettings(config.model, dtype=config.dtype, device=config.device, load_in_4bit=config.load_in_4bit)
    )
    tag_ids = TagIds.from_tokenizer(tokenizer)
    ids = [encode_prompt(tokenizer, p, config) for p in prompts]
    rollouts = sample(model, ids, settings, tag_ids, stop_ids(model, tokenizer), len(tokenizer), config.samples)
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
    except NanoparError as error:
        sys.exit(f"error: {error}")
