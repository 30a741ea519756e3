"""Wrap a plain nn.Module for the chosen strategy, and unwrap it for saving and evaluation."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distributed.context import DistContext
from distributed.sync_batchnorm import convert_sync_batchnorm


def wrap(model: nn.Module, strategy: Any, ctx: DistContext, devices: int = 1, compile: bool = False) -> nn.Module:
    """`model` must already be on ctx.device; DDP broadcasts rank 0's weights on construction.

    `devices` is how many GPUs this one process drives: more than 1 only under dp, which runs
    in one process and splits each global batch over cuda:0..devices-1. `compile` wraps the
    module in torch.compile after BatchNorm conversion (which swaps modules) and before DP/DDP,
    as nanoGPT and timm do.
    """
    if strategy.name == "ddp" and strategy.sync_batchnorm:
        model = convert_sync_batchnorm(model, ctx.device)
    if compile:
        model = torch.compile(model)
    if strategy.name == "single":
        return model
    if strategy.name == "dp":
        # Without CUDA, DP is the module itself (train.py allows only 1 device there).
        if ctx.device.type != "cuda":
            return model
        return nn.DataParallel(model, device_ids=list(range(devices)))
    if strategy.name == "ddp":
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
    """The plain module under DP/DDP and torch.compile: state_dict keys carry no `module.` or
    `_orig_mod.` prefix, so a checkpoint loads under any strategy."""
    if isinstance(model, (DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule


def devices_of(model: nn.Module, ctx: DistContext) -> list[torch.device]:
    """The devices this process computes on: DP's replicas, else ctx.device."""
    if isinstance(model, nn.DataParallel) and model.device_ids:
        return [torch.device("cuda", i) for i in model.device_ids]
    return [ctx.device]
