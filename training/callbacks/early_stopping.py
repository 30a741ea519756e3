"""callbacks=early_stopping: stop when a monitored figure has stopped improving."""

from __future__ import annotations

import math
from typing import Any

from training.callbacks import Callback
from training.monitor import Monitor


class EarlyStopping(Callback):
    """Stop training once `monitor` (a figure of validation's end, e.g. val/loss) has gone `patience`
    validations without improving on its best by more than `min_delta`; `mode`: min or max, the
    direction that is better, or auto: the one its name says (a loss min, an accuracy max). Its best
    and the patience spent are in every checkpoint, so a resumed run goes on counting where it
    stopped."""

    def __init__(self, monitor: str = "val/loss", mode: str = "auto", patience: int = 3, min_delta: float = 0.0):
        self.monitor = Monitor(monitor, mode, min_delta)
        if patience < 1:
            raise ValueError(f"patience={patience}: give 1 or more validations to wait")
        self.patience = patience
        self.best: float | None = None
        self.best_epoch = -1
        self.waited = 0  # validations since the best

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        value = self.monitor.value(figures)
        if math.isfinite(value) and self.monitor.improves(value, self.best):
            self.best, self.best_epoch, self.waited = value, epoch, 0
            return None
        self.waited += 1
        if self.waited < self.patience:
            return None
        best = "no finite value" if self.best is None else f"best {self.best:.6g} at epoch {self.best_epoch + 1}"
        return (
            f"early_stopping: {self.monitor.name} has not improved on its best by more than "
            f"{self.monitor.min_delta:g} for {self.patience} validation(s) ({best})"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.waited = state["best"], state["best_epoch"], state["waited"]
