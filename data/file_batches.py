"""The worker side of an image-file dataset: each file read and its header looked at, then each
batch's boxes drawn at once (as torchvision's RandomResizedCrop, or Resize + CenterCrop) and, by
data.decode:

- `cpu` (DecodeHere): every image decoded and cut here, in the worker, to a uint8 batch: JPEGs by
  libjpeg-turbo through torchvision.io, at a DCT scale with PIL's draft() where the box is at least
  twice its output, other files by PIL;
- `gpu` (ForDevice): the bytes handed on for the training device to decode and cut (data/decode.py);
  a file nvJPEG should not take is decoded and cut here, as data.decode=cpu does.

Both paths draw the same boxes and flips for the same (seed, epoch, rank, position).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from config.schema import DatasetConfig
from data.crops import batch_seed, center_boxes, cut, random_resized_boxes
from errors import ConfigError

_END_OF_IMAGE = b"\xff\xd9"


@dataclass
class Encoded:
    """One image file, read but not decoded."""

    data: torch.Tensor  # the file's bytes, 1-D uint8
    height: int
    width: int
    why: str | None  # why nvJPEG should not decode it ("CMYK JPEG", ...); None: a baseline colour JPEG
    path: str


@dataclass
class EncodedBatch:
    """A data.decode=gpu batch as a worker hands it on."""

    images: list[torch.Tensor]  # a JPEG's bytes (1-D uint8), or, where `on_cpu` says why, its cut (3 x S x S uint8)
    on_cpu: list[str | None]
    paths: list[str]
    boxes: torch.Tensor  # n x 4 int64: top, left, height, width in the full image
    flips: torch.Tensor  # n bool: mirror after cutting


def read(path: str) -> Encoded:
    """The file's bytes, size, and whether nvJPEG should take it. A file whose header PIL cannot
    read stops the run in one line naming it, as a file it cannot decode does (decode_here)."""
    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as image:  # parses the header only
            return Encoded(
                torch.frombuffer(bytearray(data), dtype=torch.uint8),
                image.height,
                image.width,
                cpu_only(image, data),
                path,
            )
    except OSError as e:  # PIL's UnidentifiedImageError is an OSError too
        why = "not an image file PIL knows" if isinstance(e, UnidentifiedImageError) else e  # its text names a BytesIO
        raise ConfigError(f"{path}: unreadable image ({why}); delete or replace it") from None
    except Image.DecompressionBombError as e:  # no OSError: PIL refuses the header of a huge image (a scan, a panorama)
        raise ConfigError(f"{path}: too large to decode ({e}); replace it with a smaller copy, or delete it") from None


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


def decode_here(encoded: Encoded, box: Sequence[int], size: int, grey: bool = False) -> torch.Tensor:
    """The image's box, resized to 3 x size x size uint8 (`grey`: 1 x size x size), decoded on this
    CPU no larger than needed."""
    from torchvision.io import ImageReadMode, decode_jpeg

    top, left, h, w = box
    factor = 8  # PIL's draft() scales a JPEG by 1/2, 1/4 or 1/8 in the DCT domain
    while factor > 1 and factor * size > min(h, w):
        factor //= 2
    mode = "L" if grey else "RGB"
    try:
        if factor == 1 and encoded.why is None:
            return cut(decode_jpeg(encoded.data, mode=ImageReadMode.GRAY if grey else ImageReadMode.RGB), box, size)
        with Image.open(io.BytesIO(encoded.data.numpy().tobytes())) as image:
            if factor > 1 and image.draft(mode, (image.width // factor, image.height // factor)) is None:
                factor = 1  # not a JPEG: decoded whole
            # PIL's resize takes the box in fractions of a pixel, which the scaled box needs.
            scaled = (left / factor, top / factor, (left + w) / factor, (top + h) / factor)
            crop = image.convert(mode).resize((size, size), Image.BILINEAR, box=scaled)
    except (OSError, RuntimeError) as e:  # PIL's errors, and torchvision.io's
        raise ConfigError(f"{encoded.path}: unreadable image ({e}); delete or replace it") from None
    pixels = torch.from_numpy(np.asarray(crop).copy())
    return pixels[None] if grey else pixels.permute(2, 0, 1)


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
    carries where it falls in this rank's epoch, which seeds its batch's boxes (Boxes)."""

    def __init__(self, dataset: EncodedFiles) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int, int]) -> tuple[Encoded, int, int, int]:
        index, epoch, position = item
        return (*self.dataset[index], epoch, position)


