"""Handwritten digits (1,797 8x8 images, 57 KB) shipped in data/files: no download, no dependency.

scikit-learn's copy of UCI's optdigits test set, as its `load_digits` reads it; its provenance and
licence are in data/files/NOTICE.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from config.schema import DatasetConfig
from data.arrays import ImageArrays
from errors import ConfigError

FILE = Path(__file__).parent / "files" / "digits.csv.gz"
SIZE = 1797  # the rows of digits.csv.gz: known without reading it, so checking a split costs nothing
IMAGE_SIZE = 8  # every stored image's side, in pixels


def images_and_labels() -> tuple[np.ndarray, np.ndarray]:
    """(1797 x 64 pixels 0..16, 1797 labels), the rows of FILE."""
    rows = np.loadtxt(FILE, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices: each class keeps its share in val (largest remainders fill the total)."""
    classes, counts = np.unique(labels, return_counts=True)
    quotas = counts * val_fraction
    per_class = np.floor(quotas).astype(int)
    short = math.ceil(val_fraction * len(labels)) - per_class.sum()
    per_class[np.argsort(-(quotas - per_class), kind="stable")[:short]] += 1
    rng = np.random.default_rng(seed)
    val = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, per_class)])
    return np.setdiff1d(np.arange(len(labels)), val), np.sort(val)


def check(cfg: DatasetConfig) -> None:
    """A split that leaves images on both sides, as stratified_split rounds (val takes the ceiling)."""
    if not (0 < cfg.val_fraction < 1 and math.ceil(cfg.val_fraction * SIZE) < SIZE):
        raise ConfigError(
            f"dataset.val_fraction={cfg.val_fraction}: the share of the {SIZE:,} digits held out for validation "
            "must leave some to train on and some to validate; use a fraction between 0 and 1 (the default is 0.2)"
        )


def class_names(cfg: DatasetConfig) -> list[str]:
    return [str(digit) for digit in range(10)]  # a label is the digit drawn


def arrays(cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]:
    images, labels = images_and_labels()
    # A fixed split, independent of trainer.seed, so every run tests on the same images.
    train, val = stratified_split(labels, cfg.val_fraction)
    return _arrays(images[train], labels[train]), _arrays(images[val], labels[val])


def _arrays(images, labels) -> ImageArrays:
    pixels = torch.as_tensor(images, dtype=torch.uint8).view(-1, 1, 8, 8)
    return ImageArrays(pixels, torch.as_tensor(labels, dtype=torch.long), scale=16.0)  # pixels are 0..16
