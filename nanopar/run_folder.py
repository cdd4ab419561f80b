"""Which run folder a command writes into, and whether it may reuse what the folder holds.

A run folder keeps one folder per stage and the resolved config of the command that last ran in
it (config.json). Running a command again resumes it: a finished stage is skipped, a stage with
checkpoints goes on. That is right only when the stage would be trained the same way now, so
`check_reuse` compares, for every stage the folder already holds (finished or begun), its
settings under the saved config with its settings under the command's, and refuses in one line,
naming the flags that differ and the way out (`--out`, or `--restart`, which deletes those stages'
folders and trains them again). A stage's settings (`stage_settings`) are its recipe entry (data,
steps, reward, prompt, mode, learning rate, ...), the flags that change the model it makes
(`RESULT_FLAGS`, by kind of stage; --reward-file for a GRPO stage whose reward names one of its
rewards) and, recursively, the settings of the stage it starts from and
of the stage whose traces it reads: a changed cold start makes every later stage stale. Flags
that change nothing a stage makes (`BOOKKEEPING`: where it is written, what is evaluated, memory
and speed knobs, which change a model only by float rounding) never refuse; the evaluation is
keyed on its own settings and redone when they change (heldout.py). A stage not yet begun
simply runs with the command's settings.

`default_out` names the folder when --out is not given: the toy's runs/default, a real model's
runs/<its name>, a stage's model runs/<run>-<stage>-final, NPR's with "-npr" (a preset names its
own); `check_out` refuses a folder that holds the run's input model.
Not here: resuming a stage from a checkpoint (runner.py, checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from . import NanoparError
from .curriculum import Stage, TrainConfig, stage_folder, starting_stage
from .rewards import names_user_rewards

MODEL = ("model", "load_in_4bit", "dtype", "lora", "lora_rank", "lora_alpha", "lora_dropout", "schema",
         "path_stride", "chat", "seed", "limit", "question_field", "answer_field")
SAMPLING = ("temperature", "paths", "max_new_tokens", "max_blocks", "max_path_tokens", "top_p", "top_k")
OPTIMISER = ("warmup_steps", "weight_decay", "max_grad_norm")
RESULT_FLAGS = {  # by kind of stage: the flags besides its recipe entry that change what it makes
    "sft": MODEL + OPTIMISER + ("sft_batch", "sft_schedule", "tag_lr_scale"),
    "grpo": MODEL + SAMPLING + OPTIMISER + ("prompts_per_step", "group_size", "unbiased_std", "updates", "clip", "clip_high",
                                            "loss_agg", "kl_beta", "filter_groups", "max_draws", "pool_samples",
                                            "pool_problems"),
    "distill": MODEL + SAMPLING + ("distill_problems",),
}
PER_STAGE = ("reward_file",)  # flags only some stages read: `stage_settings` adds them to those
# flags that change no stage's model or traces (every other TrainConfig field is in RESULT_FLAGS or feeds
# a stage's recipe entry, a test checks the split is complete)
BOOKKEEPING = ("out", "start_from", "trial", "recipe", "stages", "skip", "plot", "preset", "ablations", "restart", "baseline", "device",
               "micro_batch", "micro_batch_tokens", "gradient_checkpointing", "head_read", "checkpoint_every",
               "keep_checkpoints", "sample_every", "save_rollouts", "eval_data", "eval_problems", "eval_samples", "eval_batch",
               "eval_model")


def default_out(config: TrainConfig, built: bool) -> str:
    """The folder of a run given no --out: runs/default for a model built from code (the toy),
    runs/<model name> for real weights; "-npr" for NPR's recipe (runs/npr for the toy)."""
    parts = [p for p in config.model.replace("\\", "/").split("/") if p]
    name = parts[-1].removeprefix("pypi:").removesuffix(".gguf") if parts else "model"
    if name == "final" or name.startswith("checkpoint-"):  # a stage's model: say which run and stage
        name = "-".join(parts[-3:])
    elif built:
        return "runs/npr" if config.recipe == "npr" else "runs/default"
    return f"runs/{name}" + ("-npr" if config.recipe == "npr" else "")


def check_out(config: TrainConfig) -> None:
    """Refuse a --start-from that does not exist, and a run folder that holds the model the run
    starts from (a stage of another run: its folder is that run's; a stage started from its own
    run's model is the recipe's, not --model)."""
    if config.start_from and not Path(config.start_from).exists():
        raise NanoparError(f"--start-from {config.start_from}: no such folder (a stage's final/ or checkpoint-N/)")
    model = Path(config.model)
    if model.exists() and Path(config.out).resolve() in model.resolve().parents:
        raise NanoparError(f"--out {config.out} holds the model this run starts from ({config.model}): give this "
                           "run its own --out (the run that made the model keeps its folder)")


