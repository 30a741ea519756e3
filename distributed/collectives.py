"""Every collective the rest of the code needs, as no-ops without a process group, so callers
never branch on it and nothing outside distributed/ imports torch.distributed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from distributed.context import DistContext

T = TypeVar("T")


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum `tensor` over all ranks in place and return it."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_from_main(tensors: list[torch.Tensor], ctx: DistContext) -> None:
    """Overwrite every rank's `tensors` in place with rank 0's."""
    if ctx.distributed:
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def all_gather_object(obj: T, ctx: DistContext) -> list[T]:
    """Every rank's `obj`, indexed by rank (pickled: for small things such as RNG states)."""
    if not ctx.distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def on_main_first(
    fn: Callable[[], T],
    ctx: DistContext,
    timeout: timedelta,
    needed: Callable[[], bool] = lambda: True,
) -> T | None:
    """Rank 0 runs `fn` while the others wait up to `timeout` (not launcher.timeout_s: a download
    may take minutes), then every rank returns what it returned or raises what it raised.

    `needed()`, asked on rank 0: whether `fn` has anything to do. When not, no rank runs it and
    all return None, told over the default group: the waiting takes a gloo group of its own, whose
    connections between every pair of ranks are, under NCCL, gloo's only use, and so where a wrong
    GLOO_SOCKET_IFNAME would first fail."""
    if not ctx.distributed:
        return fn()
    todo = torch.zeros(1, device=ctx.device)
    if ctx.is_main:
        try:
            todo.fill_(needed())
        except Exception:  # fn meets it again, and every rank learns it from there
            todo.fill_(1)
    broadcast_from_main([todo], ctx)
    if not todo.item():
        return None
    group = dist.new_group(backend="gloo", timeout=timeout)
    outcome: list[Any] = [None]
    if ctx.is_main:
        try:
            outcome[0] = (fn(), None)
        except Exception as e:  # passed on whole: every rank raises the same one-line error
            outcome[0] = (None, e)
    dist.broadcast_object_list(outcome, src=0, group=group)
    dist.destroy_process_group(group)
    value, error = outcome[0]
    if error is not None:
        raise error
    return value
