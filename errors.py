"""The exception types meant for people: train.py prints each as one line and exits non-zero."""

from __future__ import annotations

import re
import signal


def first_line(e: BaseException | str) -> str:
    """An exception's message (or a message) cut to its first line, for a one-line error that quotes it."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


class ConfigError(Exception):
    """A bad config value or environment; the message names the key, the value and the fix."""


def config_error_within(error: BaseException | None) -> ConfigError | None:
    """The ConfigError a wrapper was raised over: OmegaConf keeps a resolver's exception only as the
    context of its own."""
    while error is not None and not isinstance(error, ConfigError):
        error = error.__context__
    return error


def raised_elsewhere(traceback: str) -> ConfigError | NonFiniteLoss | None:
    """The error meant for people that another process raised, from the traceback it left: its last
    line reads `errors.ConfigError: <message>` (a spawned rank's error file, a DataLoader worker's
    re-raise) or `errors.NonFiniteLoss: ... at optimizer step <n>; ...` (every rank of a diverged run)."""
    lines = traceback.strip().splitlines()
    last = lines[-1] if lines else ""
    if last.startswith(_prefix(ConfigError)):
        return ConfigError(last.removeprefix(_prefix(ConfigError)))
    diverged = re.match(rf"{re.escape(_prefix(NonFiniteLoss))}.* at optimizer step (\d+);", last)
    return NonFiniteLoss(int(diverged[1])) if diverged else None


def _prefix(kind: type[Exception]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}: "


class RankFailed(Exception):
    """One process of a multi-process job raised or died; the others were stopped. `traceback`: the
    one it raised, where it raised one (a spawned rank's goes to a file, not to the console)."""

    def __init__(self, rank: int, reason: str, traceback: str | None = None) -> None:
        super().__init__(f"rank {rank} failed: {reason}; the other ranks were stopped")
        self.rank, self.traceback = rank, traceback


class Preempted(Exception):
    """A preemption signal stopped training after last.pt was saved; exit as the signal would.
    `requeued`: rank 0 requeues the SLURM job once the ranks have left the group. `saved`: false when
    the signal ended the ranks before they could save (they were starting, or a second Ctrl-C)."""

    def __init__(self, signum: int, is_main: bool = True, requeued: bool = False, saved: bool = True) -> None:
        super().__init__(
            "interrupted by Ctrl-C (SIGINT)"
            if signum == signal.SIGINT
            else f"preempted by {signal.Signals(signum).name}"
        )
        self.signum, self.is_main, self.requeued, self.saved = signum, is_main, requeued, saved

    @property
    def exit_code(self) -> int:
        # The other ranks of a job that rank 0 requeues leave quietly: exited 128 + the signal, they
        # would make `srun --kill-on-bad-exit` kill rank 0 before its `scontrol requeue` ran.
        return 0 if self.requeued and not self.is_main else 128 + self.signum


class NonFiniteLoss(Exception):
    """trainer.nonfinite=stop: a loss was NaN or infinite; nothing past its step was saved.

    A save follows an optimizer step, so the weights saved last may have diverged already, and a
    resume restores the saved learning rate over optimizer.lr: the fix names only what works."""

    def __init__(self, step: int) -> None:
        super().__init__(
            f"the loss became non-finite (NaN or inf) at optimizer step {step}; nothing past it was saved, but "
            "last.pt may hold weights that had already diverged (no loss had been computed with them when saved); "
            "resume from checkpoints/best.pt, whose weights were validated, with trainer.grad_clip set or "
            "trainer.nonfinite=skip, or train afresh with a lower optimizer.lr (a resume keeps the saved learning rate)"
        )
        self.step = step
