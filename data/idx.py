"""Datasets in MNIST's IDX format (MNIST, Fashion-MNIST, KMNIST, ...), read here from torchvision's
layout (root/<torchvision's class>/raw/, files gzipped or not) and downloaded by torchvision."""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from config.schema import DatasetConfig
from data.arrays import ArrayDataset, ImageArrays, transformed
from data.download import dataset_root, fetch_command
from errors import ConfigError

TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
VAL = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_UBYTE = 0x08  # idx type code of unsigned bytes, the only one these datasets use


@dataclass(frozen=True)
class IdxDataset:
    """One IDX dataset: a DatasetModule (data/__init__.py) whose files are torchvision's for `torchvision_class`."""

    name: str  # its dataset.name, for the command a message gives as the fix
    torchvision_class: str  # MNIST, FashionMNIST, KMNIST: the folder torchvision keeps it in, and its download
    IMAGE_SIZE: ClassVar[int] = 28  # every stored image's side, in pixels
    PER_IMAGE_TRANSFORMS: ClassVar[bool] = True  # PIL images through torchvision transforms (dataset.auto_augment, ...)

    def files(self, root: Path) -> list[Path]:
        """Each file as torchvision leaves it: unpacked, or still gzipped if only the .gz is there."""
        paths = [self.folder(root) / name for name in TRAIN + VAL]
        gzipped = [path.with_name(path.name + ".gz") for path in paths]
        return [gz if gz.exists() and not path.exists() else path for path, gz in zip(paths, gzipped)]

    def folder(self, root: Path) -> Path:
        return root / self.torchvision_class / "raw"

    def download(self, root: Path) -> None:
        """torchvision's download code: each file from its mirrors, md5-checked, then gunzipped."""
        import torchvision.datasets

        getattr(torchvision.datasets, self.torchvision_class)(str(root), train=True, download=True)

    def read(self, root: Path) -> tuple[ImageArrays, ImageArrays]:
        train_images, train_labels, val_images, val_labels = self.files(root)
        return self._read_split(train_images, train_labels), self._read_split(val_images, val_labels)

    def arrays(self, cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]:
        return self.read(dataset_root(cfg))

    def load(self, cfg: DatasetConfig) -> tuple[ArrayDataset, ArrayDataset]:
        return transformed(self.arrays(cfg), cfg)

    def class_names(self, cfg: DatasetConfig) -> list[str]:
        """torchvision's names for the labels (MNIST: '0 - zero', ...; KMNIST: the hiragana's romaji)."""
        import torchvision.datasets

        return list(getattr(torchvision.datasets, self.torchvision_class).classes)

    def _read_split(self, images_path: Path, labels_path: Path) -> ImageArrays:
        images = read_idx(images_path, ndim=3, fix=self._fix(images_path))
        labels = read_idx(labels_path, ndim=1, fix=self._fix(labels_path)).astype(np.int64)
        if len(images) != len(labels):
            raise ConfigError(
                f"{images_path}: {len(images)} images but {labels_path.name} has {len(labels)} labels; "
                f"{self._fix(images_path)}"
            )
        if labels.size and labels.max() > 9:
            raise ConfigError(f"{labels_path}: labels must lie in 0..9, found {labels.max()}; {self._fix(labels_path)}")
        return ImageArrays(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels))

    def _fix(self, path: Path) -> str:
        return f"delete it and run {fetch_command(self.name, path.parents[2])}"


def read_idx(path: Path, ndim: int, fix: str) -> np.ndarray:
    """An idx file of unsigned bytes: magic (0, 0, 0x08, ndim), ndim big-endian sizes, the data;
    a malformed one is a ConfigError naming it, then `fix`."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e}); {fix}") from None
    header = 4 + 4 * ndim  # see idx_bytes
    if len(raw) < header or raw[:4] != bytes([0, 0, _UBYTE, ndim]):
        raise ConfigError(f"{path}: not an idx file of {ndim}-d unsigned bytes (bad header); {fix}")
    shape = tuple(int(size) for size in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    if len(raw) - header != int(np.prod(shape)):
        raise ConfigError(
            f"{path}: header promises {shape} = {int(np.prod(shape))} bytes but {len(raw) - header} follow "
            f"(truncated?); {fix}"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape).copy()


def idx_bytes(array: np.ndarray) -> bytes:
    """`array` (uint8) as an idx file: the inverse of read_idx, for subsets, tests and benchmarks."""
    return (
        bytes([0, 0, _UBYTE, array.ndim]) + np.asarray(array.shape, ">u4").tobytes() + array.astype(np.uint8).tobytes()
    )
