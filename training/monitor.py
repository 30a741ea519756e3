"""A monitored figure: the name of a figure of validation's end, and which way is better. The best
checkpoints (trainer.checkpoint) and early stopping read one each."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A figure's name that says which way is better (its last part): a loss, a cross-entropy or a
# time lower; an accuracy, an F1 or a throughput higher. As validation's end names them (val/loss,
# val_ema/ce, time/train_s; val/acc5, val/macro_f1, throughput/samples_per_s) and as metrics.json
# does (val_loss, wall_s; best_val_acc, train_samples_per_s). Others say none: a norm, a size, a
# callback's own figure.
_LOWER = re.compile(r"(\w*_)?(loss|ce)|wall_s|(train|data)_s")
_HIGHER = re.compile(r"(\w*_)?(acc\d*|f1|samples_per_s)")


def better_way(name: str) -> str | None:
    """min or max (a Monitor's mode) for a figure whose name says which way is better; else None."""
    last = name.rsplit("/", 1)[-1]
    return "min" if _LOWER.fullmatch(last) else "max" if _HIGHER.fullmatch(last) else None


@dataclass(frozen=True)
class Monitor:
    name: str  # a figure of validation's end: val/acc, val/loss, val/macro_f1 (the confusion matrix's)
    # max: higher is better; min: lower is; auto: the way the name says, made min or max here. A
    # name that says none stays auto, which ranks nothing: the pre-flight refuses it, once it has
    # checked the name (a typo's "did you mean" first). A MonitorMode's value.
    mode: str = "auto"
    min_delta: float = 0.0  # an improvement must beat the best by more than this

    def __post_init__(self) -> None:
        if self.mode == "auto":
            object.__setattr__(self, "mode", better_way(self.name) or "auto")
        if self.mode not in ("auto", "min", "max"):
            raise ValueError(f"mode={self.mode}: choose auto, min or max")
        if self.min_delta < 0:
            raise ValueError(f"min_delta={self.min_delta}: give 0 or more")

    def value(self, figures: dict[str, float]) -> float:
        """The figure; the pre-flight checked that the run produces it (preflight._check_monitors)."""
        return float(figures[self.name])

    def improves(self, value: float, best: float | None) -> bool:
        if self.mode == "auto":
            raise ValueError(f"mode=auto: {self.name}'s name does not say which way is better; give min or max")
        if best is None:
            return True
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta
