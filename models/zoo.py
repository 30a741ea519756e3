"""Any torchvision classifier by name (torchvision.models.get_model), with the dataset's classes
and, optionally, weights from a local state_dict file (compute nodes have no internet)."""
from __future__ import annotations

import difflib
import logging
from pathlib import Path

import torch
from torch import nn

from errors import ConfigError

log = logging.getLogger("train")


def torchvision_classifier(arch: str, num_classes: int, in_channels: int = 3, weights: str | None = None) -> nn.Module:
    """`weights` (e.g. torchvision's resnet50-11ad3fa6.pth) load into every tensor of the same
    shape; the classifier's, sized for other classes, keep their fresh initialisation."""
    import torchvision  # lazy: ~1 s of start-up, and only this model needs it

    model = torchvision.models.get_model(arch, num_classes=num_classes)
    if weights is not None:
        _load_matching(model, weights)
    return model


def check(arch: str, in_channels: int, num_classes: int, weights: str | None = None) -> None:
    """config.check: a name torchvision knows, images it can take, weights that fit."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)  # classifiers, not detection/video
    if arch not in names:
        closest = difflib.get_close_matches(arch, names, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(closest)}" if closest else "see torchvision.models.list_models()"
        raise ConfigError(f"model.arch={arch}: torchvision has no such classifier; {hint}")
    if in_channels != 3:
        raise ConfigError(
            f"model=torchvision takes 3-channel images but the dataset has {in_channels}; "
            "use a colour dataset (cifar10, imagefolder, synthetic) or model=resnet18/resnet50"
        )
    if weights is not None:
        torchvision_classifier(arch, num_classes, in_channels, weights)


def _load_matching(model: nn.Module, path: str) -> None:
    saved = torch.load(Path(path), map_location="cpu", weights_only=True)
    own = model.state_dict()
    if set(saved) != set(own):
        missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise ConfigError(
            f"model.weights={path} is not a state_dict of this architecture ("
            + (f"lacks {missing[0]}" if missing else f"has {extra[0]}, which it lacks")
            + "); give the file of the model.arch it was saved from"
        )
    fresh = [key for key, tensor in saved.items() if tensor.shape != own[key].shape]
    if fresh:
        log.warning("model.weights: %s kept fresh (their shape is for another number of classes)", ", ".join(fresh))
    model.load_state_dict({key: tensor for key, tensor in saved.items() if key not in fresh}, strict=False)
