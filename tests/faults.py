"""Faults injected through the model config, for tests: `model._target_=tests.faults.FailingNet`."""

from __future__ import annotations

import atexit
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
import torch.distributed as dist
from hydra.experimental.callback import Callback as HydraCallback

from models.mnist_net import MnistNet
from models.simple_cnn import SimpleCNN
from training.callbacks import Callback, RunInfo


class FailingNet(MnistNet):
    """MnistNet whose rank `fail_rank` raises (or, with `kill`, dies by SIGKILL) at forward `at_step`;
    with `first_attempt_only`, not in a worker group that torchrun restarted."""

    def __init__(
        self,
        *args,
        fail_rank: int = 1,
        at_step: int = 3,
        kill: bool = False,
        first_attempt_only: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fail_rank, self.at_step, self.kill = fail_rank, at_step, kill
        self.fails = not (first_attempt_only and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == self.fail_rank and self.calls == self.at_step and self.fails:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure on rank {rank}")
        return super().forward(x)


class SlowNet(MnistNet):
    """MnistNet that sleeps `delay_s` in every forward: the same math, slow enough for a signal to
    land mid-training however long the job takes to start. With `hold`, its forwards from the
    `hold_from`-th on wait while that file exists: a pause past a point, released by deleting it."""

    def __init__(self, *args, delay_s: float = 0.2, hold: str | None = None, hold_from: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s, self.hold, self.hold_from = delay_s, hold, hold_from
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.calls >= self.hold_from:
            _held(self.hold)
        return super().forward(x)


class SlowCNN(SimpleCNN):
    """SimpleCNN (no dropout, no BatchNorm: its steps are the same math at any micro-batch size)
    that sleeps `delay_s` in every forward, and waits in it while the file `hold` exists: a test's
    pause, released by deleting the file."""

    def __init__(self, *args, delay_s: float = 0.2, hold: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s, self.hold = delay_s, hold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        _held(self.hold)
        return super().forward(x)


def _held(hold: str | None) -> None:
    """Wait while the file `hold` exists: a test's pause, released by deleting the file. A forward
    that gets there creates `<hold>.reached`, for the test to know."""
    if hold is not None and os.path.exists(hold):
        Path(f"{hold}.reached").touch()
    while hold is not None and os.path.exists(hold):
        time.sleep(0.05)


class HangingNet(MnistNet):
    """MnistNet whose rank `hang_rank` stays alive but never returns from forward `at_step`: it
    sleeps forever or, with `stop`, SIGSTOPs itself (neither answers SIGTERM); with `hung_file`, it
    creates that file first."""

    def __init__(
        self, *args, hang_rank: int = 1, at_step: int = 3, stop: bool = False, hung_file: str | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.hang_rank, self.at_step, self.stop, self.hung_file = hang_rank, at_step, stop, hung_file
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == self.hang_rank and self.calls == self.at_step:
            if self.hung_file:
                Path(self.hung_file).touch()
            if self.stop:
                os.kill(os.getpid(), signal.SIGSTOP)
            while True:
                time.sleep(3600)
        return super().forward(x)


class NanNet(MnistNet):
    """MnistNet whose output turns NaN from training forward `at_step` on, `times` forwards long;
    with `on_rank`, on that rank of a process group only."""

    def __init__(self, *args, at_step: int = 3, times: int = 10**9, on_rank: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at_step, self.times, self.on_rank = at_step, times, on_rank
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if not self.training:
            return out
        self.calls += 1
        if self.on_rank is not None and not (dist.is_initialized() and dist.get_rank() == self.on_rank):
            return out
        return out * float("nan") if self.at_step <= self.calls < self.at_step + self.times else out


class SignalingNet(MnistNet):
    """MnistNet that sends its own process `signum` in training forward `at_step`, as a scheduler would,
    or with `at_step=0` as it is built (in the pre-flight's check, before any rank runs); with `once`
    (a file), only if that file does not exist yet, and it then does: the run continued is not stopped
    again."""

    def __init__(
        self, *args, at_step: int = 3, signum: int = signal.SIGTERM, once: str | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.at_step, self.signum, self.once = at_step, signum, once
        self.calls = 0
        if at_step == 0:
            os.kill(os.getpid(), signum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at_step and not (self.once and os.path.exists(self.once)):
                if self.once:
                    Path(self.once).touch()
                os.kill(os.getpid(), self.signum)
        return super().forward(x)


class SignalingSampler(optuna.samplers.TPESampler):
    """TPESampler that sends the search's whole process group `signum` as the study asks for trial
    `at_trial`, as a terminal's Ctrl-C or SLURM's signal to a job step may come, while no trial runs
    (`hydra.sweeper.sampler._target_=tests.faults.SignalingSampler`)."""

    def __init__(self, *args, at_trial: int = 1, signum: int = signal.SIGINT, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at_trial, self.signum = at_trial, signum

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        super().before_trial(study, trial)
        if trial.number == self.at_trial:
            os.killpg(os.getpgrp(), self.signum)


class CtrlCInHydra(HydraCallback):
    """Ctrl-C in Hydra's own code, which no run's handler covers: as a job ends (a -m sweep's first,
    before the next starts); with `at=on_run_start`, as a run starts, before main()
    (`+hydra.callbacks.ctrl_c._target_=tests.faults.CtrlCInHydra`)."""

    def __init__(self, at: str = "on_job_end") -> None:
        self.at = at

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        if self.at == "on_run_start":
            os.kill(os.getpid(), signal.SIGINT)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if self.at == "on_job_end":
            os.kill(os.getpid(), signal.SIGINT)


class KillAt(Callback):
    """SIGKILLs rank `rank` at validation's end of epoch `epoch` (from 0): after the epoch before
    it was saved, before this one is (`+callbacks.kill._target_=tests.faults.KillAt`)."""

    def __init__(self, epoch: int = 2, rank: int = 0) -> None:
        self.epoch, self.rank, self.here = epoch, rank, 0

    def setup(self, run: RunInfo) -> None:
        self.here = run.ctx.rank

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        if epoch == self.epoch and self.here == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAsACheckReturns(Callback):
    """Sends every rank SIGTERM as the `check`-th preemption check's all-reduce returns: where a
    signal to all of a job's ranks at once (SLURM's, or the kernel's when their launcher dies) lands
    when they wait there together. The handler runs right after the call, before the check reads
    what was reduced (`+callbacks.late._target_=tests.faults.SignalAsACheckReturns`)."""

    def __init__(self, check: int = 3) -> None:
        self.check, self.checks = check, 0

    def setup(self, run: RunInfo) -> None:
        from training import preemption

        reduce = preemption.all_reduce_max

        def reduced_then_signalled(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
            reduced = reduce(tensor, ctx)
            self.checks += 1
            if self.checks == self.check:
                os.kill(os.getpid(), signal.SIGTERM)
            return reduced

        preemption.all_reduce_max = reduced_then_signalled


class SlowExit(Callback):
    """Keeps rank `rank` `delay_s` in its exit handlers, as a logger that uploads its files as the
    process ends does: longer than the launcher's grace period, so that a peer's failure ends it by
    torch's SIGTERM (`+callbacks.slow_exit._target_=tests.faults.SlowExit`)."""

    def __init__(self, rank: int = 1, delay_s: float = 60.0) -> None:
        self.rank, self.delay_s = rank, delay_s

    def setup(self, run: RunInfo) -> None:
        if run.ctx.rank == self.rank:
            atexit.register(time.sleep, self.delay_s)


class Together(Callback):
    """Holds each run at its setup until `count` runs have reached theirs (a file each in `meet_dir`),
    for at most `timeout_s`: runs that train at once all go on; one that waits alone for that long
    raises (`+callbacks.together._target_=tests.faults.Together +callbacks.together.meet_dir=DIR`)."""

    def __init__(self, meet_dir: str, count: int = 2, timeout_s: float = 60.0) -> None:
        self.meet_dir, self.count, self.timeout_s = Path(meet_dir), count, timeout_s

    def setup(self, run: RunInfo) -> None:
        (self.meet_dir / str(os.getpid())).touch()
        deadline = time.monotonic() + self.timeout_s
        while len(list(self.meet_dir.iterdir())) < self.count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {self.count} runs at once in {self.timeout_s:.0f} s")
            time.sleep(0.05)


class Held(Callback):
    """Holds the `from_run`-th run (counted from 1) of those that share the directory $HELD_DIR, and
    every later one, at its first step's end while the file `$HELD_DIR/hold` exists: a test's kill
    then lands inside that run, never in an earlier one and never after it finished. The runs count
    themselves by a file each in `$HELD_DIR/arrived` (`+callbacks.held._target_=tests.faults.Held`).
    The directory comes from the environment, not the config, so that it stays out of a sweep's job
    dir names."""

    def __init__(self, from_run: int = 1) -> None:
        self.dir, self.from_run, self.held = Path(os.environ["HELD_DIR"]), from_run, False

    def setup(self, run: RunInfo) -> None:
        arrived = self.dir / "arrived"
        arrived.mkdir(exist_ok=True)
        os.close(tempfile.mkstemp(dir=arrived)[0])  # a name of its own: a search's trials share one process
        self.held = len(list(arrived.iterdir())) >= self.from_run

    def on_step_end(self, step: int) -> None:
        while self.held and (self.dir / "hold").exists():
            time.sleep(0.05)


class Misnamed(Callback):
    """Names val/mine in its figures but adds it as val/mien, as a typo in a callback of one's own
    would (`+callbacks.misnamed._target_=tests.faults.Misnamed`)."""

    figures = ("val/mine",)

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        figures["val/mien"] = 0.5


class NumpyState(Callback):
    """Keeps its best as np.mean returns it, a numpy number, in its state_dict: what a checkpoint,
    read with weights_only=True, cannot hold (`+callbacks.numpy._target_=tests.faults.NumpyState`)."""

    def __init__(self) -> None:
        self.best = None

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        self.best = np.mean([figures["val/acc"]])

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
