"""Random images and labels of a configurable shape: for throughput work, not for accuracy."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset


def load(cfg: Any) -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(cfg.seed)
    return _random(cfg, cfg.train_size, generator), _random(cfg, cfg.val_size, generator)


def _random(cfg: Any, size: int, generator: torch.Generator) -> TensorDataset:
    x = torch.randn(size, cfg.channels, cfg.image_size, cfg.image_size, generator=generator)
    y = torch.randint(0, cfg.num_classes, (size,), generator=generator)
    return TensorDataset(x, y)
