"""The seeds' augmentations for in-memory sets, built from the dataset config: per sample with
torchvision (PIL, in DataLoader workers, ending in uint8), or per batch where the set is held; and
ToDevice, which every loader's batch ends in on the training device. (Image files: data/file_batches.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from config.schema import AutoAugment, DatasetConfig


def resize_options(cfg: DatasetConfig) -> dict[str, Any]:
    """The keys that ask for ImageNet-style transforms, those that are set."""
    keys = ("resize", "val_resize", "train_crop", "val_crop")
    return {key: getattr(cfg, key) for key in keys if getattr(cfg, key) is not None}


def per_image_options(cfg: DatasetConfig) -> dict[str, Any]:
    """The training augmentations that only the per-image (DataLoader) path has, those that are on."""
    options = {"auto_augment": cfg.auto_augment.name if cfg.auto_augment else None, "random_erase": cfg.random_erase}
    return {key: value for key, value in options.items() if value}


def sample_transform(cfg: DatasetConfig, train: bool) -> Callable:
    """Small-image transforms, or ImageNet-style ones when the config resizes (`dataset.resize`:
    seed 001 fine-tunes an ImageNet ResNet on CIFAR-10 at 224 px). Either ends in a uint8 tensor:
    the training device normalises it (ToDevice)."""
    return imagenet_transform(cfg, train) if resize_options(cfg) else small_image_transform(cfg, train)


def small_image_transform(cfg: DatasetConfig, train: bool) -> Callable:
    """CIFAR-10 / MNIST: [RandomCrop(size, padding), RandomHorizontalFlip, auto_augment] for
    training, then PILToTensor and [RandomErasing]."""
    from torchvision import transforms as T

    steps = []
    if train and cfg.augment.crop_padding:
        steps.append(T.RandomCrop(cfg.image_size, padding=cfg.augment.crop_padding))
    if train and cfg.augment.flip:
        steps.append(T.RandomHorizontalFlip())
    return T.Compose([*steps, *policy(cfg, train), T.PILToTensor(), *erase(cfg, train)])


def imagenet_transform(cfg: DatasetConfig, train: bool) -> Callable:
    """ImageNet-style, as torchvision's presets: RandomResizedCrop(train_crop) + flip +
    auto_augment for training, Resize(val_resize) + CenterCrop(val_crop) to validate; the sizes
    default to image_size and resize, the keys seeds 001 and 003 set. (Image files take
    data/file_batches.py's path, which cuts the same boxes.)"""
    from torchvision import transforms as T

    if train:
        steps = [T.RandomResizedCrop(cfg.train_crop or cfg.image_size)]
        steps += [T.RandomHorizontalFlip()] if cfg.augment.flip else []
        steps += policy(cfg, train)
    else:
        steps = [T.Resize(cfg.val_resize or cfg.resize), T.CenterCrop(cfg.val_crop or cfg.image_size)]
    return T.Compose([*steps, T.PILToTensor(), *erase(cfg, train)])


def policy(cfg: DatasetConfig, train: bool) -> list[Callable]:
    """dataset.auto_augment, bilinear as torchvision's reference; the policies' own defaults are
    the reference's settings (RandAugment magnitude 9, AugMix severity 3). PIL or uint8 tensors."""
    from torchvision.transforms import InterpolationMode, autoaugment

    if not train or cfg.auto_augment is None:
        return []
    policy = {
        AutoAugment.ta_wide: autoaugment.TrivialAugmentWide,
        AutoAugment.ra: autoaugment.RandAugment,
        AutoAugment.augmix: autoaugment.AugMix,
    }[cfg.auto_augment]
    return [policy(interpolation=InterpolationMode.BILINEAR)]


def erase(cfg: DatasetConfig, train: bool) -> list[Callable]:
    """RandomErasing on the uint8 image, filled with the mean colour: what torchvision's zeros are
    once normalised (it erases after Normalize)."""
    from torchvision import transforms as T

    if not (train and cfg.random_erase):
        return []
    fill = [round(255 * m) for m in cfg.mean] if cfg.mean is not None else 0
    return [T.RandomErasing(p=cfg.random_erase, value=fill)]


class ToDevice:
    """The end of every loader: a batch of stored values (uint8 0..255, or synthetic's floats)
    moved to the training device and made the network's input there, once: float32, divided by
    `scale`, normalised by (mean, std). Moving uint8 moves a quarter of float32's bytes."""

    def __init__(self, cfg: DatasetConfig, scale: float, device: torch.device) -> None:
        self.device = device
        mean, std = cfg.mean or [0.0] * cfg.channels, cfg.std or [1.0] * cfg.channels
        # (x / scale - mean) / std as one subtraction and one multiplication
        self.shift = (torch.tensor(mean) * scale).view(1, -1, 1, 1).to(device)
        self.factor = 1 / (torch.tensor(std) * scale).view(1, -1, 1, 1).to(device)
        self.identity = scale == 1 and cfg.mean is None and cfg.std is None  # synthetic: the network's input

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.identity:
            return x, y
        # In place on the batch, which is the loader's own; converting first is twice as fast on a
        # CPU as subtracting from uint8.
        return x.float().sub_(self.shift).mul_(self.factor), y


class BatchTransform:
    """small_image_transform's crop (zero padding) and flip for a whole batch where it is held,
    drawn from an explicit generator instead of per sample, on the stored dtype (ToDevice then
    normalises)."""

    def __init__(self, cfg: DatasetConfig) -> None:
        self.padding = cfg.augment.crop_padding
        self.flip = cfg.augment.flip

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """`generator` None: validation, unchanged."""
        if generator is not None and (self.padding or self.flip):
            return random_crop_flip(images, self.padding, self.flip, generator)
        return images


def random_crop_flip(images: torch.Tensor, padding: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Each image shifted by its own offset in [-padding, padding]² (zeros shifted in) and, if
    `flip`, mirrored left-right with probability 1/2: one gather over the padded batch, which
    is faster on CPU than indexing with per-pixel row and column tensors."""
    n, c, h, w = images.shape
    device = images.device
    top = torch.randint(0, 2 * padding + 1, (n, 1, 1), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (n, 1, 1), generator=generator, device=device)
    columns = torch.arange(w, device=device).expand(n, 1, w)
    if flip:
        mirrored = torch.rand(n, 1, 1, generator=generator, device=device) < 0.5
        columns = torch.where(mirrored, w - 1 - columns, columns)
    width = w + 2 * padding
    rows = top + torch.arange(h, device=device).view(1, h, 1)
    index = (rows * width + left + columns).view(n, 1, h * w)  # into each padded plane, flattened
    padded = F.pad(images, (padding,) * 4) if padding else images
    return padded.flatten(2).gather(2, index.expand(n, c, h * w)).view(n, c, h, w)
