"""Where a training step's time goes: torch.profiler over N steps after a warm-up, for
trainer.profile=N and bench.gpu_profile alike.

The first WAIT steps run unprofiled (allocator growth, cuDNN's algorithm search, torch.compile's
first graphs), the next WARMUP are traced and thrown away (the profiler's own start-up), then
`steps` are recorded: CPU operators, and on CUDA the kernels and the memory each operator allocates.
The trace opens in Perfetto (ui.perfetto.dev) and chrome://tracing; the table of the top operators,
by self time, goes to the log.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from training.callbacks import Callback

log = logging.getLogger("train")

WAIT, WARMUP = 3, 2  # steps before the recorded ones: skipped, then traced and dropped
TOP_OPERATORS = 15  # the table's rows


class StepProfiler:
    """A context whose step() the loop calls after each training step. Once `steps` steps after
    `wait` + `warmup` are recorded it writes `trace` (if given) and sets `table`; the profiler then
    records nothing more, and the steps after it run as fast as unprofiled ones."""

    def __init__(
        self, steps: int, device: torch.device, trace: Path | None = None, wait: int = WAIT, warmup: int = WARMUP
    ) -> None:
        if steps < 1:
            raise ValueError(f"profile {steps} steps: give at least 1")
        self.device, self.trace_path, self.steps = device, trace, steps
        self.cuda = device.type == "cuda"
        if not self.cuda:  # kineto's ERROR line for the GPU driver a CPU-only machine lacks
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        self.total = wait + warmup + steps  # the step() that ends the recorded ones
        self.wait = wait
        self.stepped = 0
        self._stderr: HeldStderr | None = None  # while the profiler runs
        self.table: str | None = None
        self.profiler = profile(
            activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.cuda else [])],
            schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=self._ready,
            profile_memory=True,
        )

    def __enter__(self) -> StepProfiler:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.profiler.__exit__(*exc)
        finally:
            self._release_stderr()

    def step(self) -> None:
        self.stepped += 1
        if self.stepped == self.wait:  # the next profiler.step() starts the trace
            self._stderr = HeldStderr()
        if self.cuda and self.stepped == self.total:
            torch.cuda.synchronize(self.device)  # the last step's kernels finish inside the recorded window
        self.profiler.step()
        if self.stepped == self.total:
            self._release_stderr()

    def _release_stderr(self) -> None:
        held, self._stderr = self._stderr, None
        if held is not None:
            held.release()

    def _ready(self, prof: profile) -> None:
        if self.trace_path is not None:
            self.trace_path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(self.trace_path))
        self.table = top_operators(prof, self.cuda)
        where = f"; trace: {self.trace_path} (ui.perfetto.dev or chrome://tracing)" if self.trace_path else ""
        log.info(
            "profiled %d steps, top operators by self %s time%s\n%s",
            self.steps,
            "device" if self.cuda else "CPU",
            where,
            self.table,
        )


# What kineto and c10 print to stderr while a trace is taken, nothing for the user to act on: kineto's
# lines below its warnings (profiler_start / profiler_stop are its USDT level, which KINETO_LOG_LEVEL
# does not silence), and c10's notes from the allocator and profiler, such as "Memory block of
# unknown size was allocated before the profiling started".
PROFILER_NOISE = re.compile(r"^((USDT|STAGE|INFO|VERBOSE):\d{4}-|\[[WI]\d{4} .*(Allocator|Profiler|profiler|kineto))")


class HeldStderr:
    """The process's stderr (file descriptor 2, where C++ libraries write) held in a file while the
    profiler runs; released, its PROFILER_NOISE lines go to the log file (train.log) alone, and the
    rest to stderr as it was: a late warning, a progress bar's updates."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self._held = tempfile.TemporaryFile()
        self._stderr = os.dup(2)
        os.dup2(self._held.fileno(), 2)

    def release(self) -> None:
        sys.stderr.flush()
        os.dup2(self._stderr, 2)
        os.close(self._stderr)
        self._held.seek(0)
        text = self._held.read().decode(errors="replace")
        self._held.close()
        rest = []
        for line in text.splitlines(keepends=True):
            if PROFILER_NOISE.match(line):
                to_log_files(line.rstrip("\n"))
            else:
                rest.append(line)
        if rest:
            sys.stderr.write("".join(rest))
            sys.stderr.flush()


def to_log_files(message: str) -> None:
    """One line in the log file(s) of this process's logging (train.log), not on the console."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (message,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


class ProfiledSteps(Callback):
    """trainer.profile=N on rank 0: a StepProfiler whose steps are the Trainer's optimizer steps,
    started with the callback (just before training) and stopped once it has recorded its steps.
    Without trainer.profile there is no such callback, and nothing runs per step."""

    def __init__(self, steps: int, device: torch.device, trace: Path) -> None:
        self.profiler: StepProfiler | None = StepProfiler(steps, device, trace).__enter__()

    def on_step_end(self, step: int) -> None:
        if self.profiler is None:
            return
        self.profiler.step()
        if self.profiler.table is not None:  # recorded, written and logged
            self.close()

    def on_train_end(self, metrics: dict) -> None:
        profiler = self.profiler
        if profiler is not None:  # the run was shorter than the pre-flight could tell (a resume, a full epoch)
            warmup = profiler.total - profiler.steps
            log.warning(
                "trainer.profile=%d: training ended after %d optimizer steps, %d of them recorded after the "
                "profiler's %d of warm-up; train longer, or profile fewer steps",
                profiler.steps,
                profiler.stepped,
                max(0, profiler.stepped - warmup),
                warmup,
            )
        self.close()

    def close(self) -> None:
        """Stop profiling (idempotent): once recorded, at the end of training, or when it failed."""
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.__exit__(None, None, None)


def top_operators(prof: profile, cuda: bool, rows: int = TOP_OPERATORS) -> str:
    """torch.profiler's table of the operators with the most self time: on CUDA by their kernels'
    time, with the memory they allocate."""
    return prof.key_averages().table(
        sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=rows
    )


def profile_steps(
    step: Callable[[], None],
    steps: int,
    device: torch.device,
    trace: Path | None = None,
    wait: int = WAIT,
    warmup: int = WARMUP,
) -> StepProfiler:
    """Run `step` wait + warmup + steps times under a StepProfiler; the profiler, done."""
    with StepProfiler(steps, device, trace, wait, warmup) as profiler:
        for _ in range(profiler.total):
            step()
            profiler.step()
    return profiler
