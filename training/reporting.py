"""What the run tells people: console and train.log, TensorBoard, metrics.json. Rank 0 only."""
from __future__ import annotations

import functools
import io
import json
import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import google_crc32c
import numpy as np
import torch
from torch import nn

from config.schema import LoggerConfig
from data import Loaders
from distributed.context import DistContext
from distributed.strategies import gathers_in_forward, unwrap

if TYPE_CHECKING:
    from PIL import Image, ImageFont
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

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


# The figures TensorBoard's HParams tab sets against each job's options: tag -> column title.
# TensorBoard takes a metric's value from the last point of the scalar series of its tag (there is no
# other source), so each is a series the trainer writes every epoch: no one-point charts.
HPARAM_METRICS = {
    "val/acc": "final val acc",
    "val/best_acc": "best val acc",
    "val/loss": "final val loss",
    "throughput/samples_per_s": "samples/s (last epoch)",
    "time/train_s": "training time (s)",
}


class Reporter:
    """TensorBoard scalars, hparams and sample images (logger=tensorboard), and the final
    metrics.json; silent on every rank but 0."""

    def __init__(self, ctx: DistContext, run_dir: Path, logger: LoggerConfig, background: bool = True) -> None:
        """`background`: make TensorBoard's writer on a thread beside the first steps. Not where the
        loaders fork worker processes: a fork while that thread imports (tensorboard, protobuf's C
        extension) hands the child the import and dynamic-loader locks that thread held, and a child
        that needs one waits forever (os.fork's documentation: forking a multi-threaded process)."""
        self.is_main = ctx.is_main
        self.enabled = ctx.is_main and logger.tensorboard  # TensorBoard
        self.run_dir = run_dir
        self.device = ctx.device
        self.sample_images = logger.sample_images
        self.main_draws = logger.tensorboard and logger.sample_images > 0  # rank 0 draws sample predictions
        self._samples: tuple[torch.Tensor, SampleGrid | None] | None = None
        self._made: SummaryWriter | None = None
        self._making: threading.Thread | None = None
        if self.enabled and background:
            # TensorBoard's imports take ~0.1 s: made beside the first steps (whose kernels release
            # the GIL), not before them; the first write waits for it.
            self._making = threading.Thread(target=self._make_writer, name="tensorboard", daemon=True)
            self._making.start()
        elif self.enabled:
            self._make_writer()

    def _make_writer(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        checksum_records_in_c()
        self._made = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    @property
    def _writer(self) -> SummaryWriter:
        if self._making is not None:
            self._making.join()
            self._making = None
        if self._made is None:
            raise RuntimeError("TensorBoard's writer could not be made (see the tensorboard thread's error above)")
        return self._made

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
            images, targets = _first_samples(loader, self.sample_images)
            self._samples = images, SampleGrid(images, targets) if self.enabled and len(images) else None
        images, grid = self._samples
        if not (len(images) or joins):
            return
        net = unwrap(model)
        training = net.training
        net.eval()
        predicted = net(images.to(self.device)).argmax(dim=1).cpu()
        net.train(training)
        if grid is not None:
            self._writer.file_writer.add_summary(grid.summary("val/samples", predicted), step)

    def hparams(self, options: dict[str, Any], metrics: dict[str, Any], swept: dict[str, Any] | None = None) -> None:
        """One row in the HParams tab: this job's options against its final figures.

        `swept`: the job's command-line overrides, {key: value} (`swept_overrides`): they head the
        columns, under the option's name where they set one (optimizer.lr is lr).
        """
        if not self.enabled:
            return
        from torch.utils.tensorboard.summary import hparams

        values, heading = hparam_values(options, swept or {})
        step = metrics.get("steps", 0)
        _, start, end = hparams(values, {})  # the session's start and end, as torch writes them
        # SummaryWriter.add_hparams would open a second writer in a timestamped subdirectory, which
        # TensorBoard shows as a run of its own; written here, a sweep shows one run per job.
        for summary in (experiment_summary(values, heading), start, end):
            self._writer.file_writer.add_summary(summary, step)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        """One JSON object on one line: sweep reports read one file per run."""
        if self.is_main:
            (self.run_dir / "metrics.json").write_text(json.dumps(metrics) + "\n")

    def close(self) -> None:
        if self.enabled:
            self._writer.close()


def checksum_records_in_c() -> None:
    """TensorBoard's writer checksums every record with a pure-Python CRC-32C: ~0.1 ms a KB, on its
    writer thread, holding the GIL against the training steps (a 74 KB sample grid each epoch cost
    a 1,040-step simple_cnn run ~1 s of 12; BENCHMARKS.md). google-crc32c computes it in C."""
    from tensorboard.summary.writer import record_writer

    if google_crc32c.implementation == "c":  # its fallback is pure Python too
        record_writer.masked_crc32c = masked_crc32c


def masked_crc32c(data: bytes) -> int:
    """A TFRecord's masked CRC-32C of `data`, as tensorboard.compat.tensorflow_stub computes it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


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
    """An HWC uint8 grid of the same images each epoch, each scaled to its own min..max and captioned
    predicted / true label, green when right, red when wrong.

    The tiles are drawn once, a caption only when its prediction changes, and the PNG encoded only
    when a caption did: redrawing the whole grid took ~2 ms an epoch, encoding it ~2 ms, and once a
    model has learnt its samples most epochs change no caption. A caption is cut at its tile's width."""

    CAPTION, GAP = 14, 2

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, tile: int = 96) -> None:
        from PIL import Image

        # Per-image min-max undoes any normalisation well enough to look at, whatever the dataset.
        values = images.float()
        low, high = values.amin(dim=(1, 2, 3), keepdim=True), values.amax(dim=(1, 2, 3), keepdim=True)
        pixels = ((values - low) / (high - low).clamp_min(1e-8) * 255).to(torch.uint8)
        pixels = pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels
        self.tile, self.targets = tile, targets.tolist()
        self.columns = min(len(images), 4)
        rows = -(-len(images) // self.columns)
        self._grid = Image.new("RGB", (self.columns * (tile + self.GAP) - self.GAP, rows * (tile + self.CAPTION)), "white")
        for i, hwc in enumerate(pixels.permute(0, 2, 3, 1).numpy()):
            self._grid.paste(Image.fromarray(hwc).resize((tile, tile), Image.NEAREST), self._corner(i))
        self._shown: list[int | None] = [None] * len(images)
        self._summary: Summary | None = None  # of the grid as last drawn

    def summary(self, tag: str, predicted: torch.Tensor) -> Summary:
        """The grid's image summary for these predictions (a grid is written under one tag)."""
        if self._summary is None or predicted.tolist() != self._shown:
            self._summary = image_summary(tag, self.draw(predicted))
        return self._summary

    def draw(self, predicted: torch.Tensor) -> np.ndarray:
        for i, (p, t) in enumerate(zip(predicted.tolist(), self.targets)):
            if p == self._shown[i]:
                continue
            x, y = self._corner(i)
            self._grid.paste(_caption(p, t, self.tile, self.CAPTION), (x, y + self.tile))
            self._shown[i] = p
        return np.asarray(self._grid)  # a copy: later epochs' captions do not reach it

    def _corner(self, i: int) -> tuple[int, int]:
        return (i % self.columns) * (self.tile + self.GAP), (i // self.columns) * (self.tile + self.CAPTION)


@functools.lru_cache(maxsize=256)
def _caption(predicted: int, target: int, width: int, height: int) -> Image.Image:
    """A caption tile, drawn once per (predicted, true) pair: drawing text costs ~0.1 ms, and
    ImageDraw loads its default font afresh for every new Draw (as much again)."""
    from PIL import Image, ImageDraw

    caption = Image.new("RGB", (width, height), "white")
    colour = (0, 140, 0) if predicted == target else (200, 0, 0)
    ImageDraw.Draw(caption).text((2, 1), f"pred {predicted} / true {target}", fill=colour, font=_font())
    return caption


@functools.cache
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from PIL import ImageFont

    return ImageFont.load_default()


def image_summary(tag: str, hwc: np.ndarray) -> Summary:
    """TensorBoard's image summary, as SummaryWriter.add_image makes it but PNG-encoded at zlib
    level 1: a grid a third of add_image's time (its level 6), for a file a few % larger."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    png = io.BytesIO()
    Image.fromarray(hwc).save(png, format="PNG", compress_level=1)
    height, width, channels = hwc.shape
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=png.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def hparam_values(options: dict[str, Any], swept: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The HParams of a job, overrides first, and the names the overrides took.

    An override that sets one of the options shows as that option (model, optimizer.lr as lr,
    trainer.devices as devices), with its value; any other shows under its own key.
    """
    values: dict[str, Any] = {}
    for key, value in swept.items():
        name = _option_name(key, options)
        values[name] = options[name] if name in options else value
    values.update((k, v) for k, v in options.items() if k not in values)
    return {k: v for k, v in values.items() if v is not None}, [_option_name(k, options) for k in swept]


def _option_name(key: str, options: dict[str, Any]) -> str:
    section, _, leaf = key.rpartition(".")
    return leaf if key not in options and section in ("trainer", "optimizer") and leaf in options else key


def experiment_summary(values: dict[str, Any], swept: Sequence[str]) -> Any:
    """TensorBoard's experiment for the HParams tab: every hparam, the overrides flagged as differing
    (TensorBoard lists those first), and HPARAM_METRICS with their titles."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    def data_type(value: Any) -> int:
        if isinstance(value, bool):
            return api_pb2.DATA_TYPE_BOOL
        return api_pb2.DATA_TYPE_FLOAT64 if isinstance(value, (int, float)) else api_pb2.DATA_TYPE_STRING

    experiment = api_pb2.Experiment(
        hparam_infos=[api_pb2.HParamInfo(name=name, type=data_type(value), differs=name in swept)
                      for name, value in values.items()],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=title)
                      for tag, title in HPARAM_METRICS.items()],
    )
    content = plugin_data_pb2.HParamsPluginData(experiment=experiment, version=metadata.PLUGIN_DATA_VERSION)
    plugin_data = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
    value = Summary.Value(tag=metadata.EXPERIMENT_TAG, metadata=SummaryMetadata(plugin_data=plugin_data))
    return Summary(value=[value])
