"""strategy=fsdp's checkpoints: last.pt sharded, best.pt whole.

    checkpoints/
      last.pt -> last.pt.step120.3fa9c1      a symlink, swapped atomically
      last.pt.step120.3fa9c1/                a torch.distributed.checkpoint directory:
        .metadata                            shapes, dtypes, which file holds which shard
        __0_0.distcp  __1_0.distcp ...       each rank's shards; rank 0's also the train state
      best.pt                                one file, the unwrapped model: loads under any strategy
      .last.pt.shards.tmp/                   only while a save is under way, or after a kill in one

Every rank writes its shards of last.pt into `.last.pt.shards.tmp` (not the whole-file save's
`.last.pt.tmp`, which a run killed under another strategy may have left); once all have (DCP's
save returns on rank 0 after the last rank's files and the metadata are fsynced), rank 0 renames
the directory to its own name and points last.pt at it by renaming a new symlink over the old
one: a kill at any moment leaves last.pt naming a whole checkpoint, so trainer.resume=auto never
reads a half-written one. best.pt costs a gather of the whole model and optimizer state to rank
0's host memory, once per epoch that improves.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import torch
from torch import nn

from distributed.collectives import all_gather_object, barrier
from distributed.context import DistContext
from training.checkpoint import (
    Checkpointer,
    TrainState,
    _gather_rng,
    confirm_shared,
    drop_unnamed_versions,
    save_checkpoint,
)


class ShardedCheckpointer(Checkpointer):
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
        manifest: dict | None = None,
    ):
        super().__init__(ctx, directory, model, optimizer, scheduler, config_yaml, scaler, ema, manifest)
        # Gathering best.pt takes every rank, so every rank must agree on whether to save it.
        self._best_on_disk = all_gather_object(self._best_on_disk, ctx)[0]

    def save(self, state: TrainState, best: bool = False) -> None:
        """Every rank writes its shards of last.pt; rank 0 commits it. best.pt first, when `best`."""
        if best:
            self._save_best(state)
        rng = _gather_rng(self.ctx) if state.batch else None
        name = "last.pt"
        final = self.directory / name
        tmp = self.directory / f".{name}.shards.tmp"
        if self.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a save a kill interrupted
            tmp.mkdir(parents=True)
        confirm_shared(tmp, self.ctx)  # every rank's shards must land where rank 0 commits them
        _sharded_state().save(tmp, self.model, self.optimizer, self._train_state(state, rng), self.ctx)
        if self.ctx.is_main:
            _commit(tmp, final, f"{name}.step{state.step}.{secrets.token_hex(3)}")
        # No rank may start the next save's writes into the temp directory before it is renamed.
        barrier(self.ctx)

    def _save_best(self, state: TrainState) -> None:
        """best.pt only ever gets better; it is one file in the format every strategy loads."""
        if not self._better_than_on_disk(state):
            return
        model_state, optimizer_state = _sharded_state().full_state(self.model, self.optimizer)
        rng = _gather_rng(self.ctx) if state.batch else None
        if self.ctx.is_main:
            payload = {"model": model_state, "optimizer": optimizer_state, **self._train_state(state, rng)}
            save_checkpoint(payload, self.directory / "best.pt")

    def _load_weights(self, checkpoint: dict) -> None:
        """A whole checkpoint (best.pt, or any strategy's last.pt file): each rank keeps its shards."""
        _sharded_state().load_full(self.model, self.optimizer, checkpoint["model"], checkpoint["optimizer"])


def _sharded_state():
    """Imported by FSDP runs only: torch.distributed.checkpoint is slow to import."""
    from distributed import sharded_state

    return sharded_state


def _commit(tmp: Path, final: Path, version: str) -> None:
    """Rename the written directory to `version` and point `final` at it, atomically; then drop
    the versions nothing points at any more."""
    directory = final.parent
    _fsync(tmp)
    os.rename(tmp, directory / version)
    link = directory / f".{final.name}.link"
    link.unlink(missing_ok=True)
    os.symlink(version, link)  # relative: the run dir can be moved or copied whole
    os.replace(link, final)
    _fsync(directory)
    drop_unnamed_versions(final, named=version)


def _fsync(directory: Path) -> None:
    """Renames are durable only once the directory entry is on disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
