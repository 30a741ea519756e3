"""data.decode: where an image file's JPEG bytes become pixels.

`cpu`: PIL in DataLoader workers, which hand over uint8 crops. `gpu`: workers only read the files
(data/files.py); the training process decodes each batch on its device with nvJPEG
(`torchvision.io.decode_jpeg(list, device="cuda")`), cuts and resizes each image there, flips and
normalises the batch. On a CPU run `gpu` does all of this in the training process on the CPU,
which is how the path is tested without a GPU. `auto` is `gpu` where the training device is CUDA
and the dataset reads image files, unless an augmentation only the CPU path has is on.
"""
from __future__ import annotations

import logging
from collections import Counter
from types import ModuleType

import torch

from config.schema import DatasetConfig, DataConfig, Decode
from data.crops import flip, resized_crops
from data.files import Boxes, EncodedBatch, EncodedFiles, Positioned
from data.sample_loader import Split
from data.transforms import ToDevice, per_image_options
from errors import ConfigError

log = logging.getLogger("train")


def check(module: ModuleType, dataset: DatasetConfig, data: DataConfig) -> None:
    """The combinations data.decode=gpu cannot serve, each refused in one line."""
    if data.decode != Decode.gpu:
        return
    if not hasattr(module, "image_files"):
        raise ConfigError(
            f"data.decode=gpu decodes image files, which dataset={dataset.name} does not hold; use data.decode=auto"
        )
    for key, value in per_image_options(dataset).items():
        off = "0" if key == "random_erase" else "null"
        raise ConfigError(
            f"data.decode=gpu cuts and flips on the device, but dataset.{key}={value} is a per-image transform of "
            f"the CPU path; use data.decode=cpu, or dataset.{key}={off}"
        )
    if dataset.channels != 3:
        raise ConfigError(
            f"data.decode=gpu decodes to RGB, but dataset.channels={dataset.channels}; use data.decode=cpu, or "
            "dataset.channels=3"
        )


def on_device(module: ModuleType, dataset: DatasetConfig, data: DataConfig, device: torch.device) -> bool:
    """Whether this run decodes its images on the training device (data.decode resolved)."""
    if data.decode != Decode.auto:
        return data.decode == Decode.gpu
    return device.type == "cuda" and hasattr(module, "image_files") and not per_image_options(dataset)


def splits(module: ModuleType, dataset: DatasetConfig, device: torch.device, seed: int, rank: int) -> tuple[Split, Split]:
    """The training and validation splits of a data.decode=gpu run: files read in workers, cut
    on the device to train_crop (validation: val_resize then val_crop)."""
    train, val = (EncodedFiles(samples) for samples in module.image_files(dataset))
    finish = ToDevice(dataset, 255, device)
    return (
        Split(Positioned(train), DecodeOnDevice(dataset.train_crop or dataset.image_size, finish, "training"),
              Boxes(dataset, True, seed, rank)),
        Split(val, DecodeOnDevice(dataset.val_crop or dataset.image_size, finish, "validation"),
              Boxes(dataset, False, seed, rank)),
    )


class DecodeOnDevice:
    """The to_device of a data.decode=gpu loader: an EncodedBatch decoded, cut to `size` x `size`,
    flipped and normalised on the training device, in batched calls.

    Files the workers decoded on the CPU are counted in `cpu_decoded` (by why) and the first is
    logged, once per loader."""

    def __init__(self, size: int, finish: ToDevice, split: str) -> None:
        self.size, self.finish, self.split = size, finish, split
        self.cpu_decoded: Counter[str] = Counter()

    def __call__(self, batch: EncodedBatch, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.finish.device
        jpegs = [i for i, why in enumerate(batch.on_cpu) if why is None]
        images = [image.to(device, non_blocking=True) if why else image for image, why in zip(batch.images, batch.on_cpu)]
        for i, decoded in zip(jpegs, decode_jpegs([batch.images[i] for i in jpegs], [batch.paths[i] for i in jpegs], device)):
            images[i] = decoded
        if len(jpegs) < len(images):
            self._count(batch)
        x = flip(resized_crops(images, batch.boxes, self.size), batch.flips)
        return self.finish(x, labels)

    def _count(self, batch: EncodedBatch) -> None:
        first = not self.cpu_decoded
        self.cpu_decoded.update(why for why in batch.on_cpu if why)
        if first:
            path, why = next((p, w) for p, w in zip(batch.paths, batch.on_cpu) if w)
            log.info("data.decode=gpu: %s is a %s, decoded on the CPU instead; so is every %s file that is not a "
                     "baseline colour JPEG (logged once)", path, why, self.split)


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
