"""Random images and labels of a configurable shape: for throughput work, not for accuracy."""

from __future__ import annotations

import torch

from config.schema import DatasetConfig
from data.arrays import ImageArrays


def arrays(cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]:
    generator = torch.Generator().manual_seed(cfg.seed)
    return _random(cfg, cfg.train_size, generator), _random(cfg, cfg.val_size, generator)


def _random(cfg: DatasetConfig, size: int, generator: torch.Generator) -> ImageArrays:
    x = torch.randn(size, cfg.channels, cfg.image_size, cfg.image_size, generator=generator)
    y = torch.randint(0, cfg.num_classes, (size,), generator=generator)
    return ImageArrays(x, y, scale=1.0)  # already the network's input: no scaling, no normalisation
