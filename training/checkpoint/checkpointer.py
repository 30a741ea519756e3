"""Saving and restoring a run: rank 0 writes whole files (last.pt, and the best ones by
trainer.checkpoint.monitor) from a background thread; `restore` puts everything back as it was when
the checkpoint was saved, the callbacks' state included."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from config.schema import ResumePoint
from distributed.collectives import all_gather_object
from distributed.context import DistContext
from distributed.strategies import unwrap
from errors import ConfigError, first_line
from training.batch_layout import BatchLayout
from training.callbacks import Callback
from training.checkpoint.best import BEST, BestCheckpoints, Plan
from training.checkpoint.files import fsync_dir, save_checkpoint
from training.checkpoint.resume import check_resumable, open_resume
from training.checkpoint.state import TrainState, gather_rng, host_copy

log = logging.getLogger("train")


class Checkpointer:
    """Saves and restores everything needed to continue a run as if it had never stopped.

    A save copies the state to host memory on the spot and writes it from a background thread
    (as torchtitan's async checkpointing does), so the steps go on while the file is serialised
    and fsynced; writes stay one at a time and in order, each atomic. `close()` waits for the last.
    `best`: which checkpoints to keep besides last.pt (None: none); `callbacks`: by name, whose
    state every checkpoint holds; `manifest`: what the run was made of (training.manifest), in every
    checkpoint too.
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
        best: BestCheckpoints | None = None,
        callbacks: Mapping[str, Callback] | None = None,
        manifest: dict[str, Any] | None = None,
    ):
        self.ctx, self.directory = ctx, directory
        self.model, self.optimizer, self.scheduler = unwrap(model), optimizer, scheduler
        self.scaler = scaler  # fp16's loss scale: resuming without it would re-learn it with skipped steps
        self.ema = ema  # trainer.ema_decay's averaged weights
        self.config_yaml = config_yaml
        self.best = best
        self.callbacks = dict(callbacks or {})
        self.manifest = manifest  # training.manifest's record of the run (rank 0's)
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []  # oldest first
        if best is not None:
            self._keep_an_earlier_runs_best()

    def _keep_an_earlier_runs_best(self) -> None:
        """best.pt only ever gets better, even one an earlier run left in this directory: a fresh run
        ranks it first (a resume's ranking, restored, replaces this). Rank 0 reads it; every rank
        ranks alike (strategy=fsdp's best files take every rank to write)."""
        kept = _ranked_in(self.directory / BEST) if self.ctx.is_main else None
        if self.ctx.world_size > 1:
            kept = all_gather_object(kept, self.ctx)[0]
        if kept is not None:
            self.best.load_state_dict(kept)
            self.best.kept = self.best.kept[:1]

    def save(self, state: TrainState, value: float | None = None, weights: str = "model") -> None:
        """last.pt; at validation's end (`value`: the monitored figure, scored by `weights`) also
        among the best, if it is: one snapshot for all.

        Every rank must call this for a mid-epoch save (it gathers their RNG states)."""
        rng = gather_rng(self.ctx) if state.batch else None
        plan = self.best.offer(value, state.epoch, state.step, weights) if value is not None and self.best else Plan()
        if not self.ctx.is_main:
            return
        snapshot = host_copy(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self.train_state(state, rng)}
        )
        # One writer thread writes the files in order, each atomically; with the write in flight
        # and this one queued, a third save waits: at most two snapshots are held at once.
        self._wait(keep=1)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        if plan.write is not None:
            self._pending.append(self._writer.submit(self.keep_best, snapshot, plan))
        self._pending.append(self._writer.submit(save_checkpoint, snapshot, self.directory / "last.pt"))

    def keep_best(self, snapshot: dict[str, Any], plan: Plan) -> None:
        """In the writer thread: the best so far keeps its place under its own name, the new one is
        written, and what fell out of the k best goes."""
        if plan.link is not None:
            link_atomically(self.directory / plan.link[0], self.directory / plan.link[1])
        save_checkpoint(snapshot, self.directory / plan.write)
        for name in plan.drop:
            (self.directory / name).unlink(missing_ok=True)

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
            "layout": asdict(state.layout) if state.layout is not None else None,  # what `batch` counts
            "stopped": state.stopped,
            "train_s": state.train_s,
            "speeds": list(state.speeds),  # a copy: the write may be queued while training appends
            "epoch_sums": state.epoch_sums,
            "window_sums": state.window_sums,
            "rng": rng,
            "best_checkpoints": self.best.state_dict() if self.best is not None else None,
            "callbacks": {name: loadable_state(name, callback) for name, callback in self.callbacks.items()},
            "config": self.config_yaml,
            "manifest": self.manifest,
        }

    def restore(self, point: ResumePoint | None) -> TrainState:
        """Every rank loads the same file (each rank opens it once); DDP's weights then agree without
        a broadcast. Every rank calls it, also with nothing to resume (None): the ranks agree on that
        first, so that a rank that sees no checkpoint where rank 0 sees one stops, not waits."""
        self.wait()
        checkpoint = open_resume(point, self.directory.parent, self.ctx)
        if point is None:
            return TrainState()
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
        if self.best is not None and checkpoint.get("best_checkpoints"):
            self.best.load_state_dict(checkpoint["best_checkpoints"])
        saved = checkpoint.get("callbacks") or {}
        for name, callback in self.callbacks.items():
            if name in saved:
                callback.load_state_dict(saved[name])
        state = TrainState(
            checkpoint["epoch"],
            checkpoint["step"],
            checkpoint["best"],
            checkpoint.get("batch", 0),
            best_val_acc5=checkpoint.get("best_acc5", -1.0),
            best_weights=checkpoint.get("best_weights", "model"),
            stopped=checkpoint.get("stopped"),
            layout=BatchLayout(**checkpoint["layout"]) if checkpoint.get("layout") else None,
            train_s=checkpoint.get("train_s", 0.0),  # an older checkpoint's: the clock starts afresh
            speeds=list(checkpoint.get("speeds") or []),
            epoch_sums=checkpoint.get("epoch_sums"),
            window_sums=checkpoint.get("window_sums"),
        )
        rng = checkpoint.get("rng")
        if rng is not None and len(rng) == self.ctx.world_size:
            state.rng = rng[self.ctx.rank]
        elif state.batch and state.layout is None:  # with a layout, batch_layout.carry_over says it
            log.warning("the checkpoint's world size differs: dropout randomness for the rest of this epoch will too")
        return state

    def load_weights(self, checkpoint: dict[str, Any]) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])


