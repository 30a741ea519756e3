"""Seed 002's MNIST Net (pytorch/examples mnist): two 3x3 convs, dropout, two linear layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.shapes import flat_features


class MnistNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, 1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, 1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
        )
        self.fc1 = nn.Linear(flat_features(self.features, in_channels, image_size), 128)
        self.dropout = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.features(x), 1)
        x = self.fc2(self.dropout(F.relu(self.fc1(x))))
        # Log-probabilities as in the seed; cross-entropy of log-probabilities equals NLL.
        return F.log_softmax(x, dim=1)
