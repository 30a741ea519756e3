"""Saving and restoring a run: rank 0 writes whole files (last.pt, best.pt) from a background
thread; `restore` puts everything back as it was when the checkpoint was saved."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from config.schema import ResumePoint
from distributed.context import DistContext
from distributed.strategies import unwrap
from training.checkpoint.files import save_checkpoint
from training.checkpoint.resume import check_resumable, open_resume
from training.checkpoint.state import TrainState, gather_rng, host_copy

log = logging.getLogger("train")


class Checkpointer:
    """Saves and restores everything needed to continue a run as if it had never stopped.

    A save copies the state to host memory on the spot and writes it from a background thread
    (as torchtitan's async checkpointing does), so the steps go on while the file is serialised
    and fsynced; writes stay one at a time and in order, each atomic. `close()` waits for the last.
    """

    def __init__(
        self,
        ctx: DistContext,
        directory: Path,
        model: nn.Module,
        optimizer,
        scheduler,
        config_yaml: str,
        scaler: torch.amp.GradScaler | None = None,
        ema: nn.Module | None = None,
    ):
        self.ctx, self.directory = ctx, directory
        self.model, self.optimizer, self.scheduler = unwrap(model), optimizer, scheduler
        self.scaler = scaler  # fp16's loss scale: resuming without it would re-learn it with skipped steps
        self.ema = ema  # trainer.ema_decay's averaged weights
        self.config_yaml = config_yaml
        self._best_on_disk = _best_in(directory / "best.pt") if ctx.is_main else None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []  # oldest first

    def save(self, state: TrainState, best: bool = False) -> None:
        """last.pt, after best.pt when `best` and better than any best.pt on disk: one snapshot for both.

        Every rank must call this for a mid-epoch save (it gathers their RNG states)."""
        rng = gather_rng(self.ctx) if state.batch else None
        if not self.ctx.is_main:
            return
        names = ["best.pt"] if best and self.better_than_on_disk(state) else []
        snapshot = host_copy(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self.train_state(state, rng)}
        )
        # One writer thread writes the files in order, each atomically; with the write in flight
        # and this one queued, a third save waits: at most two snapshots are held at once.
        self._wait(keep=1)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        for name in [*names, "last.pt"]:
            self._pending.append(self._writer.submit(save_checkpoint, snapshot, self.directory / name))

    def better_than_on_disk(self, state: TrainState) -> bool:
        """best.pt only ever gets better, even one left by an earlier run in this directory."""
        if self._best_on_disk is not None and state.best_val_acc <= self._best_on_disk:
            return False
        self._best_on_disk = state.best_val_acc
        return True

    def wait(self) -> None:
        """Until every save is on disk; a failed write raises here."""
        self._wait(keep=0)

    def _wait(self, keep: int) -> None:
        """Until at most `keep` writes are left queued or in flight; the first that failed raises."""
        while len(self._pending) > keep:
            self._pending.pop(0).result()

    def close(self) -> None:
        self.wait()
        if self._writer is not None:
            self._writer.shutdown()

    def train_state(self, state: TrainState, rng: list | None) -> dict[str, Any]:
        """Everything but the weights and the optimizer state: the same in both checkpoint forms."""
        return {
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,  # {} when disabled
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "epoch": state.epoch,
            "step": state.step,
            "best": state.best_val_acc,
            "best_acc5": state.best_val_acc5,
            "best_weights": state.best_weights,
            "batch": state.batch,
            "rng": rng,
            "config": self.config_yaml,
        }

    def restore(self, point: ResumePoint) -> TrainState:
        """Every rank loads the same file (each rank opens it once); DDP's weights then agree without
        a broadcast."""
        self.wait()
        checkpoint = open_resume(point, self.directory.parent, self.ctx)
        if checkpoint is None:  # strategy=fsdp's sharded last.pt, resharded to this world size and strategy
            from training.checkpoint import sharded  # torch.distributed.checkpoint: slow to import

            checkpoint = sharded.load(point.path, self.model, self.optimizer, self.ctx)
        else:
            check_resumable(checkpoint, self.model, point.path)
            self.load_weights(checkpoint)
        if self.scheduler is not None and checkpoint["scheduler"] is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        if self.scaler is not None and checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])
        if self.ema is not None and checkpoint.get("ema") is not None:
            self.ema.load_state_dict(checkpoint["ema"])
        elif self.ema is not None:
            log.warning("%s holds no EMA weights: the average starts afresh from the restored model", point.path)
        state = TrainState(
            checkpoint["epoch"],
            checkpoint["step"],
            checkpoint["best"],
            checkpoint.get("batch", 0),
            best_val_acc5=checkpoint.get("best_acc5", -1.0),
            best_weights=checkpoint.get("best_weights", "model"),
        )
        rng = checkpoint.get("rng")
        if rng is not None and len(rng) == self.ctx.world_size:
            state.rng = rng[self.ctx.rank]
        elif state.batch:
            log.warning("the checkpoint's world size differs: dropout randomness for the rest of this epoch will too")
        return state

    def load_weights(self, checkpoint: dict[str, Any]) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])


def _best_in(path: Path) -> float | None:
    try:
        return float(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["best"])
    except Exception:  # no best.pt yet, or one we cannot read: nothing to protect
        return None
