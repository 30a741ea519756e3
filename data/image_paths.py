"""Image files outside any dataset (a folder, a file or a glob), each cut as a run's validation cuts
its images: what predict.py classifies. Read and decoded as an image folder's are (data.file_batches),
uint8 until the device (data.transforms.ToDevice)."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from config.schema import DatasetConfig
from data.crops import center_boxes
from data.file_batches import decode_here, read
from errors import ConfigError


def hidden(name: str) -> bool:
    """A hidden file or folder ('.' first) holds no image, whatever its extension: macOS leaves an
    AppleDouble `._photo.jpg` (resource-fork metadata) beside each file it copies, and `.DS_Store`,
    `.ipynb_checkpoints/` or `.git/` sit in folders people train on; skipped, as most tools skip them."""
    return name.startswith(".")


def is_image(relative: str) -> bool:
    """Whether the file at `relative` (its path under the folder walked, or its name where the walk
    leaves hidden folders out) is an image: an image extension (torchvision's IMG_EXTENSIONS, any
    case), and no hidden file or folder on the way: the one rule of every walk of an image folder
    (training's, validation's, predict.py's, data.prepare's), so that they all find the same images.
    On strings: it runs once per file of a dataset as the run starts (ImageNet's 1.28 million)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return relative.lower().endswith(IMG_EXTENSIONS) and f"{os.sep}." not in f"{os.sep}{relative}"


def image_files_under(folder: Path) -> list[Path]:
    """Every image file under `folder` (is_image), at any depth, as torchvision's ImageFolder walks:
    through symlinked folders too (it walks with followlinks=True; Path.rglob would skip them,
    and with them whole classes), sorted by path."""
    found: list[Path] = []
    for top, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [name for name in folders if not hidden(name)]  # no image in them
        found += (Path(top, name) for name in names if is_image(name))
    return sorted(found, key=str)


def image_paths(sources: Sequence[str]) -> list[str]:
    """Each source a file, a folder (its image files, at any depth: image_files_under) or a glob
    (every file it matches), in that order, sorted within each."""
    paths: list[str] = []
    for source in sources:
        if Path(source).is_file():
            found = [source]
        elif Path(source).is_dir():
            found = [str(path) for path in image_files_under(Path(source))]
        else:
            found = sorted(p for p in glob.glob(source, recursive=True) if Path(p).is_file())
        if not found:
            what = (
                "holds no image file" if Path(source).is_dir() else "is no file, and no folder or glob that finds one"
            )
            raise ConfigError(f"{source}: {what}; give image files, a folder of them, or a glob ('photos/*.jpg')")
        paths += found
    return list(dict.fromkeys(paths))  # a file two sources name, once


def validation_image(path: str, dataset: DatasetConfig) -> torch.Tensor:
    """The file as the run's validation sees an image: resized (shorter side to dataset.val_resize,
    or resize) and centre-cropped (val_crop, or image_size), grey or RGB as dataset.channels;
    uint8 C x S x S. A small-image dataset (MNIST, CIFAR-10) resizes to image_size: its own images
    are that size already. A file it cannot read or decode: a one-line ConfigError naming it."""
    crop = dataset.val_crop or dataset.image_size
    resize = dataset.val_resize or dataset.resize or dataset.image_size
    encoded = read(path)
    box = center_boxes(torch.tensor([[encoded.height, encoded.width]]), resize, crop)[0]
    return decode_here(encoded, box.tolist(), crop, grey=dataset.channels == 1)


class ImagePaths(Dataset):
    """(image, position) for each path, or (None, position, the one-line error) for a file that
    cannot be read: DataLoader workers decode, and one bad file stops nothing."""

    def __init__(self, paths: Sequence[str], dataset: DatasetConfig) -> None:
        self.paths, self.dataset = paths, dataset

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor | None, int, str | None]:
        try:
            return validation_image(self.paths[index], self.dataset), index, None
        except ConfigError as e:
            return None, index, str(e)


def collate(samples: list[tuple[torch.Tensor | None, int, str | None]]) -> tuple[torch.Tensor, list[int], list[str]]:
    """A batch of the images that decoded (uint8 N x C x S x S), their positions, and the errors of
    those that did not."""
    decoded = [(image, index) for image, index, _ in samples if image is not None]
    images = torch.stack([image for image, _ in decoded]) if decoded else torch.empty(0, dtype=torch.uint8)
    return images, [index for _, index in decoded], [error for _, _, error in samples if error is not None]