@dataclass
class Drawn:
    """A batch's images and where each is cut."""

    encoded: list[Encoded]
    labels: torch.Tensor
    boxes: torch.Tensor  # n x 4 int64
    flips: torch.Tensor  # n bool
    generator: torch.Generator | None  # training: the batch's, for whatever else it draws


class Boxes:
    """Training: RandomResizedCrop's boxes and the flips, drawn for a whole batch from a generator
    seeded by (seed, epoch, rank, the batch's first position), so a resumed epoch, any number of
    workers, and either data.decode, see the same crops. Validation: Resize + CenterCrop's box."""

    def __init__(self, cfg: DatasetConfig, train: bool, seed: int, rank: int) -> None:
        self.train, self.flip, self.seed, self.rank = train, cfg.augment.flip, seed, rank
        self.resize, self.crop = cfg.val_resize or cfg.resize, cfg.val_crop or cfg.image_size
        self.size = (cfg.train_crop or cfg.image_size) if train else self.crop

    def draw(self, samples: list[tuple[Any, ...]]) -> Drawn:
        encoded, labels = [s[0] for s in samples], torch.tensor([s[1] for s in samples])
        sizes = torch.tensor([[e.height, e.width] for e in encoded])
        flips = torch.zeros(len(encoded), dtype=torch.bool)
        if not self.train:
            return Drawn(encoded, labels, center_boxes(sizes, self.resize, self.crop), flips, None)
        _, _, epoch, position = samples[0]
        generator = torch.Generator().manual_seed(batch_seed(self.seed, epoch, self.rank, position))
        boxes = random_resized_boxes(sizes, generator)
        if self.flip:
            flips = torch.rand(len(encoded), generator=generator) < 0.5
        return Drawn(encoded, labels, boxes, flips, generator)


class DecodeHere:
    """data.decode=cpu's collate: the batch decoded, cut, flipped and augmented in the worker, as
    n x 3 x S x S uint8. `augment` (dataset.auto_augment, dataset.random_erase) runs per image on
    torch's global stream, seeded from the batch's generator for the while."""

    def __init__(self, boxes: Boxes, augment: Sequence[Callable[[torch.Tensor], torch.Tensor]] = ()) -> None:
        self.boxes, self.augment = boxes, augment

    def __call__(self, samples: list[tuple[Any, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = self.boxes.draw(samples)
        crops = [decode_here(e, box, self.boxes.size) for e, box in zip(drawn.encoded, drawn.boxes.tolist())]
        crops = torch.stack([crop.flip(2) if mirrored else crop for crop, mirrored in zip(crops, drawn.flips.tolist())])
        if self.augment and drawn.generator is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(2**62, (1,), generator=drawn.generator)))
                crops = torch.stack([_applied(self.augment, crop) for crop in crops])
        return crops, drawn.labels


def _applied(steps: Sequence[Callable[[torch.Tensor], torch.Tensor]], image: torch.Tensor) -> torch.Tensor:
    for step in steps:
        image = step(image)
    return image


class ForDevice:
    """data.decode=gpu's collate: the batch as an EncodedBatch; what nvJPEG should not take is
    decoded and cut here (decode_here), flipped later with the rest."""

    def __init__(self, boxes: Boxes) -> None:
        self.boxes = boxes

    def __call__(self, samples: list[tuple[Any, ...]]) -> tuple[EncodedBatch, torch.Tensor]:
        drawn = self.boxes.draw(samples)
        images = [
            e.data if e.why is None else decode_here(e, box, self.boxes.size)
            for e, box in zip(drawn.encoded, drawn.boxes.tolist())
        ]
        whys, paths = [e.why for e in drawn.encoded], [e.path for e in drawn.encoded]
        return EncodedBatch(images, whys, paths, drawn.boxes, drawn.flips), drawn.labels
