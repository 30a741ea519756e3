"""When last.pt is saved between validations: the Trainer asks `due(step)` after each optimizer step
(each validation's end saves anyway, and so does a preemption), and says `saved()` after any save.

Every trainer.checkpoint_every_n_steps steps, which every rank counts alike; and once
trainer.checkpoint_every_n_seconds have passed since the last save. Each rank's clock would answer
that at a different step, and a mid-epoch save takes every rank (a rank that saves while another
steps on waits for it forever): rank 0's clock decides, and its answer reaches the other ranks in
the all-reduce the preemption watch already runs at its check steps (training/preemption.py), so no
step pays a collective of its own. A single process reads its own clock at every step."""

from __future__ import annotations

import time
from collections.abc import Callable


class SaveCadence:
    """`agreed`: the run has several ranks, so a save by time comes only as a check of the
    preemption watch agreed it (`agree`; PreemptionWatch.carry)."""

    def __init__(
        self,
        every_n_steps: int | None,
        every_n_seconds: float | None = None,
        agreed: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_n_steps, self.every_n_seconds = every_n_steps, every_n_seconds
        self.agreed, self.clock = agreed, clock
        self._since = clock()  # the last save, or the start
        self._agreed_due = False

    def time_is_up(self) -> bool:
        """What this process's clock says; under `agreed`, rank 0's is the one that counts."""
        return self.every_n_seconds is not None and self.clock() - self._since >= self.every_n_seconds

    def agree(self, due: bool) -> None:
        """A check's answer, the same on every rank: save after this step."""
        self._agreed_due = due

    def due(self, step: int) -> bool:
        by_steps = self.every_n_steps is not None and step % self.every_n_steps == 0
        by_time, self._agreed_due = (self._agreed_due if self.agreed else self.time_is_up()), False
        return by_steps or by_time

    def saved(self) -> None:
        """last.pt was saved, for whatever reason: the seconds count from here."""
        self._since = self.clock()
