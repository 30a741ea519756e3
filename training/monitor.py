"""A monitored figure: the name of a figure of validation's end, and which way is better. The best
checkpoints (trainer.checkpoint) and early stopping read one each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Monitor:
    name: str  # a figure of validation's end: val/acc, val/loss, val/macro_f1 (the confusion matrix's)
    mode: str = "max"  # max: higher is better; min: lower is (a MonitorMode's value)
    min_delta: float = 0.0  # an improvement must beat the best by more than this

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode={self.mode}: choose min or max")
        if self.min_delta < 0:
            raise ValueError(f"min_delta={self.min_delta}: give 0 or more")

    def value(self, figures: dict[str, float]) -> float:
        """The figure; the pre-flight checked that the run produces it (preflight._check_monitors)."""
        return float(figures[self.name])

    def improves(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta
