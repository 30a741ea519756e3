"""torchvision ResNets adapted to the dataset's channels and classes."""

from __future__ import annotations

from torch import nn

from errors import ConfigError
from models.arch import unknown_arch
from models.weights import check_fits, load_matching


def _imagenet_stem(model: nn.Module, in_channels: int) -> None:
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)


def _cifar_stem(model: nn.Module, in_channels: int) -> None:
    model.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()


_STEMS = {"imagenet": _imagenet_stem, "cifar": _cifar_stem}


def resnet(
    arch: str, in_channels: int, num_classes: int, stem: str = "imagenet", weights: str | None = None
) -> nn.Module:
    """`stem=cifar` swaps the 7x7/2 conv + max-pool for a 3x3/1 conv (the usual small-image ResNet).

    `weights` is a local state_dict file, loaded after the stem and head are sized for the dataset:
    from torchvision's resnet18-f37072fd.pth every backbone tensor loads and the head (and a cifar or
    non-RGB stem's conv) stays fresh; a state_dict saved from this very model loads whole.
    """
    import torchvision  # lazy: slow to import, and only ResNets need it

    model = torchvision.models.get_model(arch, num_classes=num_classes)
    _STEMS[stem](model, in_channels)
    if weights is not None:
        load_matching(model, weights)
    return model


def check(arch: str, in_channels: int, num_classes: int, stem: str, weights: str | None) -> None:
    """Before launch: a ResNet torchvision has, a stem this module builds, weights that fit."""
    import torchvision

    builder = torchvision.models.get_model_builder
    names = torchvision.models.list_models(module=torchvision.models)
    resnets = [name for name in names if builder(name).__module__ == "torchvision.models.resnet"]  # resnext too
    if arch not in resnets:
        every = f"give one of {', '.join(resnets)}, or model=torchvision for others"
        raise unknown_arch(arch, resnets, "ResNet", every)
    if stem not in _STEMS:
        raise ConfigError(
            f"model.stem={stem}: no such stem; give imagenet (7x7/2 conv + max-pool) or cifar (3x3/1 conv, small images)"
        )
    if weights is not None:
        check_fits(resnet(arch, in_channels, num_classes, stem), weights)
