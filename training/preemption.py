"""Preemption: a signal asks the job to stop; every rank finishes its step and rank 0 saves last.pt.

SLURM (`--signal=USR1@90`, a preemption's or scancel's SIGTERM), submitit (USR2), torchrun's agent
(the SIGTERM it forwards, or the one each rank gets when its agent dies) and people send a signal
to one process or to all of them. The handler only notes it; the ranks agree to stop at the same
step through an all-reduce at check steps they all compute alike, so that the hot path stays free
of a host sync per step. What is left after the signal is a grace period in seconds
(`trainer.preempt_grace_s`: SLURM's KillWait, torchrun's --shutdown-timeout) before SIGKILL, so the
checks are spaced in seconds too: at each one the ranks all-reduce the flag together with the
seconds per step each measured since the last check, and from the slowest rank's all pick the same
next check step, a quarter of the grace period ahead. The rest of it is for saving last.pt. The same
all-reduce carries rank 0's answer to whether a save is due by time (trainer.checkpoint_every_n_seconds,
training/checkpoint/cadence.py), and the checks then come at least a quarter of that apart too.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from config.overrides import sweep_command
from config.redact import redact
from config.schema import taken_signals
from distributed.collectives import all_reduce_max
from distributed.context import DistContext
from errors import Preempted
from training.checkpoint.cadence import SaveCadence

log = logging.getLogger("train")

# The part of trainer.preempt_grace_s that a signal may wait for the next agreed check.
_CHECK_SHARE = 0.25
# A SIGINT sent to every process of a job at once (`pkill -INT -f train.py`; SLURM's to a job step's)
# reaches a spawned rank twice, itself and as the copy its launcher passes on (the terminal's
# Ctrl-C reaches the launcher alone: distributed/launch.py). A SIGINT within this many seconds of
# the last is that copy, a later one another Ctrl-C.
_SAME_CTRL_C_S = 1.0
# True in a search's trial that runs in a process of its own (the sweeper's _processes.py): Ctrl-C,
# or SLURM's signal to all of a job step's processes, reaches the search and all its trials at once,
# and the search alone says how to continue it, or requeues the job, once.
explained_by_search = False


class PreemptionWatch:
    """Notes preemption signals; `should_stop(step)` says, on every rank alike, when to stop.
    `requeue_on`: the signals after which rank 0 requeues a SLURM job (train.py does, once the
    ranks have left the group)."""

    def __init__(
        self,
        ctx: DistContext,
        signals: list[signal.Signals],
        grace_s: float,
        requeue_on: list[signal.Signals] | tuple = (),
    ) -> None:
        self.ctx, self.grace_s, self.requeue_on = ctx, grace_s, tuple(requeue_on)
        self.received = 0  # the signal number, once one arrives
        self._sigint_at = -math.inf  # when the last SIGINT came (time.monotonic)
        self._next_check = 0  # the first step after the start: what it took sets the next check
        self._last_check: tuple[float, int | None] = (time.perf_counter(), None)  # (clock, step) of the last check
        self._previous = {sig: signal.signal(sig, self._note) for sig in taken_signals(signals)}
        self.saves: SaveCadence | None = None

    def carry(self, saves: SaveCadence) -> None:
        """Every check also agrees on rank 0's `saves.time_is_up()`, for every rank's `saves.due`."""
        self.saves = saves

    def _note(self, signum: int, frame: Any) -> None:
        # A second Ctrl-C stops at once, as Python's own handler does: past a validation or a
        # collective that takes long, or a hang (a KeyboardInterrupt from here, in the main thread).
        # The copy a launcher passes on of either Ctrl-C is not another one. That copy can run inside
        # this handler, between any two of its bytecodes: what was received is read before anything
        # it sets, so that neither call takes the other for an earlier Ctrl-C.
        received = self.received
        if signum == signal.SIGINT:
            now = time.monotonic()
            copy = now - self._sigint_at <= _SAME_CTRL_C_S
            self._sigint_at = now
            if received and not copy:
                raise KeyboardInterrupt
        self.received = received or signum  # no logging here: its locks are not signal-safe

    def should_stop(self, step: int, force: bool = False) -> bool:
        """Collective at the agreed check steps (or when `force`): call it on every rank, every step."""
        if not self.ctx.distributed:  # the flag is this process's own: no sync to save
            return self._stopping(step) if self.received else False
        if not (force or step >= self._next_check):
            return False
        clock, last_step = self._last_check
        # The first check has timed no step: the start's work came before it, and a resumed run never took the
        # steps before its first (over them, a resume at step 200 put its next check ~1000 steps away, past the
        # grace period). The next step is checked, and timed.
        seconds_per_step = math.inf if last_step is None else (time.perf_counter() - clock) / max(1, step - last_step)
        save_due = self.saves is not None and self.ctx.is_main and self.saves.time_is_up()
        agreed = torch.tensor([self.received, seconds_per_step, save_due], dtype=torch.float64, device=self.ctx.device)
        received, slowest, save_due = all_reduce_max(agreed, self.ctx).tolist()
        if self.saves is not None:
            self.saves.agree(bool(save_due))
        self._next_check = step + max(1, int(_CHECK_SHARE * self._check_every_s() / max(slowest, 1e-6)))
        self._last_check = (time.perf_counter(), step)
        if not received:  # a signal noted as the all-reduce returned, too late for it, counts at the next check
            return False
        self.received = int(received)
        return self._stopping(step)

    def _check_every_s(self) -> float:
        every_n_seconds = self.saves.every_n_seconds if self.saves is not None else None
        return self.grace_s if every_n_seconds is None else min(self.grace_s, every_n_seconds)

    def _stopping(self, step: int) -> bool:
        if self.ctx.is_main:
            log.warning("%s: every rank stops after step %d; saving last.pt", signal.Signals(self.received).name, step)
        return True

    def preempted(self) -> Preempted:
        return Preempted(
            self.received, self.ctx.is_main, requeued=self.received in self.requeue_on and _slurm_job_id() is not None
        )

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> PreemptionWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def requeue_or_explain(preempted: Preempted, requeue_on: list[signal.Signals], resume_command: str) -> None:
    """Under SLURM a requeue signal puts the job back in the queue; otherwise say how to resume (under
    torchrun, which may be re-forming the group, only if it was stopped)."""
    if not preempted.is_main or explained_by_search:
        return
    job = _slurm_job_id()
    if job and preempted.signum in requeue_on:
        # The requeue ends the job's processes with SIGTERM, this one too: it leaves by itself, once it has said so.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
            if result.returncode == 0:
                log.warning("%s: requeued SLURM job %s; it resumes from last.pt when it starts again", preempted, job)
                return
            reason = result.stderr.strip() or f"exit code {result.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = str(e)
        log.error("scontrol requeue %s failed: %s", job, reason)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent SIGTERMs its ranks to re-form the group, too
        log.warning(
            "%s: last.pt is saved; if torchrun is re-forming the group (a node joined or left), it starts the "
            "ranks again from there by itself; if the job was stopped, resume with: %s",
            preempted,
            resume_command,
        )
        return
    if not preempted.saved:
        log.warning(
            "%s before the ranks saved last.pt; continue from the last save, if any, with: %s",
            preempted,
            resume_command,
        )
        return
    log.warning("%s: last.pt is saved; resume with: %s", preempted, resume_command)


def resume_command(overrides: list[str], run_dir: str) -> str:
    """The command that continues this run: the same overrides (config.overrides.command_overrides),
    this run dir, resume=auto; a password among them shown as *** (it goes to the log): type it again,
    or give it through the environment."""
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", "trainer.resume="))]
    # Under torchrun, on every node as the job started: `python train.py` would resume it as one process.
    start = "torchrun <its options, as before> train.py" if "TORCHELASTIC_RUN_ID" in os.environ else "python train.py"
    return redact(f"{start} {shlex.join([*kept, f'hydra.run.dir={run_dir}', 'trainer.resume=auto'])}")


def sweep_resume_command(overrides: list[str], sweep_dir: str, search: bool) -> str:
    """The command that continues a -m sweep one of whose jobs was stopped (`overrides`: the sweep's
    own, config.overrides.sweep_command), not that job alone: in the sweep's dir, with resume=auto,
    each job goes on from its last.pt, says it had ended, or starts. A search's own command instead:
    its study runs the trial cut short again, and refuses any other override (one study, one search)."""
    if search:
        return redact(shlex.join(["python", "train.py", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]))
    kept = [o for o in overrides if not o.startswith("trainer.resume=")]
    return redact(
        shlex.join(["python", "train.py", "-m", *kept, f"hydra.sweep.dir={sweep_dir}", "trainer.resume=auto"])
    )


def recorded_sweep_resume_command(sweep_dir: Path, search: bool) -> str:
    """sweep_resume_command of the sweep (or search) that Hydra recorded in `sweep_dir`/multirun.yaml."""
    return sweep_resume_command(sweep_command((sweep_dir / "multirun.yaml").read_text()), str(sweep_dir), search)


def _slurm_job_id() -> str | None:
    """The id `scontrol requeue` wants; an array task is `<array job>_<task>`."""
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")
