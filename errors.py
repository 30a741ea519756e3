"""The exception types meant for people: train.py prints each as one line and exits non-zero."""
from __future__ import annotations

import signal


class ConfigError(Exception):
    """A bad config value or environment; the message names the key, the value and the fix."""


class RankFailed(Exception):
    """One process of a multi-process job raised or died; the others were stopped."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} failed: {reason}; the other ranks were stopped")
        self.rank = rank


class Preempted(Exception):
    """A preemption signal stopped training after last.pt was saved; exit as the signal would."""

    def __init__(self, signum: int, is_main: bool = True) -> None:
        super().__init__(f"preempted by {signal.Signals(signum).name}")
        self.signum, self.is_main = signum, is_main

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class NonFiniteLoss(Exception):
    """trainer.nonfinite=stop: a loss was NaN or infinite; nothing after the last finite state was saved."""

    def __init__(self, step: int) -> None:
        super().__init__(
            f"the loss became non-finite (NaN or inf) at optimizer step {step}; stopped without saving "
            "past it (last.pt holds the last finite state); lower optimizer.lr, set trainer.grad_clip, "
            "or skip such steps with trainer.nonfinite=skip"
        )
        self.step = step
