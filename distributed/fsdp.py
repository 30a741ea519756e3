"""FSDP2 (`fully_shard`): which modules become shard groups, how a model is sharded, how an
accumulation micro-batch skips communication, and how many bytes a rank really holds.

Each shard group's parameters are all-gathered in one collective before its forward (and again
before its backward with reshard_after_forward) and its gradients reduce-scattered in one after
its backward; so the largest group bounds the memory a gathered step needs, and one group per
repeated block keeps that small while the collectives stay large enough to be efficient.

torch.distributed.fsdp and torch.distributed.tensor are slow to import, which every process of
every strategy would pay: they are imported when a model is sharded, and until then nothing is.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from config.schema import StrategyConfig
from distributed.context import DistContext

# Containers group layers without being blocks: seed 001's `features` Sequential holds its convs.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def block_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The model's repeated blocks: module classes with parameters that occur more than once,
    less those with an instance inside another such class's instance. ResNet: its BasicBlocks or
    Bottlenecks (their convs sit inside them); simple_cnn and mnist_net: each Conv2d and Linear;
    torchvision's ViT: its EncoderBlocks."""
    counts = Counter(type(m) for m in _candidates(model))
    repeated = {cls for cls, n in counts.items() if n > 1}
    nested = {
        type(inner)
        for outer in model.modules()
        if type(outer) in repeated
        for inner in outer.modules()
        if inner is not outer and type(inner) in repeated and type(inner) is not type(outer)
    }
    return repeated - nested


def shard_units(model: nn.Module, class_names: list[str] | None) -> list[nn.Module]:
    """The modules sharded one group each, children before their parents (fully_shard must go
    bottom-up); the root's own group takes every parameter left over (a ResNet's stem and head)."""
    if class_names is None:
        classes = block_classes(model)
        chosen = [m for m in model.modules() if m is not model and type(m) in classes]
    else:
        chosen = [m for m in model.modules() if m is not model and type(m).__name__ in class_names]
    return chosen[::-1]


def module_class_names(model: nn.Module) -> list[str]:
    """What strategy.shard_modules may name: the classes in `model` that hold parameters."""
    return sorted({type(m).__name__ for m in _candidates(model)})


def _candidates(model: nn.Module) -> Iterator[nn.Module]:
    for module in model.modules():
        if module is not model and not isinstance(module, _CONTAINERS) and _has_parameters(module):
            yield module


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def shard(model: nn.Module, ctx: DistContext, config: StrategyConfig, param_dtype: torch.dtype | None) -> nn.Module:
    """fully_shard every unit, then the root, over all ranks; in place: names and the parameter
    order stay the plain model's, so state_dict keys and optimizer indices do too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    # pin_memory needs CUDA; on a CPU rehearsal the shards are in host memory anyway.
    offload = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if config.cpu_offload else OffloadPolicy()
    units = shard_units(model, config.shard_modules)
    if config.mixed_precision and param_dtype is not None:
        # The fp32 shards stay what the optimizer steps; gathered copies and compute use param_dtype,
        # and gradients are averaged in fp32 so that summing N ranks' bf16 loses nothing.
        mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        # BatchNorm keeps its running statistics in fp32, and batch_norm refuses bf16 weights beside
        # them ("expected scalar type BFloat16 but found Float"): each gets a group of its own that
        # stays fp32, innermost, as FSDP's authors advise (torchtitan#674).
        norms = [m for m in model.modules() if isinstance(m, _BATCH_NORMS)]
        for norm in norms[::-1]:
            fully_shard(
                norm,
                mesh=mesh,
                reshard_after_forward=config.reshard_after_forward,
                mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32),
                offload_policy=offload,
            )
        units = [unit for unit in units if not isinstance(unit, _BATCH_NORMS)]
    else:
        mixed = MixedPrecisionPolicy()
    for unit in units:
        fully_shard(
            unit, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=mixed, offload_policy=offload
        )
    # The root's parameters are the first backward needs: keeping them saves an all-gather (FSDP's
    # own choice for a root). Its output, the logits, is cast back to fp32 for the loss, as autocast
    # would compute cross-entropy (and evaluation runs without autocast).
    root = replace(mixed, output_dtype=torch.float32) if mixed.param_dtype is not None else mixed
    return fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=root, offload_policy=offload)


def is_sharded(model: nn.Module) -> bool:
    api = sys.modules.get("torch.distributed.fsdp")
    return api is not None and isinstance(model, api.FSDPModule)


@contextlib.contextmanager
def accumulating(model: nn.Module) -> Iterator[None]:
    """A micro-batch that is not the last of its group: gradients accumulate unsharded and
    unreduced, and the gathered parameters stay for the next micro-batch; the group's last
    backward reduce-scatters the sum once."""
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds for `tensor`: a DTensor's local shard, else all of it."""
    api = sys.modules.get("torch.distributed.tensor")
    local = tensor.to_local() if api is not None and isinstance(tensor, api.DTensor) else tensor
    return local.numel() * local.element_size()
