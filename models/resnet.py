"""torchvision ResNets adapted to the dataset's channels and classes."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def resnet(arch: str, in_channels: int, num_classes: int, stem: str = "imagenet", weights: str | None = None) -> nn.Module:
    """`stem=cifar` swaps the 7x7/2 conv + max-pool for a 3x3/1 conv (the usual small-image ResNet).

    `weights` is a local state_dict file (e.g. torchvision's resnet18-f37072fd.pth) loaded before
    the head is replaced, so fine-tuning works on machines without internet.
    """
    import torchvision  # lazy: costs ~1 s at start-up and only ResNets need it

    model = getattr(torchvision.models, arch)()
    if weights is not None:
        model.load_state_dict(torch.load(Path(weights), map_location="cpu", weights_only=True))
    if stem == "cifar":
        model.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    model.fc = nn.Linear(model.fc.in_features, num_classes)
    return model
