"""Wrap a plain nn.Module for the chosen strategy, and unwrap it for saving and evaluation."""
from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distributed.context import DistContext


def wrap(model: nn.Module, strategy: Any, ctx: DistContext) -> nn.Module:
    """`model` must already be on ctx.device; DDP broadcasts rank 0's weights on construction."""
    if strategy.name == "single":
        return model
    if strategy.name == "ddp":
        if strategy.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            # Gradients live in the all-reduce buckets: saves one copy of the gradients.
            gradient_as_bucket_view=strategy.gradient_as_bucket_view,
            find_unused_parameters=strategy.find_unused_parameters,
            static_graph=strategy.static_graph,
            bucket_cap_mb=strategy.bucket_cap_mb,
        )
    raise ValueError(f"unknown strategy {strategy.name!r}")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP/DP, so state_dict keys carry no `module.` prefix."""
    return model.module if isinstance(model, (DistributedDataParallel, nn.DataParallel)) else model