def stage_settings(config: TrainConfig, stages: list[Stage], stage: Stage) -> dict:
    """What decides the model (or traces) `stage` makes under `config`: its recipe entry, the
    flags of `RESULT_FLAGS[kind]`, and the settings of the stages it starts from and reads."""
    settings = {"stage": dataclasses.asdict(stage),
                "flags": {name: getattr(config, name) for name in RESULT_FLAGS.get(stage.kind, MODEL)}}
    if stage.kind == "grpo" and names_user_rewards(stage.reward):  # only the stages that read --reward-file
        settings["flags"] |= {name: getattr(config, name) for name in PER_STAGE}
    source = starting_stage(stages, stage)
    if source is not None:
        settings["starts from"] = stage_settings(config, stages, source)
    traces = next((s for s in stages if s.name == stage.traces), None)
    if traces is not None:
        settings["traces from"] = stage_settings(config, stages, traces)
    return settings


def begun(folder: Path) -> bool:
    """Whether a stage folder holds a result or a start of one (final/, traces.jsonl, checkpoints)."""
    return folder.is_dir() and any((folder / "final").exists() or (folder / "traces.jsonl").exists()
                                   or p.name.startswith("checkpoint-") for p in folder.iterdir())


def saved_run(out: Path) -> tuple[TrainConfig, list[Stage]] | None:
    """The config and stages config.json saved (fields this version lacks are dropped, those it
    added take their defaults); None when the folder has none."""
    path = out / "config.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise NanoparError(f"{path} is not valid JSON ({error}): fix it, or give this run another --out") from None
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    stage_fields = {f.name for f in dataclasses.fields(Stage)}
    if saved.get("dtype") == "auto":  # saved before --dtype auto was resolved: a model built from code, on a CPU
        saved["dtype"] = "float32"  # (real weights had theirs resolved on a CPU; no GPU ran nanopar then)
    config = TrainConfig(**{k: v for k, v in saved.items() if k in fields})
    stages = [Stage(**{k: v for k, v in s.items() if k in stage_fields}) for s in saved.get("resolved_stages", [])]
    return config, stages


def stale_stages(config: TrainConfig, stages: list[Stage]) -> tuple[list[Stage], list[str]]:
    """(the begun stages whose settings changed, "--flag saved -> now" of the flags that differ)."""
    saved = saved_run(Path(config.out))
    if saved is None:
        return [], []
    old_config, old_stages = saved
    old_by_folder = {stage_folder(config.out, old_stages, s).name: s for s in old_stages}
    stale = []
    for stage in stages:
        folder = stage_folder(config.out, stages, stage)
        if not begun(folder):
            continue
        old = old_by_folder.get(folder.name)
        if old is None or stage_settings(old_config, old_stages, old) != stage_settings(config, stages, stage):
            stale.append(stage)
    flags = [f"--{f.name.replace('_', '-')} {getattr(old_config, f.name)!r} -> {getattr(config, f.name)!r}"
             for f in dataclasses.fields(TrainConfig)
             if f.name not in BOOKKEEPING and getattr(old_config, f.name) != getattr(config, f.name)]
    return stale, flags


def check_reuse(config: TrainConfig, stages: list[Stage], log=None) -> list[str]:
    """Refuse, in one line, a command whose settings differ from those the folder's begun stages
    were trained with; under --restart delete those stages' folders (and their lines of
    metrics.jsonl, through `log`) instead. -> the folder names deleted."""
    stale, flags = stale_stages(config, stages)
    if not stale:
        return []
    folders = [stage_folder(config.out, stages, stage) for stage in stale]
    if not config.restart:
        changed = "; ".join(flags) if flags else "the recipe's stages"
        raise NanoparError(f"{config.out} holds {', '.join(f.name for f in folders)}, trained with other settings "
                           f"({changed}): give this run its own --out, or add --restart to delete "
                           f"{'them' if len(stale) > 1 else 'it'} and train again")
    for stage, folder in zip(stale, folders):
        shutil.rmtree(folder)
        if log is not None:
            log.drop_after(stage.name, -1)  # every line of the stage
    return [folder.name for folder in folders]
