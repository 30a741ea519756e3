"""What the run tells people: console and train.log, TensorBoard, metrics.json. Rank 0 only."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from config.schema import LoggerConfig
from distributed.context import DistContext
from distributed.strategies import gathers_in_forward, unwrap

log = logging.getLogger("train")

_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def configure_logging(ctx: DistContext, run_dir: Path) -> None:
    """Rank 0 speaks at INFO to the console and train.log; other ranks only warn, with their rank.

    Hydra sets up logging in the process it starts; spawned ranks begin with none.
    """
    root = logging.getLogger()
    if ctx.is_main:
        if not root.handlers:
            root.setLevel(logging.INFO)
            for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(run_dir / "train.log")):
                handler.setFormatter(logging.Formatter(_FORMAT))
                root.addHandler(handler)
        return
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[rank {ctx.rank}]{_FORMAT}"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


# The final figures that TensorBoard's HParams tab sets against each job's options.
HPARAM_METRICS = ("val_acc", "best_val_acc", "train_samples_per_s", "wall_s")


class Reporter:
    """TensorBoard scalars, hparams and sample images (logger=tensorboard), and the final
    metrics.json; silent on every rank but 0."""

    def __init__(self, ctx: DistContext, run_dir: Path, logger: LoggerConfig) -> None:
        self.is_main = ctx.is_main
        self.enabled = ctx.is_main and logger.tensorboard  # TensorBoard
        self.run_dir = run_dir
        self.device = ctx.device
        self.sample_images = logger.sample_images
        self.main_draws = logger.tensorboard and logger.sample_images > 0  # rank 0 draws sample predictions
        self._writer = None
        self._samples: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter  # lazy: ~1 s of imports

            self._writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.enabled:
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, step)

    @torch.no_grad()
    def samples(self, step: int, model: nn.Module, loader: Any) -> None:
        """A grid of the same validation images each epoch, captioned predicted / true label."""
        # FSDP: rank 0's forward all-gathers parameters, so every rank must run one with it.
        joins = self.main_draws and gathers_in_forward(model)
        if not (self.enabled and self.sample_images or joins):
            return
        if self._samples is None:
            self._samples = _first_samples(loader, self.sample_images)
        images, targets = self._samples
        if not (len(images) or joins):
            return
        net = unwrap(model)
        training = net.training
        net.eval()
        predicted = net(images.to(self.device)).argmax(dim=1).cpu()
        net.train(training)
        if self.enabled:
            self._writer.add_image("val/samples", sample_grid(images, predicted, targets), step, dataformats="HWC")

    def hparams(self, options: dict[str, Any], metrics: dict[str, Any]) -> None:
        """One row in the HParams tab: this job's options against its final figures."""
        if not self.enabled:
            return
        from torch.utils.tensorboard.summary import hparams

        final = {f"final/{key}": metrics[key] for key in HPARAM_METRICS if key in metrics}
        # SummaryWriter.add_hparams would open a second writer in a timestamped subdirectory, which
        # TensorBoard shows as a run of its own; written here, a sweep shows one run per job.
        for summary in hparams({k: v for k, v in options.items() if v is not None}, final):
            self._writer.file_writer.add_summary(summary, metrics.get("steps"))
        self.scalars(metrics.get("steps", 0), final)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        """One JSON object on one line: sweep reports read one file per run."""
        if self.is_main:
            (self.run_dir / "metrics.json").write_text(json.dumps(metrics) + "\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _first_samples(loader: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, targets = [], []
    for x, y in loader:
        images.append(x)
        targets.append(y)
        if sum(len(t) for t in targets) >= n:
            break
    if not images:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    # data.loader=device serves batches already on the GPU; the grid is drawn with PIL on the host.
    return torch.cat(images)[:n].cpu(), torch.cat(targets)[:n].cpu()


def sample_grid(images: torch.Tensor, predicted: torch.Tensor, targets: torch.Tensor, tile: int = 96) -> np.ndarray:
    """An HWC uint8 grid: each image scaled to its own min..max, captioned green when right, red when wrong."""
    from PIL import Image, ImageDraw

    columns = min(len(images), 4)
    rows = -(-len(images) // columns)
    caption, gap = 14, 2
    grid = Image.new("RGB", (columns * (tile + gap) - gap, rows * (tile + caption)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (image, p, t) in enumerate(zip(images.float(), predicted.tolist(), targets.tolist())):
        # Per-image min-max undoes any normalisation well enough to look at, whatever the dataset.
        low, high = image.min(), image.max()
        pixels = ((image - low) / (high - low).clamp_min(1e-8) * 255).to(torch.uint8)
        if pixels.shape[0] == 1:
            pixels = pixels.expand(3, -1, -1)
        tile_image = Image.fromarray(pixels.permute(1, 2, 0).numpy()).resize((tile, tile), Image.NEAREST)
        x, y = (i % columns) * (tile + gap), (i // columns) * (tile + caption)
        grid.paste(tile_image, (x, y))
        draw.text((x + 2, y + tile + 1), f"pred {p} / true {t}", fill=(0, 140, 0) if p == t else (200, 0, 0))
    return np.asarray(grid)
