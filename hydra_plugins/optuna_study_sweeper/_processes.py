"""hydra.sweeper.n_jobs trials at once on this machine: each trial's job in a process of its own,
on a share of the machine's devices (Hydra's basic launcher would run them one after another).

The CPUs this process may run on, and the GPUs it sees, are split into n_jobs shares, one per trial
in flight: a trial's process is bound to its CPUs (its ranks take as many threads) and sees its
GPUs only (CUDA_VISIBLE_DEVICES). A process is forked from the sweeper, which has imported what the
job needs and never touched CUDA: no interpreter start, no pickling of Hydra's launcher.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hydra.core.utils import JobReturn

from training import preemption

log = logging.getLogger(__name__)
T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class Share:
    """What one trial's process may use: its CPUs, and its GPUs (None: the machine has none)."""

    cpus: tuple[int, ...]
    gpus: tuple[str, ...] | None

    def __str__(self) -> str:
        return f"CPUs {','.join(map(str, self.cpus))}" + (f", GPUs {','.join(self.gpus)}" if self.gpus else "")


def split(items: Sequence[T], n: int) -> list[tuple[T, ...]]:
    """`items` in n contiguous shares, the first ones one larger where they do not divide evenly;
    fewer items than shares: one each, in turn (two trials share a CPU or a GPU)."""
    if not items:
        return [()] * n
    if len(items) < n:
        return [(items[i % len(items)],) for i in range(n)]
    size, extra = divmod(len(items), n)
    starts = [i * size + min(i, extra) for i in range(n + 1)]
    return [tuple(items[starts[i] : starts[i + 1]]) for i in range(n)]


def visible_gpus(env: Mapping[str, str], count: int) -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES names them (indices, or UUIDs as SLURM
    may give them), else the `count` the driver reports."""
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    return [str(i) for i in range(count)]


def shares(n_jobs: int, cpus: Sequence[int], gpus: Sequence[str]) -> list[Share]:
    """One Share per trial in flight. Every trial gets as many GPUs as every other (a search's trials
    ask for the same devices): those past a multiple of n_jobs are left out."""
    gpu_shares = split(list(gpus)[: len(gpus) - len(gpus) % n_jobs] if len(gpus) >= n_jobs else gpus, n_jobs)
    return [Share(c, g if gpus else None) for c, g in zip(split(sorted(cpus), n_jobs), gpu_shares)]


def machine_shares(n_jobs: int) -> list[Share]:
    import torch  # already imported by train.py; counts GPUs without a CUDA context

    gpus = visible_gpus(os.environ, torch.cuda.device_count())
    made = shares(n_jobs, sorted(os.sched_getaffinity(0)), gpus)
    log.info("%d trials at once, each in a process of its own: %s", n_jobs, " | ".join(map(str, made)))
    if gpus and len(gpus) % n_jobs and len(gpus) > n_jobs:
        log.warning(
            "%d GPUs for %d trials at once: GPUs %s stay idle",
            len(gpus),
            n_jobs,
            ",".join(gpus[-(len(gpus) % n_jobs) :]),
        )
    elif gpus and len(gpus) < n_jobs:
        log.warning("%d GPUs for %d trials at once: trials share GPUs", len(gpus), n_jobs)
    return made


class TrialProcesses:
    """A Launch (see _study.Launch) that runs each job in a child process on a free Share, and
    returns its JobReturn; what the job raised (Ctrl-C, a preemption's exit) is raised here. A child
    that dies without an answer (killed, out of memory) is that trial's failure alone."""

    def __init__(self, launch: Any, made: Sequence[Share]) -> None:
        self._launch = launch
        self._free: queue.SimpleQueue[Share] = queue.SimpleQueue()
        for share in made:
            self._free.put(share)

    def __call__(self, batch: list[list[str]], first: int) -> Sequence[JobReturn]:
        share = self._free.get()
        try:
            return self._in_child(batch, first, share)
        finally:
            self._free.put(share)

    def _in_child(self, batch: list[list[str]], first: int, share: Share) -> Sequence[JobReturn]:
        context = multiprocessing.get_context("fork")
        theirs, ours = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(self._launch, batch, first, share, ours), name=f"trial-{first}")
        child.start()
        ours.close()
        try:
            kind, answer = theirs.recv()
        except EOFError:
            child.join()
            code = child.exitcode
            how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited {code}"
            raise RuntimeError(f"the trial's process (pid {child.pid}) {how} before it answered") from None
        finally:
            theirs.close()
        child.join()
        if kind == "raised":
            raise answer
        return answer


def wait_for_trials(signals: list[signal.Signals]) -> bool:
    """After Ctrl-C or a preemption signal, which reached the trials' processes too (the terminal's
    process group, SLURM's job step): wait until each has stopped as a run does, saving last.pt.
    Those signals again are noted, not raised, so that none is left behind; a second Ctrl-C stops
    the trials at once. Whether they had the time to save: no second Ctrl-C came."""
    again: list[int] = []
    for sig in signals:
        signal.signal(sig, lambda signum, frame: again.append(signum))
    for child in multiprocessing.active_children():
        child.join()
    return signal.SIGINT not in again


def _child(launch: Any, batch: list[list[str]], first: int, share: Share, answer: Any) -> None:
    """In the forked process: bound to its share, the job run as Hydra's launcher runs it."""
    if sys.platform.startswith("linux"):
        # The sweeper gone (killed), its trials get SIGTERM, a preemption signal: they save and end.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    preemption.explained_by_search = True
    os.sched_setaffinity(0, share.cpus)
    if share.gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(share.gpus)
    try:
        outcome: tuple[str, Any] = ("returned", list(launch(batch, first)))
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: the sweeper decides
        outcome = ("raised", e)
    try:
        answer.send(outcome)
    except Exception as e:  # an unpicklable return value or exception
        answer.send(("raised", RuntimeError(f"the trial's outcome could not be sent back: {type(e).__name__}: {e}")))
