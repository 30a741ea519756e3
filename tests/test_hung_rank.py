"""A rank that hangs (alive, but stuck inside a step) ends a DDP job by launcher.timeout_s, naming
it, with nothing left behind."""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

import pytest

from tests.runs import FORK_RANKS
from tests.test_resume_preempt import DDP, TINY, Run

pytestmark = pytest.mark.slow

TIMEOUT_S = 10
# The peers' collective times out after TIMEOUT_S; torch then gives the ranks 5 s to leave, sends
# SIGTERM, and after 5 s more SIGKILL (a stopped or sleeping rank ignores SIGTERM); the bound leaves
# room for a loaded machine's start-up on top.
BOUND_S = TIMEOUT_S + 25


@dataclass
class Ended:
    code: int
    output: str
    seconds: float  # from the start of training to the end of the job
    leftovers: list[str]


@pytest.fixture(scope="module")
def ended(tmp_path_factory) -> dict[str, Ended]:
    """Both hangs at once, each in its own job: most of a job's time is waiting for the timeout."""
    runs = {}
    for hang in ("sleep", "sigstop"):
        fault = ["model._target_=tests.faults.HangingNet", "+model.at_step=3", f"+model.stop={hang == 'sigstop'}"]
        # Ranks forked (FORK_RANKS): the hang, the timeout and the clean-up are what is under test.
        runs[hang] = Run(
            tmp_path_factory.mktemp(hang) / "run", *DDP, *TINY, f"launcher.timeout_s={TIMEOUT_S}", *fault, FORK_RANKS
        )
    try:
        started, deadline = {}, time.monotonic() + 180
        while len(started) < len(runs):  # training starts; rank 1 hangs in its 3rd forward
            assert time.monotonic() < deadline, {hang: run.output() for hang, run in runs.items()}
            started |= {
                hang: time.monotonic()
                for hang, run in runs.items()
                if hang not in started and run.logged("from epoch 1")
            }
            time.sleep(0.02)
        return {hang: _end(run, started[hang]) for hang, run in runs.items()}
    finally:
        # Whatever went wrong above, a stopped rank must not stay behind for good.
        for pid in (pid for run in runs.values() for pid in run._processes()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _end(run: Run, started: float) -> Ended:
    code = run.finish(timeout=120)
    return Ended(code, run.output(), time.monotonic() - started, run.leftovers())


@pytest.fixture(params=["sleep", "sigstop"])
def hung(request, ended) -> Ended:
    return ended[request.param]


def test_a_hung_rank_ends_the_job_in_time_and_leaves_no_process(hung):
    assert hung.code == 1, hung.output
    assert re.search(r"^error: rank \d failed: .*timed out", hung.output, re.MULTILINE | re.IGNORECASE), hung.output
    assert hung.seconds < BOUND_S, f"{hung.seconds:.0f} s from the start of training to the end of the job"
    assert hung.leftovers == []


def test_the_error_names_the_hung_rank(hung):
    assert "error: rank 1 failed: hung" in hung.output, hung.output
