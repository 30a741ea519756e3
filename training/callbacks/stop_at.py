"""callbacks=stop_at: stop once a monitored figure reaches a value (a time-to-accuracy run)."""

from __future__ import annotations

from training.callbacks import Callback


class StopAt(Callback):
    """Stop training at the first validation whose `monitor` reaches `value`: at least it with
    mode=max, at most it with mode=min."""

    def __init__(self, monitor: str = "val/acc", mode: str = "max", value: float = 0.98) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode}: choose min or max")
        self.monitor, self.mode, self.value = monitor, mode, value

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        reached = figures[self.monitor] >= self.value if self.mode == "max" else figures[self.monitor] <= self.value
        return f"stop_at: {self.monitor} reached {self.value:g} ({figures[self.monitor]:.4f})" if reached else None
