"""Small datasets written in the real on-disk formats, for tests that must not download.

Each class gets its own colour (plus noise), a signal that survives crops and flips, so a tiny
network learns it in an epoch or two and both loaders can be compared on accuracy.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from data import cifar10
from data.fashion_mnist import FASHION_MNIST
from data.idx import TRAIN, VAL, IdxDataset, idx_bytes
from data.kmnist import KMNIST
from data.mnist import MNIST


def class_images(labels: np.ndarray, channels: int, size: int, seed: int) -> np.ndarray:
    """uint8 N x C x H x W: class k's base brightness per channel is a fixed pattern, plus noise."""
    rng = np.random.default_rng(seed)
    palette = np.random.default_rng(1234).integers(40, 216, (10, channels))
    noise = rng.normal(0, 25, (len(labels), channels, size, size))
    return np.clip(palette[labels][:, :, None, None] + noise, 0, 255).astype(np.uint8)


def labels_for(n: int, seed: int, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % classes).astype(np.int64)


def write_cifar(root: Path, per_batch: int = 40, val: int = 100) -> dict[str, np.ndarray]:
    """root/cifar-10-batches-py/data_batch_1..5 and test_batch; returns what was written."""
    written = {}
    for i, name in enumerate(cifar10.TRAIN + cifar10.VAL):
        n = val if name in cifar10.VAL else per_batch
        labels = labels_for(n, seed=i)
        images = class_images(labels, 3, 32, seed=i)
        cifar10.write_batch(root / cifar10.FOLDER / name, images, labels)
        written[name] = images, labels
    return written


def write_idx(
    root: Path, train: int = 200, val: int = 100, gz: bool = False, dataset: IdxDataset = MNIST
) -> dict[str, np.ndarray]:
    """`dataset`'s IDX files as torchvision lays them out, root/<its folder>/raw/{train,t10k}-{images-idx3,
    labels-idx1}-ubyte[.gz] (MNIST's unless told); returns what was written."""
    folder = dataset.folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for (images_name, labels_name), n, seed in ((TRAIN, train, 0), (VAL, val, 1)):
        labels = labels_for(n, seed)
        images = class_images(labels, 1, 28, seed)[:, 0]
        for name, array in ((images_name, images), (labels_name, labels.astype(np.uint8))):
            data = idx_bytes(array)
            (folder / (name + ".gz" if gz else name)).write_bytes(gzip.compress(data) if gz else data)
            written[name] = array
    return written


def write_image_folder(root: Path, classes: int = 2, per_class: int = 4, size: int = 40, suffix: str = ".png") -> Path:
    """root/{train,val}/class<k>/<i><suffix> (.png, or .jpg: baseline colour JPEGs)"""
    for split, seed in (("train", 0), ("val", 1)):
        labels = np.repeat(np.arange(classes), per_class)
        images = class_images(labels, 3, size, seed)
        for i, (image, label) in enumerate(zip(images, labels)):
            path = root / split / f"class{label}" / f"{i}{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.transpose(1, 2, 0)).save(path)
    return root


APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(4066)  # a resource fork's header


def write_mac_leftovers(folder: Path) -> list[Path]:
    """What a folder of images copied from macOS (or opened in Jupyter) holds besides them, all of
    it hidden, in `folder` and each folder under it: an AppleDouble `._<name>` beside each file
    (resource-fork metadata, no image, though named as one), a `.DS_Store`, and an
    `.ipynb_checkpoints/` holding a copy of the first image beneath (under an image folder's
    train/, a folder beside the classes). Returns what it wrote."""
    written = []
    for top in sorted(p for p in [folder, *folder.rglob("*")] if p.is_dir()):
        images = sorted(p for p in top.rglob("*") if p.is_file())
        for image in (p for p in images if p.parent == top):
            written.append(top / f"._{image.name}")
            written[-1].write_bytes(APPLE_DOUBLE)
        written.append(top / ".DS_Store")
        written[-1].write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(100))
        if images:
            written.append(top / ".ipynb_checkpoints" / f"{images[0].stem}-checkpoint{images[0].suffix}")
            written[-1].parent.mkdir()
            written[-1].write_bytes(images[0].read_bytes())
    return written


def write_odd_images(folder: Path, size: tuple[int, int] = (48, 40)) -> dict[str, Path]:
    """The files an image folder meets besides baseline colour JPEGs: a grey, a CMYK and a
    progressive JPEG, a PNG; each named by what it is."""
    rgb = Image.fromarray(class_images(np.array([3]), 3, max(size), seed=7)[0].transpose(1, 2, 0)).resize(size)
    folder.mkdir(parents=True, exist_ok=True)
    odd = {
        "grey": folder / "grey.jpg",
        "cmyk": folder / "cmyk.jpg",
        "progressive": folder / "progressive.jpg",
        "png": folder / "png.png",
    }
    rgb.convert("L").save(odd["grey"])
    rgb.convert("CMYK").save(odd["cmyk"])
    rgb.save(odd["progressive"], progressive=True)
    rgb.save(odd["png"])
    return odd


def _idx(dataset: IdxDataset) -> Callable[[Path], list[str]]:
    def write(root: Path) -> list[str]:
        write_idx(root, train=32, val=16, dataset=dataset)
        return [f"dataset.root={root}", "dataset.download=false"]

    return write


def _cifar(root: Path) -> list[str]:
    write_cifar(root, per_batch=8, val=16)
    return [f"dataset.root={root}", "dataset.download=false"]


def _image_folder(root: Path) -> list[str]:
    write_image_folder(root, classes=3, per_class=4, size=40, suffix=".jpg")
    return [f"dataset.root={root}", "dataset.image_size=32", "dataset.resize=36"]


# Each registered dataset with files: a few of them written in their real format under `root`, and
# the overrides that point a run at them (tests/test_models.py trains every dataset on them).
WRITERS: dict[str, Callable[[Path], list[str]]] = {
    "mnist": _idx(MNIST),
    "fashion_mnist": _idx(FASHION_MNIST),
    "kmnist": _idx(KMNIST),
    "cifar10": _cifar,
    "imagefolder": _image_folder,
}
