"""LeNet-style CNN from seed 001 (two 5x5 convs, three linear layers)."""

from __future__ import annotations

import torch
from torch import nn

from models.shapes import flat_features


class SimpleCNN(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        # LeNet's unpadded convs are built for 32 px (as in the seed, on CIFAR-10); smaller images
        # (digits' 8 px, MNIST's 28) keep their size through the convs instead of vanishing.
        padding = 0 if image_size >= 32 else 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(flat_features(self.features, in_channels, image_size), 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
