"""A whole split as one tensor of images, as stored on disk, plus labels: both loaders start here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from config.schema import DatasetConfig


@dataclass(frozen=True)
class ImageArrays:
    images: torch.Tensor  # N x C x H x W; uint8 as stored (synthetic: float)
    labels: torch.Tensor  # N, int64
    scale: float = 255.0  # the stored value of white: images / scale lies in [0, 1]

    def __len__(self) -> int:
        return len(self.labels)


class ArrayDataset(Dataset):
    """One PIL image per sample through torchvision transforms: the seeds' DataLoader pipeline."""

    def __init__(self, arrays: ImageArrays, transform: Callable[[Image.Image], Any]) -> None:
        self.arrays = arrays
        self.transform = transform

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.arrays.images[index].numpy()
        pil = Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0))
        return self.transform(pil), int(self.arrays.labels[index])


def transformed(splits: tuple[ImageArrays, ImageArrays], cfg: DatasetConfig) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, val) through the per-sample transforms of the DataLoader path."""
    from data.transforms import sample_transform

    train, val = splits
    return ArrayDataset(train, sample_transform(cfg, train=True)), ArrayDataset(val, sample_transform(cfg, train=False))
