"""Where each image of a batch is cut, as torchvision's RandomResizedCrop and Resize + CenterCrop
cut one, drawn for the whole batch at once from an explicit generator; and the cut itself: in a
worker, on uint8 (data.decode=cpu), or on whatever device holds the decoded images (data.decode=gpu's
training device; the CPU in tests).

A box is (top, left, height, width) in the full image's pixels, as RandomResizedCrop.get_params
returns it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults, which torchvision's recipes keep
TRIES = 10  # RandomResizedCrop's tries before its central fallback


def batch_seed(seed: int, epoch: int, rank: int, position: int) -> int:
    """The crops of the batch that starts at `position` of this rank's epoch: fixed by where it
    falls, not by which worker draws it or whether earlier batches were drawn (a resumed epoch)."""
    return int(np.random.SeedSequence([seed, epoch, rank, position]).generate_state(1)[0])


def random_resized_boxes(
    sizes: torch.Tensor,
    generator: torch.Generator,
    scale: Sequence[float] = SCALE,
    ratio: Sequence[float] = RATIO,
) -> torch.Tensor:
    """RandomResizedCrop.get_params for each (height, width) row of `sizes`: n x 4 int64 boxes.

    torchvision tries up to 10 (area, aspect) draws and keeps the first that fits; drawing all 10
    at once and keeping the first that fits gives each image the same distribution. An image where
    none fits gets torchvision's fallback: the central crop of the nearest allowed aspect."""
    n = len(sizes)
    height, width = sizes[:, :1].double(), sizes[:, 1:].double()
    area = height * width * torch.empty(n, TRIES, dtype=torch.float64).uniform_(scale[0], scale[1], generator=generator)
    log_aspect = torch.empty(n, TRIES, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator
    )
    aspect = log_aspect.exp()
    w, h = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.byte().argmax(dim=1, keepdim=True)
    w, h = w.gather(1, first), h.gather(1, first)
    fallback_h, fallback_w = _central_fallback(height, width, ratio)
    found = fits.any(dim=1, keepdim=True)
    h, w = torch.where(found, h, fallback_h), torch.where(found, w, fallback_w)
    offsets = torch.rand(n, 2, dtype=torch.float64, generator=generator)
    top = torch.where(found, (offsets[:, :1] * (height - h + 1)).floor(), ((height - h) / 2).floor())
    left = torch.where(found, (offsets[:, 1:] * (width - w + 1)).floor(), ((width - w) / 2).floor())
    return torch.cat([top, left, h, w], dim=1).long()


def _central_fallback(
    height: torch.Tensor, width: torch.Tensor, ratio: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole image, cut to the nearest aspect in `ratio` (RandomResizedCrop's last resort)."""
    low, high = min(ratio), max(ratio)
    in_ratio = width / height
    h = torch.where(in_ratio < low, (width / low).round(), height)
    w = torch.where(in_ratio > high, (height * high).round(), width)
    return h, w


def center_boxes(sizes: torch.Tensor, resize: int, crop: int) -> torch.Tensor:
    """Resize(resize) (the shorter side to `resize`) then CenterCrop(crop), as one box of each full
    image: cutting that box and resizing it to crop x crop is the same picture in one step."""
    height, width = sizes[:, :1].double(), sizes[:, 1:].double()
    short, long = torch.minimum(height, width), torch.maximum(height, width)
    new_long = (resize * long / short).floor()  # torchvision truncates the longer side
    new_h = torch.where(height <= width, torch.full_like(height, resize), new_long)
    new_w = torch.where(height <= width, new_long, torch.full_like(width, resize))
    crop_top, crop_left = ((new_h - crop) / 2).round(), ((new_w - crop) / 2).round()
    # Back to the full image's pixels; a crop larger than the resized image keeps the whole image.
    top, left = (crop_top * height / new_h).round().clamp(min=0), (crop_left * width / new_w).round().clamp(min=0)
    h = (crop * height / new_h).round().clamp(1, None).minimum(height - top)
    w = (crop * width / new_w).round().clamp(1, None).minimum(width - left)
    return torch.cat([top, left, h, w], dim=1).long()


def cut(image: torch.Tensor, box: Sequence[int], size: int) -> torch.Tensor:
    """The box of a C x H x W uint8 CPU image resized to C x size x size uint8, bilinear and
    antialiased as torchvision's resized_crop on tensors (torch's uint8 kernel: no float copy)."""
    top, left, h, w = box
    crop = image[None, :, top : top + h, left : left + w]
    return F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def resized_crops(images: Sequence[torch.Tensor], boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Each C x H x W image's box resized to size x size, bilinear and antialiased as torchvision's
    resized_crop on tensors: n x C x size x size float32 in the images' range (no rounding back to
    uint8: normalisation follows on the same device).

    One interpolate per image, since every box differs in size: on CPU tensors faster than
    torchvision.ops.roi_align per image, and a batched roi_align needs the images padded to the
    largest (see BENCHMARKS.md: image folders)."""
    crops = [
        F.interpolate(
            image[None, :, top : top + h, left : left + w].float(),
            size=(size, size),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )
        for image, (top, left, h, w) in zip(images, boxes.tolist())
    ]
    return torch.cat(crops)


def flip(images: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Mirror left-right the images whose `flips` entry is true."""
    if not flips.any():
        return images
    return torch.where(flips.to(images.device).view(-1, 1, 1, 1), images.flip(3), images)
