"""logger.sample_images: a grid of the same validation images each epoch, captioned with the
model's predictions, to every logger (a Callback)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from data import Loaders
from distributed.strategies import gathers_in_forward, unwrap
from training.callbacks import Callback, RunInfo
from training.loggers.base import Logger

if TYPE_CHECKING:
    from PIL import Image, ImageFont


class SampleImages(Callback):
    """`val/samples`: the first `count` validation images, predicted / true label, each epoch.

    Rank 0 draws; under FSDP every rank runs the forward with it, since each forward gathers the
    parameters from every rank."""

    def __init__(self, count: int, model: nn.Module, loader: Any, device: torch.device) -> None:
        self.count, self.model, self.loader, self.device = count, model, loader, device
        self.loggers: Sequence[Logger] = ()
        self.joins = gathers_in_forward(model)
        self._samples: tuple[torch.Tensor, SampleGrid | None] | None = None

    def setup(self, run: RunInfo) -> None:
        self.loggers = run.loggers

    @torch.no_grad()
    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        if not (self.loggers or self.joins):
            return
        if self._samples is None:
            images, targets = _first_samples(self.loader, self.count)
            self._samples = images, SampleGrid(images, targets) if self.loggers and len(images) else None
        images, grid = self._samples
        if not (len(images) or self.joins):
            return
        net = unwrap(self.model)
        training = net.training
        net.eval()
        predicted = net(images.to(self.device)).argmax(dim=1).cpu()
        net.train(training)
        if grid is not None:
            hwc = grid.draw(predicted)
            for logger in self.loggers:
                logger.log_image(step, "val/samples", hwc)


def _first_samples(loader: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, targets = [], []
    for x, y in loader:
        images.append(Loaders.to_device(loader, x, y, torch.device("cpu"))[0])  # finished as the model sees them
        targets.append(y)
        if sum(len(t) for t in targets) >= n:
            break
    if not images:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    # data.loader=device serves batches already on the GPU; the grid is drawn with PIL on the host.
    return torch.cat(images)[:n].cpu(), torch.cat(targets)[:n].cpu()


class SampleGrid:
    """An HWC uint8 grid of the same images each epoch, four to a row, each captioned above with its
    predicted / true label, green when right, red when wrong, under a line that says which is which.

    As wide as TensorBoard's image card in its Images tab (WIDTH), and for the default 8 images
    (logger.sample_images) as tall as its Time Series card's image: both show it about pixel for
    pixel. They fit an image to their box by nearest pixel, and small text survives no scaling. The
    tiles are drawn once and a caption only when its prediction changes: once a model has learnt
    its samples most epochs change none (see BENCHMARKS.md: Default job, time to accuracy)."""

    WIDTH = 350  # the Images tab's card (tf-image-loader), its image at width 100%
    COLUMNS, TILE, GAP = 4, 78, 2  # two rows of 4 fit the Time Series card's image box, 212 px tall
    MARGIN = (WIDTH - COLUMNS * (TILE + GAP) + GAP) // 2
    CAPTION = HEADER = 18  # a caption's strip, and the legend's above the grid: 14 px text
    LEGEND = "predicted / true"

    def __init__(self, images: torch.Tensor, targets: torch.Tensor) -> None:
        from PIL import Image, ImageDraw

        # Per-image min-max undoes any normalisation well enough to look at, whatever the dataset.
        values = images.float()
        low, high = values.amin(dim=(1, 2, 3), keepdim=True), values.amax(dim=(1, 2, 3), keepdim=True)
        pixels = ((values - low) / (high - low).clamp_min(1e-8) * 255).to(torch.uint8)
        pixels = pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels
        self.targets = targets.tolist()
        rows = -(-len(images) // self.COLUMNS)
        self._grid = Image.new("RGB", (self.WIDTH, self.HEADER + rows * (self.CAPTION + self.TILE)), "white")
        ImageDraw.Draw(self._grid).text((self.MARGIN + 2, 1), self.LEGEND, fill=(80, 80, 80), font=_font())
        for i, hwc in enumerate(pixels.permute(0, 2, 3, 1).numpy()):
            x, y = self._corner(i)
            self._grid.paste(Image.fromarray(hwc).resize((self.TILE, self.TILE), Image.NEAREST), (x, y + self.CAPTION))
        self._shown: list[int | None] = [None] * len(images)

    def draw(self, predicted: torch.Tensor) -> np.ndarray:
        for i, (p, t) in enumerate(zip(predicted.tolist(), self.targets)):
            if p != self._shown[i]:
                self._grid.paste(_caption(p, t, self.TILE, self.CAPTION), self._corner(i))
                self._shown[i] = p
        return np.asarray(self._grid)  # a copy: later epochs' captions do not reach it

    def _corner(self, i: int) -> tuple[int, int]:
        """The top left of sample i's caption, its tile right below it."""
        row, column = divmod(i, self.COLUMNS)
        return self.MARGIN + column * (self.TILE + self.GAP), self.HEADER + row * (self.CAPTION + self.TILE)


@functools.lru_cache(maxsize=256)
def _caption(predicted: int, target: int, width: int, height: int) -> Image.Image:
    """A caption strip, drawn once per (predicted, true) pair: drawing text is slow (see
    BENCHMARKS.md: Default job, time to accuracy). Text past the tile's width is cut."""
    from PIL import Image, ImageDraw

    caption = Image.new("RGB", (width, height), "white")
    colour = (0, 140, 0) if predicted == target else (200, 0, 0)
    ImageDraw.Draw(caption).text((2, 1), f"{predicted} / {target}", fill=colour, font=_font())
    return caption


@functools.cache
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's own font (Aileron), at a size that reads at TensorBoard's scale of one: no system fonts needed."""
    from PIL import ImageFont

    return ImageFont.load_default(size=14)
