"""Start one worker per device: in this process, or with torch.multiprocessing.spawn."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from distributed.context import DistContext, make_context
from errors import ConfigError


@dataclass(frozen=True)
class LaunchPlan:
    accelerator: str  # "gpu" | "cpu", resolved from "auto"
    devices: int  # processes to start on this node (dp: 1, however many GPUs it drives)
    process_group: bool  # DDP needs one, even at world size 1
    master_addr: str
    master_port: int | None  # None: pick a free one


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
    if strategy.name == "dp" and accelerator == "cpu" and devices > 1:
        raise ConfigError(
            f"strategy=dp with trainer.devices={devices} splits each batch over {devices} GPUs but runs on CPU; "
            f"use trainer.devices=1, or strategy=ddp to rehearse {devices} devices on CPU"
        )
    return LaunchPlan(
        accelerator=accelerator,
        devices=1 if strategy.name == "dp" else devices,  # dp: one process drives every GPU
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
        mp.spawn(_run_rank, args=(plan, worker, args), nprocs=plan.devices, join=True)


def _run_rank(local_rank: int, plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    ctx: DistContext = make_context(local_rank, local_rank, plan.devices, plan.devices, plan.accelerator, plan.process_group)
    worker(ctx, *args)


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]
