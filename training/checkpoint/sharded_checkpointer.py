"""strategy=fsdp's Checkpointer: last.pt written by every rank as shards (training/checkpoint/sharded.py
holds the form), best.pt whole. Imported only for a sharded run: it imports torch.distributed.checkpoint,
slow to import."""

from __future__ import annotations

import secrets
import shutil

from distributed.collectives import barrier
from training.checkpoint.best import Plan
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.resume import confirm_shared
from training.checkpoint.sharded import commit, full_state, load_full, save
from training.checkpoint.state import TrainState, gather_rng


class ShardedCheckpointer(Checkpointer):
    """Every rank ranks the best checkpoints alike (from the same figures): writing one gathers the
    whole model from every rank."""

    def save(self, state: TrainState, value: float | None = None, weights: str = "model") -> None:
        """Every rank writes its shards of last.pt; rank 0 commits it. A best one first, when `value`
        is among the k best."""
        rng = gather_rng(self.ctx) if state.batch else None
        plan = self.best.offer(value, state.epoch, state.step, weights) if value is not None and self.best else Plan()
        if plan.write is not None:
            model_state, optimizer_state = full_state(self.model, self.optimizer)
            if self.ctx.is_main:
                payload = {"model": model_state, "optimizer": optimizer_state, **self.train_state(state, rng)}
                self.keep_best(payload, plan)
        name = "last.pt"
        final = self.directory / name
        tmp = self.directory / f".{name}.shards.tmp"
        if self.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a save a kill interrupted
            tmp.mkdir(parents=True)
        confirm_shared(tmp, self.ctx)  # every rank's shards must land where rank 0 commits them
        save(tmp, self.model, self.optimizer, self.train_state(state, rng), self.ctx)
        if self.ctx.is_main:
            commit(tmp, final, f"{name}.step{state.step}.{secrets.token_hex(3)}")
        # No rank may start the next save's writes into the temp directory before it is renamed.
        barrier(self.ctx)

    def load_weights(self, checkpoint: dict) -> None:
        """A whole checkpoint (best.pt, or any strategy's last.pt file): each rank keeps its shards."""
        load_full(self.model, self.optimizer, checkpoint["model"], checkpoint["optimizer"])
