"""Checkpoints: plain tensors and primitives, written atomically by rank 0 only."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distributed.context import DistContext
from distributed.strategy import unwrap
from errors import ConfigError


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temp file, fsync, then rename over `path`: a crash leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """weights_only=True: a checkpoint can carry tensors and primitives, never code."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"trainer.resume={path}: no such file; give an existing checkpoint path") from None
    except Exception as e:  # torch raises several types for truncated, corrupt or pickled files
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"trainer.resume={path}: not a loadable checkpoint ({first_line}); "
            "point trainer.resume at a last.pt or best.pt written by train.py"
        ) from None


@dataclass
class TrainState:
    epoch: int = 0  # the next epoch to run
    step: int = 0  # optimizer steps taken so far
    best_val_acc: float = -1.0


class Checkpointer:
    """Saves and restores everything needed to continue a run as if it had never stopped."""

    def __init__(
        self, ctx: DistContext, directory: Path, model: nn.Module, optimizer, scheduler, config_yaml: str,
        scaler: torch.amp.GradScaler | None = None,
    ):
        self.ctx, self.directory = ctx, directory
        self.model, self.optimizer, self.scheduler = unwrap(model), optimizer, scheduler
        self.scaler = scaler  # fp16's loss scale: resuming without it would re-learn it with skipped steps
        self.config_yaml = config_yaml

    def save(self, name: str, state: TrainState) -> None:
        if not self.ctx.is_main:
            return
        save_checkpoint(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,  # {} when disabled
                "epoch": state.epoch,
                "step": state.step,
                "best": state.best_val_acc,
                "config": self.config_yaml,
            },
            self.directory / name,
        )

    def restore(self, path: Path) -> TrainState:
        """Every rank loads the same file; DDP's weights then agree without a broadcast."""
        checkpoint = load_checkpoint(path, self.ctx.device)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.scheduler is not None and checkpoint["scheduler"] is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        if self.scaler is not None and checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])
        return TrainState(checkpoint["epoch"], checkpoint["step"], checkpoint["best"])
