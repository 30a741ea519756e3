"""Shape arithmetic shared by the small CNNs, so each works at any dataset's image size."""

from __future__ import annotations

import torch
from torch import nn


def flat_features(features: nn.Module, in_channels: int, image_size: int) -> int:
    """Width of `features`' flattened output for one image (one dry forward pass on zeros)."""
    with torch.no_grad():
        return features(torch.zeros(1, in_channels, image_size, image_size)).numel()
