"""DistContext: who this process is. Built once by the launcher, passed down, never re-read."""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from config import launcher_env
from distributed import environment
from errors import ConfigError, first_line

# Every rank imports it at its first optimizer step (torch/optim/optimizer.py: step and zero_grad
# import it on their first call, at a cost of most of a second; BENCHMARKS.md: Start-up). Imported up front, a rank can freeze it and a
# forkserver share it.
OPTIMIZER_IMPORT = "torch._dynamo"


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int  # processes on this node
    device: torch.device
    backend: str | None  # None: no process group (a single in-process run)
    devices: tuple[torch.device, ...] = ()  # what this process computes on: dp's GPUs, else (device,)

    def __post_init__(self) -> None:
        if not self.devices:
            object.__setattr__(self, "devices", (self.device,))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def make_context(
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    accelerator: str,
    use_process_group: bool,
    devices_per_process: int = 1,
    host_collectives: bool = False,
    backend: str | None = None,
) -> DistContext:
    """One process per device: CUDA rank r drives GPU `local_rank`; CPU ranks share the host.

    Clusters that bind each task to its own GPU (srun --gpus-per-task=1, --gpu-bind) show every
    rank one device, cuda:0: `local_rank % visible` finds it (launch.plan_launch refuses other splits).
    """
    if accelerator != "gpu":
        device = torch.device("cpu")
        return DistContext(
            rank, local_rank, world_size, local_world_size, device, "gloo" if use_process_group else None
        )
    device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    devices = tuple(torch.device("cuda", i) for i in range(devices_per_process)) if devices_per_process > 1 else ()
    if backend != "gloo":  # gloo takes CUDA and host tensors alike
        # NCCL takes CUDA tensors only; torch's "device:backend" list adds gloo for host tensors.
        backend = "cuda:nccl,cpu:gloo" if host_collectives else "nccl"
    return DistContext(
        rank, local_rank, world_size, local_world_size, device, backend if use_process_group else None, devices
    )


def cpus_per_rank(local_world_size: int, env: Mapping[str, str] = os.environ) -> int:
    """The CPUs one rank may use, never more than this process may run on (the CPUs srun, taskset or
    a cgroup bound it to).

    Under srun each rank is a task of its own: srun's --cpus-per-task of them, or without it its
    share of the job's CPUs on this node. Since SLURM 22.05 srun does not take sbatch's
    --cpus-per-task, yet its tasks inherit SLURM_CPUS_PER_TASK: a task bound to one CPU may read 8
    there. Otherwise (spawn, torchrun, also `srun torchrun`) the node's ranks share what the process
    that started them may use, an equal part each."""
    mine = len(os.sched_getaffinity(0))
    asked = int(env.get("SLURM_CPUS_PER_TASK") or 0)
    if launcher_env.detect(env) == "slurm":
        return max(1, min(mine, asked or int(env.get("SLURM_CPUS_ON_NODE") or mine) // local_world_size))
    return max(1, min(mine, asked or mine) // local_world_size)


def placement(workers: int) -> str:
    """This rank's CPUs, threads and loader workers, for the log's line of where each rank runs."""
    return (
        f"CPUs {_ranges(sorted(os.sched_getaffinity(0)))}, {torch.get_num_threads()} threads, {workers} loader workers"
    )


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", as taskset and SLURM write CPU lists."""
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def init(ctx: DistContext, timeout_s: float) -> None:
    """Join the process group. MASTER_ADDR/MASTER_PORT come from the launcher (env://)."""
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if "OMP_NUM_THREADS" not in os.environ:
        # Each rank would start one thread per core: a node's N ranks would fight over every core,
        # CPU ranks with their compute, GPU ranks with their host work (batches cut and augmented in
        # memory, cpu_offload's optimizer step). torchrun sets OMP_NUM_THREADS=1 for the same reason.
        torch.set_num_threads(cpus_per_rank(ctx.local_world_size))
    if ctx.distributed:
        one_node = ctx.world_size == ctx.local_world_size
        environment.check_interfaces("gloo" in ctx.backend, "nccl" in ctx.backend, os.environ, one_node)
        try:
            dist.init_process_group(
                ctx.backend,
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=timedelta(seconds=timeout_s),
                # NCCL wants to know its device up front, or it guesses from the rank.
                device_id=ctx.device if ctx.device.type == "cuda" else None,
            )
        except RuntimeError as e:  # torch.distributed's DistError, gloo's and NCCL's own
            raise _unreachable(ctx, e) from None
        # shutdown() collects every object not frozen. What exists now lives as long as the process:
        # the imports, the optimizer's included. Frozen, they are left out of that walk, on every rank.
        import_optimizer_step()
        gc.freeze()


def import_optimizer_step() -> None:
    """Import what an optimizer's first step imports (OPTIMIZER_IMPORT) as train.py imports its own:
    with the collector paused, which would otherwise walk the young objects over and over as the
    import makes them, then frozen, out of every later full collection."""
    if OPTIMIZER_IMPORT in sys.modules:
        return
    collecting = gc.isenabled()
    gc.disable()
    try:
        importlib.import_module(OPTIMIZER_IMPORT)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def _unreachable(ctx: DistContext, error: RuntimeError) -> Exception:
    """A rank that could not connect to its peers, in one line that names the variable to set
    (environment.check_interfaces refuses loopback before launch; another wrong interface shows
    here); any other error as it is."""
    text = str(error)
    var = "GLOO_SOCKET_IFNAME" if "connectFullMesh" in text else "NCCL_SOCKET_IFNAME" if "NCCL" in text else None
    if var is None:
        return error
    chosen = f"{var}={os.environ[var]}" if os.environ.get(var) else f"{var} unset"
    return ConfigError(
        f"rank {ctx.rank} on {socket.gethostname()} could not connect to the other ranks with {chosen} "
        f"({first_line(error)}); set {var} to the interface the nodes reach each other on (`ip -br addr` "
        "lists them; NCCL_DEBUG=INFO logs NCCL's choice; docs/clusters.md)"
    )


def shutdown(ctx: DistContext, clean: bool) -> None:
    """Leave the process group; after an error skip the barrier, peers may never reach it.

    gloo processes may abort at interpreter exit if a DDP model is still alive when the group is
    destroyed; collecting it first prevents that (BENCHMARKS.md: Test suite).
    """
    if not (ctx.distributed and dist.is_initialized()):
        return
    gc.collect()
    if clean:
        dist.barrier()
    dist.destroy_process_group()


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Dropout/augmentation randomness from (seed, epoch, rank): a resumed run draws the same."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
