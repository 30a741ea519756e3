"""The worker side of data.decode=gpu: each image file read and its header looked at, not decoded,
and where each image of a batch will be cut; the training process decodes the batch on its device
(data/decode.py).

A file nvJPEG should not take (not a JPEG, not 3-channel, progressive, or without its end marker)
is decoded here, on the CPU, as PIL decodes it on the CPU path, and travels as pixels; the device
cuts it as it cuts the others.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from config.schema import DatasetConfig
from data.crops import batch_seed, center_boxes, random_resized_boxes
from errors import ConfigError

_END_OF_IMAGE = b"\xff\xd9"


@dataclass
class Encoded:
    """One image as a worker hands it on."""

    data: torch.Tensor  # the file's bytes (1-D uint8), or, where `on_cpu` says why, its pixels (3 x H x W uint8)
    height: int
    width: int
    on_cpu: str | None  # why it was decoded here, e.g. "CMYK JPEG"; None: the device decodes it
    path: str


@dataclass
class EncodedBatch:
    """A batch as a worker hands it on: images still to decode, and where to cut each."""

    images: list[torch.Tensor]  # as Encoded.data
    on_cpu: list[str | None]
    paths: list[str]
    boxes: torch.Tensor  # n x 4 int64: top, left, height, width in the full image
    flips: torch.Tensor  # n bool: mirror after cutting


def read(path: str) -> Encoded:
    """The file's bytes and size, or its pixels where the device should not decode it. An
    unreadable file stops the run in one line naming it, as on the CPU path."""
    data = Path(path).read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as image:  # parses the header only
            why = cpu_only(image, data)
            if why is None:
                return Encoded(torch.frombuffer(bytearray(data), dtype=torch.uint8), image.height, image.width, None, path)
            pixels = np.asarray(image.convert("RGB"))
    except OSError as e:  # PIL's UnidentifiedImageError is an OSError too
        raise ConfigError(f"{path}: unreadable image ({e}); delete or replace it") from None
    return Encoded(torch.from_numpy(pixels.transpose(2, 0, 1).copy()), *pixels.shape[:2], why, path)


def cpu_only(image: Image.Image, data: bytes) -> str | None:
    """Why the device should not decode this file, or None. Grey and CMYK JPEGs are left to the
    CPU (nvJPEG's colour conversion assumes YCbCr), progressive ones too (nvJPEG decodes them
    one by one, partly on the training process's CPU), and a JPEG without its end marker is
    probably truncated: PIL names it if so."""
    if image.format != "JPEG":
        return f"{image.format or 'non-JPEG'} file"
    if image.mode != "RGB":
        return f"{'grey' if image.mode == 'L' else image.mode} JPEG"
    if image.info.get("progressive"):
        return "progressive JPEG"
    if not data.rstrip(b"\0").endswith(_END_OF_IMAGE):
        return "JPEG without its end marker"
    return None


class EncodedFiles(Dataset):
    """(path, label) samples, each served as (Encoded, label)."""

    def __init__(self, samples: Sequence[tuple[str, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Encoded, int]:
        path, label = self.samples[index]
        return read(path), label


class Positioned(Dataset):
    """The training split, indexed by (index, epoch, position) (data.EpochIndices): each sample
    carries where it falls in this rank's epoch, which seeds its batch's crops (Boxes)."""

    def __init__(self, dataset: EncodedFiles) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int, int]) -> tuple[Encoded, int, int, int]:
        index, epoch, position = item
        return (*self.dataset[index], epoch, position)


class Boxes:
    """The collate function: a batch of Encoded images as an EncodedBatch, with where to cut each.

    Training: RandomResizedCrop's boxes and flips, drawn for the whole batch from a generator
    seeded by (seed, epoch, rank, the batch's first position), so a resumed epoch, any number of
    workers and the device all see the same crops. Validation: Resize + CenterCrop's box."""

    def __init__(self, cfg: DatasetConfig, train: bool, seed: int, rank: int) -> None:
        self.train, self.flip, self.seed, self.rank = train, cfg.augment.flip, seed, rank
        self.resize, self.crop = cfg.val_resize or cfg.resize, cfg.val_crop or cfg.image_size

    def __call__(self, samples: list[tuple[Any, ...]]) -> tuple[EncodedBatch, torch.Tensor]:
        encoded, labels = [s[0] for s in samples], torch.tensor([s[1] for s in samples])
        sizes = torch.tensor([[e.height, e.width] for e in encoded])
        flips = torch.zeros(len(encoded), dtype=torch.bool)
        if self.train:
            _, _, epoch, position = samples[0]
            generator = torch.Generator().manual_seed(batch_seed(self.seed, epoch, self.rank, position))
            boxes = random_resized_boxes(sizes, generator)
            if self.flip:
                flips = torch.rand(len(encoded), generator=generator) < 0.5
        else:
            boxes = center_boxes(sizes, self.resize, self.crop)
        batch = EncodedBatch([e.data for e in encoded], [e.on_cpu for e in encoded], [e.path for e in encoded], boxes, flips)
        return batch, labels