def loadable_state(name: str, callback: Callback) -> dict[str, Any]:
    """`callback`'s state_dict, once it is known to load back as every checkpoint is read
    (weights_only=True: a resume, predict.py, export.py). A numpy number (np.mean's) or an object of
    the callback's own would save without a word, then make every one of the run's checkpoints
    unreadable: the run stops at its first save instead, naming the callback and the type."""
    state = callback.state_dict()
    if not state:
        return state
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as e:
        pickled = re.search(r"GLOBAL (\S+)", str(e))
        what = f"a {pickled.group(1)}" if pickled else f"what torch cannot save ({first_line(e)})"
        raise ConfigError(
            f"callbacks.{name}: its state_dict() holds {what}, which a checkpoint cannot hold (they load with "
            "weights_only=True); give tensors and Python's own numbers, strings, lists and dicts "
            "(float(x), x.tolist(), torch.as_tensor(x))"
        ) from None
    return state


def link_atomically(source: Path, name: Path) -> None:
    """`name` becomes another name of `source`'s file, replacing any file of that name at once."""
    tmp = name.with_name(f".{name.name}.link")
    tmp.unlink(missing_ok=True)
    os.link(source, tmp)
    os.replace(tmp, name)
    fsync_dir(name.parent)


def _ranked_in(path: Path) -> dict[str, Any] | None:
    """The ranking a best.pt was saved with (its own entry first), if it can be read."""
    try:
        ranking = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("best_checkpoints")
    except Exception:  # no best.pt yet, or one we cannot read: nothing to protect
        return None
    return ranking if isinstance(ranking, dict) and ranking.get("kept") else None
