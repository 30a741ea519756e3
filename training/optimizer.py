"""The optimizer's side of a recipe: the lr scaled to the batch, and weight-decay groups."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from errors import ConfigError

# torchvision's set_weight_decay: the layers whose parameters take optimizer.norm_weight_decay
NORM_LAYERS = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.LocalResponseNorm,
)


def parameter_groups(model: nn.Module, norm_weight_decay: float | None) -> Iterable[Any]:
    """optimizer.norm_weight_decay=null: one group, as before. Otherwise the parameters of
    normalisation layers and every bias form a second group with that weight decay (torchvision's
    set_weight_decay with its norm and bias keys both set to it); the rest keep the optimizer's."""
    if norm_weight_decay is None:
        return model.parameters()
    decayed, exempt, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:  # tied weights: one group only
                continue
            seen.add(id(parameter))
            (exempt if isinstance(module, NORM_LAYERS) or name == "bias" else decayed).append(parameter)
    groups = [{"params": decayed}, {"params": exempt, "weight_decay": norm_weight_decay}]
    return [group for group in groups if group["params"]]


def check_arguments(optimizer: Callable[..., Any], scheduler: Callable[..., Any] | None) -> None:
    """The optimizer's and scheduler's own argument checks (a key the class does not take, a
    Nesterov SGD without momentum, StepLR's step_size=0 at its first step) on a throwaway
    parameter, as one-line ConfigErrors before training. In the rank, not in the pre-flight:
    building an optimizer imports torch._dynamo (slow; BENCHMARKS.md: Start-up), which the
    launching process never needs."""
    try:
        probe = optimizer([nn.Parameter(torch.zeros(1))])
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"optimizer: {_name(optimizer)} refuses {_given(optimizer)} ({e}); fix the optimizer.* keys"
        ) from None
    if scheduler is None:
        return
    try:
        schedule = scheduler(probe)
        probe.step()
        schedule.step()
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ConfigError(
            f"scheduler: {_name(scheduler)} refuses {_given(scheduler)} ({e}); fix the scheduler.* keys"
        ) from None


def _given(factory: Callable[..., Any]) -> str:
    """The options the class was given, as keys and values: its own message may name none
    (StepLR's step_size=0 fails as "integer modulo by zero")."""
    options = getattr(factory, "keywords", {})
    return ", ".join(f"{key}={value}" for key, value in options.items()) if options else "these options"


def _name(factory: Callable[..., Any]) -> str:
    target = getattr(factory, "func", factory)  # Hydra's _partial_: functools.partial(class, **options)
    return f"{target.__module__}.{target.__qualname__}"
