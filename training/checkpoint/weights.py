"""A trained run's weights, read for a use other than continuing it (predict.py, export.py,
trainer.init_from): the checkpoint a run dir or a path names, and its model's or its EMA's weights,
from a whole file or strategy=fsdp's sharded last.pt, as plain CPU tensors."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from config import setup
from errors import ConfigError
from models.weights import fitting
from training.checkpoint.files import run_dir_of

WEIGHTS = ("best", "model", "ema")  # best: best_weights(checkpoint)
FIX = "give a run dir, or a checkpoint train.py wrote (<run dir>/checkpoints/best.pt or last.pt)"


def checkpoint_path(source: str | Path) -> Path:
    """`source` itself (a checkpoint file, or strategy=fsdp's sharded directory), or, for a run dir
    (or its checkpoints/ folder), its checkpoints/best.pt (the best epoch's weights), else its last.pt."""
    source = Path(source)
    if (run_dir := run_dir_of(source)) is not None:
        for name in ("best.pt", "last.pt"):
            if (run_dir / "checkpoints" / name).exists():
                return run_dir / "checkpoints" / name
        raise ConfigError(f"{run_dir}: no checkpoints/best.pt or last.pt in it; {FIX}")
    if source.is_dir() and not _sharded(source):
        if runs := _runs_in(source):
            shown = ", ".join(str(run) for run in runs[:3]) + (f", ... {len(runs) - 3} more" if len(runs) > 3 else "")
            raise ConfigError(
                f"{source}: holds {len(runs)} runs, not one; give one of them ({shown}); "
                f"python -m bench.report {source} compares them"
            )
        raise ConfigError(f"{source}: neither a run dir (no checkpoints/ in it) nor a sharded checkpoint; {FIX}")
    if not source.exists():
        raise ConfigError(f"{source}: no such file or run dir; {FIX}")
    return source


def _runs_in(folder: Path) -> list[Path]:
    """The run dirs a folder of runs holds: a -m sweep's jobs, a day's runs (outputs/<date>), two
    levels down at most. What a user gives after a sweep, where a run was asked for."""
    found = {path.parent for pattern in ("*/checkpoints", "*/*/checkpoints") for path in folder.glob(pattern)}
    return sorted((run for run in found if run_dir_of(run) == run), key=lambda run: setup.job_order(str(run)))


def best_weights(checkpoint: dict[str, Any]) -> str:
    """Whose weights, the model's or the EMA's, scored the figure the run ranks its checkpoints by
    (trainer.checkpoint.monitor) at this checkpoint's validation; else (a save between validations,
    or a checkpoint from before the ranking) those that scored the run's best accuracy."""
    kept = (checkpoint.get("best_checkpoints") or {}).get("kept", [])
    at = (checkpoint.get("epoch"), checkpoint.get("step"))
    own = next((entry["weights"] for entry in kept if (entry["epoch"], entry["step"]) == at), None)
    return own or checkpoint.get("best_weights", "model")


def chosen_weights(checkpoint: dict[str, Any], weights: str = "best") -> tuple[str, dict[str, torch.Tensor]]:
    """(model or ema, their state) from a checkpoint `read` returned; `weights`: one of WEIGHTS. The
    model's where the checkpoint holds no EMA."""
    chosen = best_weights(checkpoint) if weights == "best" else weights
    if chosen == "ema" and checkpoint.get("ema") is not None:
        # AveragedModel's state: the averaged module's under module., and its update count
        return "ema", {k.removeprefix("module."): v for k, v in checkpoint["ema"].items() if k != "n_averaged"}
    return "model", checkpoint["model"]


def _sharded(path: Path) -> bool:
    """strategy=fsdp's last.pt: a torch.distributed.checkpoint directory (through its symlink)."""
    if not path.is_dir():
        return False
    from training.checkpoint.sharded import METADATA  # late: it imports torch.distributed.checkpoint, slow

    return (path / METADATA).is_file()


def read(path: Path) -> dict[str, Any]:
    """The checkpoint's train state, config, manifest and weights (its "model", and "ema" if it
    kept one), from a whole file or a sharded directory, as plain CPU tensors; loaded with
    weights_only=True, as resuming does."""
    # torch's words for these files advise re-saving a checkpoint, or call it corrupted.
    if path.is_file() and path.suffix in (".pt2", ".onnx"):
        raise ConfigError(
            f"{path}: a model export.py wrote, not a checkpoint; give the run dir it was exported from "
            "(its metadata's checkpoint)"
        )
    if path.is_file() and not zipfile.is_zipfile(path):
        why = "not a zip archive as torch.save writes: another kind of file, or a truncated copy"
        raise ConfigError(f"{path}: not a loadable checkpoint ({why}); {FIX}")
    try:
        if _sharded(path):
            from training.checkpoint import sharded  # late: torch.distributed.checkpoint is slow to import

            return sharded.read_whole(path)
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # the optimizer state unread
    except Exception as e:  # torch raises several types for a truncated, corrupt or foreign file
        detail = str(e).split("WeightsUnpickler error:")[-1].strip()  # torch's advice comes first
        reason = detail.splitlines()[0] if detail else type(e).__name__
        raise ConfigError(f"{path}: not a loadable checkpoint ({reason}); {FIX}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise ConfigError(f"{path}: not a checkpoint train.py wrote (no model weights); {FIX}")
    return checkpoint


def start_from(model: nn.Module, source: str) -> tuple[Path, str, list[str]]:
    """trainer.init_from: load into `model` the best weights (best_weights) of the run or checkpoint
    `source` names; (the checkpoint read, whose weights: model or ema, the keys kept fresh). A tensor
    shaped otherwise (a head for another number of classes) keeps its fresh initialisation."""
    try:
        path = checkpoint_path(source)
        checkpoint = read(path)
    except ConfigError as e:
        raise ConfigError(f"trainer.init_from: {e}") from None
    chosen, state = chosen_weights(checkpoint)
    try:
        loaded, fresh = fitting(model, state)
    except ValueError as e:
        raise ConfigError(
            f"trainer.init_from={source}: the weights in {path} are another model's ({e}); give a run of this "
            "model, or the model it trained (its .hydra/config.yaml's model)"
        ) from None
    model.load_state_dict(loaded, strict=False)
    return path, chosen, fresh
