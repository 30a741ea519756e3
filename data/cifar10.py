"""CIFAR-10 from torchvision's layout (root/cifar-10-batches-py/), read here, not by torchvision.

torchvision's CIFAR10 refuses any file whose md5 differs from the official release; we accept
every well-formed batch (a subset, a re-pickled copy, with str or bytes keys) and reject malformed
ones by name.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from config.schema import DatasetConfig
from data.arrays import ArrayDataset, ImageArrays, transformed
from data.download import dataset_root, fetch_command
from errors import ConfigError

FOLDER = "cifar-10-batches-py"
IMAGE_SIZE = 32  # every stored image's side, in pixels
PER_IMAGE_TRANSFORMS = True  # PIL images through torchvision transforms (dataset.auto_augment, ...)
# Label i's name, as the release's batches.meta lists them (a subset may come without that file).
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
VAL = ["test_batch"]
# What a CIFAR batch may contain: numpy arrays and nothing else (pickle could run any code).
_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),  # how numpy pickles an array at protocol 5 (Python 3.14's default)
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2
}


def class_names(cfg: DatasetConfig) -> list[str]:
    return list(CLASSES)


def files(root: Path) -> list[Path]:
    return [root / FOLDER / name for name in TRAIN + VAL]


def download(root: Path) -> None:
    """torchvision's download code: fetch the official archive (md5-checked) and unpack it."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_and_extract_archive

    download_and_extract_archive(CIFAR10.url, str(root), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5)


def read(root: Path) -> tuple[ImageArrays, ImageArrays]:
    return _read_split(root, TRAIN), _read_split(root, VAL)


def arrays(cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]:
    return read(dataset_root(cfg))


def load(cfg: DatasetConfig) -> tuple[ArrayDataset, ArrayDataset]:
    return transformed(arrays(cfg), cfg)


def write_batch(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """A batch as the python-version release stores it (uint8 N x 3 x 32 x 32 in, rows of 3072 out):
    for subsets, tests and benchmarks."""
    entry = {"batch_label": path.name, "data": images.reshape(len(images), -1), "labels": [int(y) for y in labels]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(entry, protocol=2))


def _read_split(root: Path, names: list[str]) -> ImageArrays:
    batches = [_read_batch(root / FOLDER / name) for name in names]
    images = np.concatenate([images for images, _ in batches])
    labels = np.concatenate([labels for _, labels in batches])
    # Stored row-major as 3 x 32 x 32 planes (R, G, B): already channels-first.
    return ImageArrays(torch.from_numpy(images).view(-1, 3, 32, 32), torch.from_numpy(labels))


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    fix = f"delete it and run {fetch_command('cifar10', path.parents[1])}"
    try:
        with path.open("rb") as f:
            entry = _Unpickler(f, encoding="latin1").load()
        images, labels = _field(entry, "data"), np.asarray(_field(entry, "labels"), dtype=np.int64)
    except (OSError, EOFError, pickle.UnpicklingError, TypeError, KeyError, ValueError, IndexError) as e:
        raise ConfigError(f"{path}: not a CIFAR-10 batch ({type(e).__name__}: {e}); {fix}") from None
    if not (
        isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 2 and images.shape[1] == 3072
    ):
        raise ConfigError(f"{path}: 'data' must be uint8 rows of 3072 pixels (3 x 32 x 32); {fix}")
    if labels.shape != (len(images),) or (labels.size and not 0 <= labels.min() <= labels.max() <= 9):
        raise ConfigError(f"{path}: needs one label in 0..9 per image ({len(images)} images); {fix}")
    return images, labels


def _field(entry: Any, key: str) -> Any:
    """entry[key]; a copy re-pickled after `pickle.load(f, encoding="bytes")` has bytes keys."""
    if isinstance(entry, dict) and key not in entry and key.encode() in entry:
        return entry[key.encode()]
    return entry[key]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR batch")
        return super().find_class(module, name)
