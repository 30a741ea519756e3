"""trainer.checkpoint: the k best checkpoints by a monitored figure. best.pt is always the best of
them; the others are best-epoch<E>-step<S>.pt; last.pt is kept beside them. Which files hold which
value is part of every checkpoint, so a resumed run goes on ranking where it stopped."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from config.schema import CheckpointConfig
from training.monitor import Monitor

BEST = "best.pt"


@dataclass
class Kept:
    value: float  # the monitored figure it scored
    epoch: int  # the epoch it was saved at (from 1)
    step: int
    weights: str = "model"  # whose weights scored it: model, or ema
    name: str = BEST

    @property
    def own_name(self) -> str:
        """Its name once another checkpoint is the best."""
        return f"best-epoch{self.epoch}-step{self.step}.pt"


@dataclass(frozen=True)
class Plan:
    """What a save does with the best files: `link` hard-links best.pt to its own name before
    best.pt is replaced (the best so far steps down to second: no moment without a best.pt);
    `write`: the name the new checkpoint is written to (None: it is not among the best); `drop`:
    the files that fell out of the k best."""

    write: str | None = None
    link: tuple[str, str] | None = None
    drop: tuple[str, ...] = ()


class BestCheckpoints:
    def __init__(self, monitor: Monitor, top_k: int) -> None:
        self.monitor, self.top_k = monitor, top_k
        self.kept: list[Kept] = []  # best first
        # An earlier ranking's files that this one does not keep (load_state_dict): the next best
        # save drops them, so the directory holds one ranking's k best.
        self.stale: list[str] = []

    @classmethod
    def chosen(cls, options: CheckpointConfig) -> BestCheckpoints:
        """The ranking trainer.checkpoint asks for."""
        return cls(Monitor(options.monitor, options.mode.value), options.save_top_k)

    def offer(self, value: float, epoch: int, step: int, weights: str = "model") -> Plan:
        """A checkpoint that scored `value`: whether it is among the k best, and what that moves. A
        tie is no improvement: the first to reach a score keeps its place."""
        if not math.isfinite(value):  # a diverged epoch is never among the best
            return Plan()
        rank = next((i for i, k in enumerate(self.kept) if self.monitor.improves(value, k.value)), len(self.kept))
        if rank >= self.top_k:
            return Plan()
        new = Kept(value, epoch, step, weights)
        new.name = BEST if rank == 0 else new.own_name
        link = None
        if rank == 0 and self.kept and self.top_k > 1:
            self.kept[0].name = self.kept[0].own_name
            link = (BEST, self.kept[0].name)
        self.kept.insert(rank, new)
        dropped, self.kept = self.kept[self.top_k :], self.kept[: self.top_k]
        # A best.pt that was not linked away is replaced by the new one, not dropped.
        drop = (*self.stale, *(k.name for k in dropped if k.name != BEST))
        self.stale = []
        return Plan(write=new.name, link=link, drop=drop)

    @property
    def best(self) -> Kept | None:
        return self.kept[0] if self.kept else None

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor.name, "mode": self.monitor.mode, "kept": [asdict(k) for k in self.kept]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A run that ranked by another figure (trainer.checkpoint changed between runs) starts the
        ranking afresh, and one that keeps fewer keeps the best of them. The files it no longer
        keeps go at its next best save (best.pt is replaced by it): none stays to pass for one of
        this ranking's."""
        earlier = [Kept(**k) for k in state["kept"]]
        same = (state.get("monitor"), state.get("mode")) == (self.monitor.name, self.monitor.mode)
        self.kept = earlier[: self.top_k] if same else []
        self.stale = [k.name for k in earlier if k not in self.kept and k.name != BEST]
