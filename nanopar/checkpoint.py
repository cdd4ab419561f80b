"""Checkpoints that are either complete or absent, and resuming from the latest one.

A checkpoint is a folder `checkpoint-<step>/` with the model (LoRA adapter + tag rows, or the
full model), its tokenizer, `trainer_state.pt` (optimiser, scheduler, a float16 model's loss scaler, step, RNG states) and the
run's config. It is written under a temporary name and renamed into place only when every file
is there, so a crash or a Ctrl-C mid-write leaves no folder that looks like a checkpoint. The
stage's result is the same kind of folder, named `final/`; the next stage loads it as a model.
A model folder copied into place (a shipped base becoming a stage's `final/`) is copied the same
way, whole or not at all (`copy_model_folder`).
Not here: what a stage does with its state (runner.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import torch

from .model import save_checkpoint_model
from .tags import PARALLEL_R1, TagSchema, schema_named

STATE = "trainer_state.pt"
RUN_CONFIG = "run_config.json"  # the run's resolved config, saved with each checkpoint


def copy_model_folder(source: str | Path, folder: Path, leave_out: str = "") -> None:
    """Copy the model folder `source` to `folder` under a temporary name first, then rename it
    into place, leaving out files named `leave_out`."""
    temporary = folder.with_name(f".{folder.name}.incomplete")
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(source, temporary, ignore=shutil.ignore_patterns(leave_out) if leave_out else None)
    os.replace(temporary, folder)


def save_checkpoint(folder: str | Path, model, tokenizer, optimizer=None, scheduler=None, step: int = 0,
                    config: dict | None = None, scaler=None) -> Path:
    """Write a complete checkpoint at `folder` (replacing an older one of the same name)."""
    folder = Path(folder)
    temporary = folder.with_name(f".{folder.name}.incomplete-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    save_checkpoint_model(model, tokenizer, str(temporary))
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "loss_scaler": scaler.state_dict() if scaler is not None else None,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        },
        temporary / STATE,
    )
    (temporary / RUN_CONFIG).write_text(json.dumps(config or {}, indent=2) + "\n")
    move_into_place(temporary, folder)
    return folder


def move_into_place(temporary: Path, folder: Path) -> None:
    """Rename the complete folder `temporary` to `folder`. An older `folder` is moved aside first
    and removed last, so one complete copy exists at every moment."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
        os.replace(temporary, folder)
        shutil.rmtree(old)
    else:
        os.replace(temporary, folder)


def trained_with(model: str) -> dict:
    """What a nanopar checkpoint says of how it was trained, from its run_config.json: {"schema",
    "mode", "path_stride", "instructions"} as far as it holds them ({} for any other model). The
    mode and the prompt are the stage's own (NPR's format RL is causal in a structured run, a
    baseline is prompted plainly in a parallel run), saved by the runner."""
    saved = run_config(model) if model else {}
    return {key: saved[key] for key in ("schema", "mode", "path_stride", "instructions") if key in saved}


def trained_schema(model: str) -> TagSchema:
    """The tag schema a nanopar checkpoint was trained in (Parallel-R1's for any other model)."""
    return schema_named(trained_with(model).get("schema", PARALLEL_R1.name))


def run_config(folder: str | Path) -> dict:
    """The whole run_config.json a checkpoint was saved with ({} where there is none)."""
    path = Path(folder) / RUN_CONFIG
    return json.loads(path.read_text()) if path.is_file() else {}


def latest_checkpoint(stage_folder: str | Path) -> Path | None:
    """The complete `checkpoint-<step>` with the highest step in a stage folder, or None."""
    steps = []
    for path in Path(stage_folder).glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and (path / STATE).is_file():
            steps.append((int(match.group(1)), path))
    return max(steps)[1] if steps else None


def load_trainer_state(folder: str | Path, optimizer=None, scheduler=None, scaler=None) -> int:
    """Restore optimiser, scheduler, loss scaler and RNG states from a checkpoint; return its step."""
    state = torch.load(Path(folder) / STATE, weights_only=False)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("loss_scaler") is not None:
        scaler.load_state_dict(state["loss_scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    return state["step"]


def prune_checkpoints(stage_folder: str | Path, keep: int) -> None:
    """Remove all but the `keep` most recent complete checkpoints (0 = keep all)."""
    if keep <= 0:
        return
    found = sorted((int(p.name.split("-")[1]), p) for p in Path(stage_folder).glob("checkpoint-*")
                   if re.fullmatch(r"checkpoint-\d+", p.name))
    for _, path in found[:-keep]:
        shutil.rmtree(path)
