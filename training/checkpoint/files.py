"""A checkpoint on disk: written to a temp file, fsynced and renamed into place, so that a crash
leaves the old file whole; read with weights_only=True, every way it can be wrong one line."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from errors import ConfigError, first_line

FIX = "point trainer.resume at a last.pt or best.pt written by train.py, or at its run dir"


def run_dir_of(path: Path) -> Path | None:
    """The run dir `path` names: itself, where it holds checkpoints/, or the one above its own
    checkpoints/ folder, as a user copies it from a listing; None for any other path."""
    if (path / "checkpoints").is_dir():
        return path
    return path.parent if path.name == "checkpoints" and path.is_dir() else None


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temp file, fsync, then rename over `path`: a crash leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    drop_unnamed_versions(path)  # an fsdp run's sharded last.pt, now that this file replaced its link


def fsync_dir(directory: Path) -> None:
    """A rename is durable only once the directory entry is on disk too."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_unnamed_versions(path: Path, named: str | None = None) -> None:
    """Delete strategy=fsdp's sharded versions of `path` (its `last.pt.step120.3fa9c1/` directories)
    but the one `path` names now, if any: once `path` no longer names them nothing reads them."""
    for old in path.parent.glob(f"{path.name}.step*"):
        if old.name != named and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """weights_only=True: a checkpoint can carry tensors and primitives, never code.

    Read to host memory: load_state_dict copies each tensor to its parameter's device. Read to a
    GPU, the file would be a second model and optimizer beside the first (and under FSDP the whole
    of both on every rank), and Adam's step counts, which optimizer.load_state_dict leaves where
    they were read (torch/optim/optimizer.py), would stay there: a host sync per parameter per step.
    `mmap`: tensors are read from the file only when used (a check that reads shapes reads none)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise no_such_checkpoint(path) from None
    except Exception as e:  # torch raises several types for truncated, corrupt or pickled files
        pickled = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if pickled:
            raise ConfigError(
                f"trainer.resume={path}: refused, it holds a pickled Python object ({pickled.group(1)}) and "
                f"checkpoints load with weights_only=True; {FIX}"
            ) from None
        detail = str(e).split("WeightsUnpickler error:")[-1]  # torch's advice comes first
        raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({first_line(detail)}); {FIX}") from None
    return checkpoint


def no_such_checkpoint(resume: str | Path | None) -> ConfigError:
    return ConfigError(f"trainer.resume={resume}: no such file; give an existing checkpoint path")


def trained_config(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config the checkpoint's run trained with, if it holds one that parses."""
    text = checkpoint.get("config")
    if not isinstance(text, str):
        return None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return config if isinstance(config, dict) else None
