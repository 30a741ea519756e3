"""logger.tensorboard: scalars, images and the HParams row under <run dir>/tb (a Logger)."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from config.hparams import HPARAM_GROUPS, HPARAM_KEYS
from config.schema import RunConfig
from training.loggers.background import Background
from training.loggers.naming import trial_name

if TYPE_CHECKING:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

# The figures TensorBoard's HParams tab sets against each job's options: tag -> column title.
# TensorBoard takes a metric's value from the last point of the scalar series of its tag (there is no
# other source), so each is a series the trainer writes every epoch: no one-point charts.
# The tab ticks the first five: val/ce, the loss itself where the loss is plain cross-entropy, comes last.
HPARAM_METRICS = {
    "val/acc": "final val acc",
    "val/best_acc": "best val acc",
    "val/loss": "final val loss",
    "throughput/median_samples_per_s": "samples/s (median of epochs 2+)",  # training.metrics.samples_per_s
    "time/train_s": "training time (s)",
    "val/ce": "final val cross-entropy",
}


class TensorBoardLogger:
    """logger.tensorboard: scalars, images and the HParams row under <run dir>/tb."""

    takes_images = True

    def __init__(self, job: RunConfig) -> None:
        self.run_dir, self.varied, self.trial = job.run_dir, job.varied, trial_name(job)
        # A resume logs again the steps after its checkpoint, which the run that stopped (killed, or
        # saved every n steps) may have logged already: TensorBoard hides those from this step on,
        # where it would draw two points at a step.
        self._purge_step = job.resume.step + 1 if job.resume is not None else None
        self._options = job.hparams.keys()
        self._images: dict[str, tuple[np.ndarray, Summary]] = {}  # tag -> the image last encoded, its summary
        self._made: SummaryWriter | None = None
        self._making: Background | None = Background(self._make_writer, "tensorboard")  # beside the first steps

    def _make_writer(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        checksum_records_in_c()
        self._made = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=self._purge_step)

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
        """One row in the HParams tab, named by trial_name: the main options, the model summary and
        every key its sweep's jobs differ in (RunConfig.varied, flagged so: the tab lists them first),
        against the final figures (HPARAM_METRICS)."""
        values = hparam_values(hparams, self._shown, self.varied)
        step = metrics.get("steps", 0)
        # SummaryWriter.add_hparams would open a second writer in a timestamped subdirectory, which
        # TensorBoard shows as a run of its own; written here, a sweep shows one run per job.
        for summary in (
            experiment_summary(values, self.varied),
            session_start_summary(values, self.trial),
            session_end_summary(),
        ):
            self._writer.file_writer.add_summary(summary, step)

    def _shown(self, key: str) -> bool:
        """A main option, or a figure beside the options (the model summary)."""
        return key in HPARAM_GROUPS or key in HPARAM_KEYS or key not in self._options

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


def hparam_values(
    hparams: Mapping[str, Any], shown: Callable[[str], bool], varied: Mapping[str, Sequence[Any]]
) -> dict[str, bool | float | str]:
    """The options the tab shows: those `shown` keeps, and those the sweep's jobs differ in. A number
    is a number, which the tab sorts, filters by range and plots on a numeric axis (it prints it to 5
    digits: 64.000, 0.050000); a flag a flag; a text as the config spells it (a record holds no other)."""
    return {
        key: float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        for key, value in hparams.items()
        if value is not None and (shown(key) or key in varied)
    }


def _hparams_summary(tag: str, data: Any) -> Summary:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata

    data.version = metadata.PLUGIN_DATA_VERSION
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])


def session_start_summary(values: Mapping[str, bool | float | str], trial: str) -> Summary:
    """The job's row: its options; `trial`, its Trial ID ("": its run's path under --logdir)."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(group_name=trial, start_time_secs=time.time())
    for key, value in values.items():
        start.hparams[key].CopyFrom(
            struct_pb2.Value(bool_value=value)
            if isinstance(value, bool)
            else struct_pb2.Value(number_value=value)
            if isinstance(value, float)
            else struct_pb2.Value(string_value=value)
        )
    return _hparams_summary(
        metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)
    )


def session_end_summary() -> Summary:
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return _hparams_summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end))


def experiment_summary(values: Mapping[str, Any], varied: Mapping[str, Sequence[Any]]) -> Summary:
    """TensorBoard's experiment for the HParams tab: every hparam, those whose value differs between
    the sweep's jobs flagged so (TensorBoard lists them first, and ticks the first five), a text's or
    a flag's with the values its checkbox filter offers (the sweep's, or this job's alone), a
    number's filtered by range; and HPARAM_METRICS with their titles, in order (the first five
    ticked). Every job of a sweep writes the same one: TensorBoard reads one of them."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    def info(name: str, value: Any) -> api_pb2.HParamInfo:
        hparam = api_pb2.HParamInfo(name=name, differs=name in varied)
        if isinstance(value, float):
            hparam.type = api_pb2.DATA_TYPE_FLOAT64
            return hparam
        flag = isinstance(value, bool)
        hparam.type = api_pb2.DATA_TYPE_BOOL if flag else api_pb2.DATA_TYPE_STRING
        listed = varied.get(name, (value,))
        if listed:  # an interval or a glob lists none
            hparam.domain_discrete.extend(sorted({v if flag else str(v) for v in listed}))
        return hparam

    # A key the sweep's jobs differ in that this job lacks (sgd's momentum, in an adamw job) is a column too.
    lacked = {name: listed[0] for name, listed in varied.items() if listed and name not in values}
    hparams = {**values, **hparam_values(lacked, lambda _: True, {})}
    experiment = api_pb2.Experiment(
        # In the order the tab lists them, those that differ first, by name: the same in every job.
        hparam_infos=[info(name, hparams[name]) for name in sorted(hparams, key=lambda k: (k not in varied, k))],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=title)
            for tag, title in HPARAM_METRICS.items()
        ],
    )
    return _hparams_summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))
