"""MNIST from torchvision's layout (root/MNIST/raw/), idx files gzipped or not, read here."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from config.schema import DatasetConfig
from data.arrays import ArrayDataset, ImageArrays, transformed
from data.download import dataset_root
from errors import ConfigError

FOLDER = Path("MNIST") / "raw"
IMAGE_SIZE = 28  # every stored image's side, in pixels
PER_IMAGE_TRANSFORMS = True  # PIL images through torchvision transforms (dataset.auto_augment, ...)
TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
VAL = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_UBYTE = 0x08  # idx type code of unsigned bytes, the only one MNIST uses


def files(root: Path) -> list[Path]:
    """Each file as torchvision leaves it: unpacked, or still gzipped if only the .gz is there."""
    paths = [root / FOLDER / name for name in TRAIN + VAL]
    return [p if p.exists() or not p.with_name(p.name + ".gz").exists() else p.with_name(p.name + ".gz") for p in paths]


def download(root: Path) -> None:
    """torchvision's download code: each file from its mirrors, md5-checked, then gunzipped."""
    from torchvision.datasets import MNIST

    MNIST(str(root), train=True, download=True)


def read(root: Path) -> tuple[ImageArrays, ImageArrays]:
    train_images, train_labels, val_images, val_labels = files(root)
    return _read_split(train_images, train_labels), _read_split(val_images, val_labels)


def arrays(cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]:
    return read(dataset_root(cfg))


def load(cfg: DatasetConfig) -> tuple[ArrayDataset, ArrayDataset]:
    return transformed(arrays(cfg), cfg)


def _read_split(images_path: Path, labels_path: Path) -> ImageArrays:
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1).astype(np.int64)
    if len(images) != len(labels):
        raise ConfigError(f"{images_path}: {len(images)} images but {labels_path.name} has {len(labels)} labels; {_fix(images_path)}")
    if labels.size and labels.max() > 9:
        raise ConfigError(f"{labels_path}: labels must lie in 0..9, found {labels.max()}; {_fix(labels_path)}")
    return ImageArrays(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An idx file of unsigned bytes: magic (0, 0, 0x08, ndim), ndim big-endian sizes, the data."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e}); {_fix(path)}") from None
    header = 4 + 4 * ndim  # see idx_bytes
    if len(raw) < header or raw[:4] != bytes([0, 0, _UBYTE, ndim]):
        raise ConfigError(f"{path}: not an idx file of {ndim}-d unsigned bytes (bad header); {_fix(path)}")
    shape = tuple(int(size) for size in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    if len(raw) - header != int(np.prod(shape)):
        raise ConfigError(
            f"{path}: header promises {shape} = {int(np.prod(shape))} bytes but {len(raw) - header} follow "
            f"(truncated?); {_fix(path)}"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape).copy()


def idx_bytes(array: np.ndarray) -> bytes:
    """`array` (uint8) as an idx file: the inverse of read_idx, for subsets, tests and benchmarks."""
    return bytes([0, 0, _UBYTE, array.ndim]) + np.asarray(array.shape, ">u4").tobytes() + array.astype(np.uint8).tobytes()


def _fix(path: Path) -> str:
    return f"delete it and run python -m data.download dataset=mnist dataset.root={path.parents[2]}"
