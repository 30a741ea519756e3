"""data.decode: where an image file's bytes become pixels.

`cpu`: DataLoader workers decode and cut each batch and hand over uint8 (data/file_batches.py). `gpu`:
workers only read the files and draw the boxes; the training process decodes each batch on its
device with nvJPEG (`torchvision.io.decode_jpeg(list, device="cuda")`), cuts and resizes each
image there, flips and normalises the batch. On a CPU run `gpu` does all of this in the training
process on the CPU, which is how the path is tested without a GPU. `auto` is `gpu` where the
training device is CUDA and the dataset reads image files, unless an augmentation only the CPU
path has is on.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from config.schema import DataConfig, DatasetConfig, Decode
from data import DatasetModule, ImageFiles
from data.crops import flip, resized_crops
from data.file_batches import Boxes, DecodeHere, EncodedBatch, EncodedFiles, ForDevice, Positioned
from data.sample_loader import Split
from data.transforms import ToDevice, erase, per_image_options, policy
from errors import ConfigError

log = logging.getLogger("train")


def check(module: DatasetModule, dataset: DatasetConfig, data: DataConfig) -> None:
    """What image files and data.decode=gpu cannot serve, each refused in one line."""
    if isinstance(module, ImageFiles) and dataset.channels != 3:
        raise ConfigError(
            f"dataset.channels={dataset.channels}: dataset={dataset.name} decodes its files to RGB; set dataset.channels=3"
        )
    if data.decode != Decode.gpu:
        return
    if not isinstance(module, ImageFiles):
        raise ConfigError(
            f"data.decode=gpu decodes image files, which dataset={dataset.name} does not hold; use data.decode=auto"
        )
    for key, value in per_image_options(dataset).items():
        off = "0" if key == "random_erase" else "null"
        raise ConfigError(
            f"data.decode=gpu cuts and flips on the device, but dataset.{key}={value} is a per-image transform of "
            f"the CPU path; use data.decode=cpu, or dataset.{key}={off}"
        )


def on_device(module: DatasetModule, dataset: DatasetConfig, data: DataConfig, device: torch.device) -> bool:
    """Whether this run decodes its images on the training device (data.decode resolved)."""
    if data.decode != Decode.auto:
        return data.decode == Decode.gpu
    return device.type == "cuda" and isinstance(module, ImageFiles) and not per_image_options(dataset)


def splits(
    module: ImageFiles,
    dataset: DatasetConfig,
    data: DataConfig,
    device: torch.device,
    seed: int,
    rank: int,
) -> tuple[Split, Split]:
    """The training and validation splits of an image-file dataset: files read in workers, then
    decoded and cut there (data.decode=cpu) or on the training device (gpu), to train_crop
    (validation: val_resize then val_crop)."""
    train, val = (EncodedFiles(samples) for samples in module.image_files(dataset))
    boxes = Boxes(dataset, True, seed, rank), Boxes(dataset, False, seed, rank)
    finish = ToDevice(dataset, 255, device)
    if on_device(module, dataset, data, device):
        return (
            Split(Positioned(train), DecodeOnDevice(boxes[0].size, finish, "training"), ForDevice(boxes[0])),
            Split(val, DecodeOnDevice(boxes[1].size, finish, "validation"), ForDevice(boxes[1])),
        )
    augment = [*policy(dataset, train=True), *erase(dataset, train=True)]
    return Split(Positioned(train), finish, DecodeHere(boxes[0], augment)), Split(val, finish, DecodeHere(boxes[1]))


class DecodeOnDevice:
    """The to_device of a data.decode=gpu loader: an EncodedBatch's JPEGs decoded on the training
    device in one call, each cut to its box, joined by what the workers cut, flipped and normalised.

    Files the workers decoded instead are counted in `cpu_decoded` (by why) and the first is
    logged, once per loader."""

    def __init__(self, size: int, finish: ToDevice, split: str) -> None:
        self.size, self.finish, self.split = size, finish, split
        self.cpu_decoded: Counter[str] = Counter()

    def __call__(self, batch: EncodedBatch, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.finish.device
        jpegs = [i for i, why in enumerate(batch.on_cpu) if why is None]
        decoded = decode_jpegs([batch.images[i] for i in jpegs], [batch.paths[i] for i in jpegs], device)
        if len(jpegs) == len(batch.images):
            x = resized_crops(decoded, batch.boxes, self.size)
        else:
            self._count(batch)
            x = torch.empty(len(batch.images), 3, self.size, self.size, device=device)
            from_workers = [i for i, why in enumerate(batch.on_cpu) if why]
            x[from_workers] = torch.stack([batch.images[i] for i in from_workers]).to(device, non_blocking=True).float()
            if jpegs:
                x[jpegs] = resized_crops(decoded, batch.boxes[jpegs], self.size)
        return self.finish(flip(x, batch.flips), labels)

    def _count(self, batch: EncodedBatch) -> None:
        first = not self.cpu_decoded
        self.cpu_decoded.update(why for why in batch.on_cpu if why)
        if first:
            path, why = next((p, w) for p, w in zip(batch.paths, batch.on_cpu) if w)
            log.info(
                "data.decode=gpu: %s is a %s, decoded on the CPU instead; so is every %s file that is not a "
                "baseline colour JPEG (logged once)",
                path,
                why,
                self.split,
            )


def decode_jpegs(data: list[torch.Tensor], paths: list[str], device: torch.device) -> list[torch.Tensor]:
    """3 x H x W uint8 images on `device`, decoded there in one call (nvJPEG on a GPU, libjpeg-turbo
    on the CPU). A file it cannot decode stops the run in one line naming it."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not data:
        return []
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as batch_error:
        for encoded, path in zip(data, paths):  # which one: one at a time, on the CPU
            try:
                decode_jpeg(encoded, mode=ImageReadMode.RGB)
            except RuntimeError as e:
                raise ConfigError(f"{path}: unreadable image ({e}); delete or replace it") from None
        raise batch_error
