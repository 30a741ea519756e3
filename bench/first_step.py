"""The callback bench.startup adds to the runs it clocks (bench.common.FIRST_STEP_CALLBACK): rank 0
prints FIRST_STEP once its first optimizer step is done. The loop itself carries no hook."""

from __future__ import annotations

from bench.common import FIRST_STEP
from training.callbacks import Callback, RunInfo


class FirstStep(Callback):
    def __init__(self) -> None:
        self.speaks, self.done = True, False

    def setup(self, run: RunInfo) -> None:
        self.speaks = run.ctx.is_main

    def on_step_end(self, step: int) -> None:
        if self.speaks and not self.done:
            print(FIRST_STEP, flush=True)
        self.done = True
