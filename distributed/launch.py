"""Start one worker per device: in this process, or with torch.multiprocessing.spawn."""
from __future__ import annotations

import errno
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from distributed.context import DistContext, make_context
from errors import ConfigError, Preempted, RankFailed

# After one rank fails, the others get this long to leave on their own, then SIGTERM, then SIGKILL.
_GRACE_S = 5.0


@dataclass(frozen=True)
class LaunchPlan:
    accelerator: str  # "gpu" | "cpu", resolved from "auto"
    devices: int  # processes to start on this node
    process_group: bool  # DDP needs one, even at world size 1
    master_addr: str
    master_port: int | None  # None: pick a free one
    forward_signals: tuple[signal.Signals, ...] = ()  # passed on to spawned ranks (preemption)


def plan_launch(trainer: Any, strategy: Any, launcher: Any) -> LaunchPlan:
    """Resolve accelerator/devices/gpus against this machine; raise ConfigError on a mismatch."""
    accelerator, devices = trainer.accelerator, int(trainer.devices)
    if accelerator not in ("auto", "gpu", "cpu"):
        raise ConfigError(f"trainer.accelerator={accelerator}: choose auto, gpu or cpu")
    if trainer.gpus is not None:
        accelerator, devices = "gpu", int(trainer.gpus)
    visible = torch.cuda.device_count()
    if accelerator == "auto":
        accelerator = "gpu" if visible else "cpu"
    if devices < 1:
        raise ConfigError(f"trainer.devices={devices}: need at least 1 device")
    if accelerator == "gpu" and devices > visible:
        raise ConfigError(
            f"trainer.devices={devices} asks for {devices} GPU(s) but {visible} are visible; "
            f"rehearse on CPU with trainer.accelerator=cpu trainer.devices={devices} strategy=ddp"
        )
    if strategy.name == "single" and devices > 1:
        raise ConfigError(
            f"strategy=single trains on one device but trainer.devices={devices}; "
            "use strategy=ddp for several devices"
        )
    if strategy.name == "ddp" and launcher.master_port is not None:
        _check_port_free(launcher.master_addr, int(launcher.master_port))
    return LaunchPlan(
        accelerator=accelerator,
        devices=devices,
        process_group=strategy.name == "ddp",
        master_addr=launcher.master_addr,
        master_port=launcher.master_port,
    )


def launch(plan: LaunchPlan, worker: Callable[..., Any], *args: Any) -> None:
    """Run `worker(ctx, *args)` once per device; returns when every rank has finished."""
    if plan.process_group:
        # A fixed port (the seeds' 12355) collides with any other job on the node.
        os.environ["MASTER_ADDR"] = plan.master_addr
        os.environ["MASTER_PORT"] = str(plan.master_port or _free_port(plan.master_addr))
    if plan.devices == 1:
        _run_rank(0, plan, worker, args)
    else:
        _spawn(plan, worker, args)


def _spawn(plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    """mp.spawn that passes preemption signals on and reports a failed rank in one line.

    A rank that raises or dies makes torch stop the others (after _GRACE_S); a survivor stuck
    in a collective with the dead rank fails by itself within launcher.timeout_s at the latest.
    """
    ranks = mp.start_processes(_spawned_rank, args=(plan, worker, args), nprocs=plan.devices, join=False)

    def forward(signum: int, frame: Any) -> None:
        for process in ranks.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in plan.forward_signals}
    try:
        while not ranks.join(grace_period=_GRACE_S):
            pass
    except ProcessExitedException as e:
        if e.exit_code > 128 and e.exit_code - 128 in plan.forward_signals:
            raise Preempted(e.exit_code - 128) from None
        reason = f"killed by {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
        raise RankFailed(e.error_index, reason) from None
    except ProcessRaisedException:
        rank, reason = _first_error(ranks.error_files)
        raise RankFailed(rank, reason) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _first_error(error_files: list[str]) -> tuple[int, str]:
    """The rank whose traceback was written first: its peers' errors are only the echo of it."""
    written = [(os.stat(path).st_mtime_ns, rank, path) for rank, path in enumerate(error_files) if os.path.exists(path)]
    _, rank, path = min(written)
    with open(path, "rb") as f:
        lines = [line for line in pickle.load(f).strip().splitlines() if line.strip()]
    return rank, lines[-1].strip()[:500]


def _spawned_rank(local_rank: int, plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    """A spawned rank reports preemption through its exit code, 128 + the signal, as a shell does."""
    try:
        _run_rank(local_rank, plan, worker, args)
    except Preempted as e:
        sys.exit(e.exit_code)


def _run_rank(local_rank: int, plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    ctx: DistContext = make_context(local_rank, local_rank, plan.devices, plan.devices, plan.accelerator, plan.process_group)
    worker(ctx, *args)


def _check_port_free(addr: str, port: int) -> None:
    """Rank 0 listens on launcher.master_port; a port in use would fail only after the timeout."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the TCPStore binds
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise ConfigError(
                    f"launcher.master_addr={addr}: cannot listen there ({e.strerror}); use 127.0.0.1"
                ) from None
            raise ConfigError(
                f"launcher.master_port={port} is already in use on {addr}; pick another port "
                "or leave launcher.master_port=null for a free one"
            ) from None


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]
