"""logger.tensorboard: scalars, images and the HParams row under <run dir>/tb (a Logger)."""
from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import google_crc32c
import numpy as np

from config.schema import RunConfig
from training.loggers.background import Background

if TYPE_CHECKING:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

# The figures TensorBoard's HParams tab sets against each job's options: tag -> column title.
# TensorBoard takes a metric's value from the last point of the scalar series of its tag (there is no
# other source), so each is a series the trainer writes every epoch: no one-point charts.
HPARAM_METRICS = {
    "val/acc": "final val acc",
    "val/best_acc": "best val acc",
    "val/loss": "final val loss",
    "val/ce": "final val cross-entropy",
    "throughput/samples_per_s": "samples/s (last epoch)",
    "time/train_s": "training time (s)",
}


class TensorBoardLogger:
    """logger.tensorboard: scalars, images and the HParams row under <run dir>/tb."""

    takes_images = True

    def __init__(self, job: RunConfig) -> None:
        self.run_dir, self.swept = job.run_dir, job.swept
        self._images: dict[str, tuple[np.ndarray, Summary]] = {}  # tag -> the image last encoded, its summary
        self._made: SummaryWriter | None = None
        self._making: Background | None = Background(self._make_writer, "tensorboard")  # beside the first steps

    def _make_writer(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        checksum_records_in_c()
        self._made = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    @property
    def _writer(self) -> SummaryWriter:
        if self._making is not None:
            making, self._making = self._making, None
            making.result()  # raises the thread's error
        if self._made is None:
            raise RuntimeError("TensorBoard's writer could not be made (see the error its first write raised)")
        return self._made

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step)

    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None:
        """An image equal to the last one of its tag is not encoded again: the sample grid mostly
        repeats once the model has learnt its images (see BENCHMARKS.md: Default job, time to accuracy)."""
        last = self._images.get(tag)
        if last is None or not np.array_equal(last[0], hwc):
            last = self._images[tag] = hwc.copy(), image_summary(tag, hwc)
        self._writer.file_writer.add_summary(last[1], step)

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
        """One row in the HParams tab: this job's options against its final figures. The job's
        command-line overrides (RunConfig.swept) head the columns, under the option's name where they
        set one (optimizer.lr is lr)."""
        from torch.utils.tensorboard.summary import hparams as session

        values, heading = hparam_values(dict(hparams), self.swept)
        step = metrics.get("steps", 0)
        _, start, end = session(values, {})  # the session's start and end, as torch writes them
        # SummaryWriter.add_hparams would open a second writer in a timestamped subdirectory, which
        # TensorBoard shows as a run of its own; written here, a sweep shows one run per job.
        for summary in (experiment_summary(values, heading), start, end):
            self._writer.file_writer.add_summary(summary, step)

    def close(self) -> None:
        self._writer.close()


def checksum_records_in_c() -> None:
    """TensorBoard's writer checksums every record with a pure-Python CRC-32C, on its writer thread,
    holding the GIL against the training steps (see BENCHMARKS.md: Peers, TensorBoard's checksums).
    google-crc32c computes it in C."""
    from tensorboard.summary.writer import record_writer

    if google_crc32c.implementation == "c":  # its fallback is pure Python too
        record_writer.masked_crc32c = masked_crc32c


def masked_crc32c(data: bytes) -> int:
    """A TFRecord's masked CRC-32C of `data`, as tensorboard.compat.tensorflow_stub computes it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def image_summary(tag: str, hwc: np.ndarray) -> Summary:
    """TensorBoard's image summary, as SummaryWriter.add_image makes it but PNG-encoded at zlib
    level 1 rather than its 6: faster, for a slightly larger file (see BENCHMARKS.md: Default job,
    time to accuracy)."""
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
