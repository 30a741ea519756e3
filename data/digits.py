"""scikit-learn's handwritten digits (1,797 8x8 images shipped inside the package): no download."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from data.arrays import ImageArrays


def arrays(cfg: Any) -> tuple[ImageArrays, ImageArrays]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images, labels = load_digits(return_X_y=True)
    # A fixed stratified split, independent of trainer.seed, so every run tests on the same images.
    x_train, x_val, y_train, y_val = train_test_split(
        images, labels, test_size=cfg.val_fraction, stratify=labels, random_state=0
    )
    return _arrays(x_train, y_train), _arrays(x_val, y_val)


def load(cfg: Any) -> tuple[TensorDataset, TensorDataset]:
    return tuple(_normalised(split, cfg) for split in arrays(cfg))


def _arrays(images, labels) -> ImageArrays:
    pixels = torch.as_tensor(images, dtype=torch.uint8).view(-1, 1, 8, 8)
    return ImageArrays(pixels, torch.as_tensor(labels, dtype=torch.long), scale=16.0)  # pixels are 0..16


def _normalised(split: ImageArrays, cfg: Any) -> TensorDataset:
    x = (split.images.float() / split.scale - cfg.mean[0]) / cfg.std[0]
    return TensorDataset(x, split.labels)
