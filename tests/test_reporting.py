"""What TensorBoard shows: the per-epoch grid of validation samples, and the HParams tab's row per job."""

from __future__ import annotations

import io
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import torch
import yaml
from google.protobuf import json_format
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

from config.overrides import sweep_grid
from config.schema import LoggerConfig, ResumePoint
from config.setup import CONF_DIR
from training.loggers import build_loggers
from training.loggers.naming import trial_name
from training.loggers.tensorboard import HPARAM_METRICS, TensorBoardLogger, image_summary, masked_crc32c
from training.samples import SampleGrid


def _job(run_dir, **fields) -> SimpleNamespace:
    """The fields of a RunConfig that TensorBoard's logger reads: a single run's, unless `fields` say otherwise."""
    return SimpleNamespace(
        **{"run_dir": run_dir, "varied": {}, "hparams": {}, "swept": {}, "sweep_dir": None, "resume": None, **fields}
    )


def _tensorboard(run_dir, **fields) -> TensorBoardLogger:
    """What build_loggers makes for logger=tensorboard."""
    return TensorBoardLogger(_job(run_dir, **fields))


def _caption(grid: np.ndarray, index: int) -> np.ndarray:
    """The caption strip of sample `index`: above its tile, which is right below it."""
    row, column = divmod(index, SampleGrid.COLUMNS)
    top = SampleGrid.HEADER + row * (SampleGrid.CAPTION + SampleGrid.TILE)
    left = SampleGrid.MARGIN + column * (SampleGrid.TILE + SampleGrid.GAP)
    return grid[top : top + SampleGrid.CAPTION, left : left + SampleGrid.TILE]


def _tile(grid: np.ndarray, index: int) -> np.ndarray:
    row, column = divmod(index, SampleGrid.COLUMNS)
    top = SampleGrid.HEADER + row * (SampleGrid.CAPTION + SampleGrid.TILE) + SampleGrid.CAPTION
    left = SampleGrid.MARGIN + column * (SampleGrid.TILE + SampleGrid.GAP)
    return grid[top : top + SampleGrid.TILE, left : left + SampleGrid.TILE]


def _caption_hues(grid: np.ndarray, index: int) -> set[str]:
    """'green' and/or 'red' if the caption of sample `index` has such pixels (the text is anti-aliased)."""
    strip = _caption(grid, index)
    r, g = strip[..., 0].astype(int), strip[..., 1].astype(int)
    return {hue for hue, present in (("green", (g > r + 80).any()), ("red", (r > g + 80).any())) if present}


def _text_height(strip: np.ndarray) -> int:
    """How many pixel rows the text in a strip spans (anything not near white)."""
    rows = np.flatnonzero((strip < 200).any(axis=(1, 2)))
    return int(rows[-1] - rows[0] + 1) if rows.size else 0


def test_grid_has_a_tile_per_sample_and_colours_right_and_wrong():
    images = torch.randn(5, 1, 8, 8) * 3 + 7  # normalised or not: each tile is scaled to its own range
    grid = SampleGrid(images, torch.tensor([1, 0, 3, 0, 5])).draw(torch.tensor([1, 2, 3, 4, 5]))
    tile, caption = SampleGrid.TILE, SampleGrid.CAPTION
    assert grid.dtype == np.uint8 and grid.shape == (SampleGrid.HEADER + 2 * (caption + tile), 350, 3)
    assert [_caption_hues(grid, i) for i in range(5)] == [{"green"}, {"red"}, {"green"}, {"red"}, {"green"}]
    first_tile = _tile(grid, 0)
    assert first_tile.min() == 0 and first_tile.max() == 255


def test_the_grid_is_shown_pixel_for_pixel_in_tensorboard_with_captions_tall_enough_to_read():
    # TensorBoard fits an image to its box by nearest pixel: the Images tab's is 350 px wide, the
    # Time Series card's 212 px tall, and the default 8 samples fit both.
    default = yaml.safe_load((CONF_DIR / "logger" / "tensorboard.yaml").read_text())[
        "sample_images"
    ]  # logger's default
    grid = SampleGrid(torch.randn(default, 1, 8, 8), torch.arange(default) * 61).draw(torch.arange(default) * 67)
    assert grid.shape[1] == 350 and grid.shape[0] <= 212
    legend = grid[: SampleGrid.HEADER]
    assert [_text_height(_caption(grid, i)) >= 10 for i in range(default)] == [True] * default
    assert _text_height(legend) >= 10


def test_each_epoch_draws_the_grid_a_fresh_one_would_draw():
    torch.manual_seed(0)
    images, targets = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    grid = SampleGrid(images, targets)
    drawn = []
    for predicted in ([0, 1, 2, 3, 4, 5], [9, 1, 7, 3, 4, 5], [9, 1, 7, 3, 4, 5], [0, 8, 2, 3, 4, 5]):
        drawn.append((predicted, grid.draw(torch.tensor(predicted))))
    assert [_caption_hues(drawn[-1][1], i) for i in range(3)] == [{"green"}, {"red"}, {"green"}]
    assert not np.array_equal(drawn[0][1], drawn[1][1])  # a caption is of its (predicted, true) pair
    # Captions are redrawn only where the prediction changed, and no epoch's grid changes afterwards.
    for predicted, pixels in drawn:
        assert np.array_equal(pixels, SampleGrid(images, targets).draw(torch.tensor(predicted)))


def test_colour_images_keep_their_colours():
    image = torch.zeros(1, 3, 4, 4)
    image[0, 0] = 1.0  # pure red
    grid = SampleGrid(image, torch.tensor([0])).draw(torch.tensor([0]))
    assert tuple(_tile(grid, 0)[10, 10]) == (255, 0, 0)


def _hparams_plugin_data(events: EventAccumulator, tag: str) -> plugin_data_pb2.HParamsPluginData:
    return plugin_data_pb2.HParamsPluginData.FromString(events.PluginTagToContent(metadata.PLUGIN_NAME)[tag])


def test_the_hparams_row_holds_the_main_options_the_model_summary_and_what_the_sweep_varies(tmp_path):
    # Job 1 of `-m model=simple_cnn,mnist_net optimizer=sgd,adamw trainer.epochs=3`: its record
    # (config.hparams.hparams), its model summary, and what the sweep's jobs differ in (varied_hparams).
    record = {
        "model": "simple_cnn",
        "dataset": "digits",
        "optimizer": "adamw",
        "optimizer.lr": 0.001,
        "optimizer.weight_decay": 0.01,
        "trainer.batch_size": 64,
        "trainer.epochs": 3,
        "trainer.precision": "32",
        "trainer.compile": False,
        "data.num_workers": 0,
    }
    figures = {"parameters": 21386, "model_mb": 0.086}
    varied = {
        "model": ("simple_cnn", "mnist_net"),
        "optimizer": ("sgd", "adamw"),
        "optimizer.lr": (0.05, 0.001),
        "optimizer.momentum": (0.9,),  # sgd's: adamw has none
        "optimizer.weight_decay": (0.0005, 0.01),
        "parameters": (21386, 53002),
        "model_mb": (0.086, 0.212),
    }
    sweep = tmp_path / "multirun" / "2026-12-06" / "03-12-44"
    run_dir = sweep / "1_model-simple_cnn+optimizer-adamw+trainer.epochs-3"
    swept = {"model": "simple_cnn", "optimizer": "adamw", "trainer.epochs": 3}
    logger = _tensorboard(run_dir, varied=varied, hparams=record, swept=swept, sweep_dir=sweep)
    logger.log_hparams({**record, **figures}, {"val_acc": 0.5, "steps": 10})
    logger.close()

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    experiment = _hparams_plugin_data(events, metadata.EXPERIMENT_TAG).experiment
    infos = {info.name: info for info in experiment.hparam_infos}
    # The main options, the model summary and what differs; not trainer.compile, data.num_workers:
    # alike in every job and no main option.
    # The main options, the model summary and what differs (sgd's momentum too, which this adamw job
    # lacks), as the tab lists them: what differs first, by name. Not trainer.compile nor
    # data.num_workers: alike in every job, and no main option.
    assert list(infos) == [
        "model",
        "model_mb",
        "optimizer",
        "optimizer.lr",
        "optimizer.momentum",
        "optimizer.weight_decay",
        "parameters",
        "dataset",
        "trainer.batch_size",
        "trainer.epochs",
        "trainer.precision",
    ]
    assert [name for name, info in infos.items() if info.differs] == list(infos)[:7]
    # A number is a number (sorted, filtered by range, a numeric axis); a text's filter offers the sweep's values.
    kinds = {name: api_pb2.DataType.Name(info.type) for name, info in infos.items()}
    assert [name for name, kind in kinds.items() if kind == "DATA_TYPE_FLOAT64"] == [
        "model_mb",
        "optimizer.lr",
        "optimizer.momentum",
        "optimizer.weight_decay",
        "parameters",
        "trainer.batch_size",
        "trainer.epochs",
    ]
    assert not any(infos[name].HasField("domain_discrete") for name in ("optimizer.lr", "trainer.batch_size"))
    assert list(infos["model"].domain_discrete) == ["mnist_net", "simple_cnn"]
    assert list(infos["dataset"].domain_discrete) == ["digits"]
    # The first five metrics are ticked: training time among them, the cross-entropy (the loss itself, here) last.
    assert [(m.name.tag, m.display_name) for m in experiment.metric_infos] == list(HPARAM_METRICS.items())
    assert list(HPARAM_METRICS)[:5] == [
        "val/acc",
        "val/best_acc",
        "val/loss",
        "throughput/median_samples_per_s",
        "time/train_s",
    ]
    start = _hparams_plugin_data(events, metadata.SESSION_START_INFO_TAG).session_start_info
    assert start.group_name == "model=simple_cnn optimizer=adamw · 2026-12-06/03-12-44 #1"  # its Trial ID
    values = {name: json_format.MessageToDict(value) for name, value in start.hparams.items()}
    assert values == {k: v for k, v in {**record, **figures}.items() if k in infos}
    assert isinstance(values["trainer.batch_size"], float)
    # Every metric is read off a series the trainer writes each epoch: hparams adds no one-point chart.
    assert events.Tags()["scalars"] == []


def test_a_trial_id_is_what_the_job_set_of_what_differs_its_sweep_and_number_a_single_runs_its_dir(tmp_path):
    assert trial_name(_job(tmp_path / "2026-12-06" / "03-12-44")) == ""  # TensorBoard names it by its path
    sweep = tmp_path / "search" / "digits"
    job = _job(
        sweep / "3_optimizer.lr-0.03029",
        sweep_dir=sweep,
        swept={"optimizer.lr": 0.03028525153605885},
        varied={"optimizer.lr": ()},
    )
    assert trial_name(job) == "optimizer.lr=0.03029 · search/digits #3"


def test_a_sweep_record_gives_the_overrides_every_job_shares_and_those_it_sweeps():
    # multirun.yaml as hparams_search=digits writes it, run with a narrower lr and a fixed batch.
    record = yaml.safe_dump(
        {
            "hydra": {
                "sweeper": {
                    "params": {
                        "optimizer.lr": "tag(log, interval(1e-3, 0.5))",
                        "trainer.batch_size": "choice(16, 32)",
                        "optimizer.weight_decay": "tag(log, interval(1e-6, 1e-2))",
                    }
                },
                "overrides": {
                    "task": [
                        "hparams_search=digits",
                        "optimizer.lr=interval(0.01, 0.1)",
                        "trainer.batch_size=64",
                        "model=simple_cnn,mnist_net",
                        "+model.width=8",
                    ]
                },
            }
        }
    )
    fixed, swept = sweep_grid(record)
    assert fixed == ["hparams_search=digits", "trainer.batch_size=64", "+model.width=8"]  # the command line wins
    assert swept == {"optimizer.weight_decay": [], "optimizer.lr": [], "model": ["model=simple_cnn", "model=mnist_net"]}


def test_logger_none_makes_no_logger_and_tensorboard_its_own(tmp_path):
    job = _job(tmp_path)
    assert build_loggers(LoggerConfig(), job) == []  # logger=none
    (logger,) = build_loggers(LoggerConfig(tensorboard=True), job)
    assert isinstance(logger, TensorBoardLogger)
    logger.close()


def test_a_resume_shows_once_each_step_the_killed_run_logged_after_its_checkpoint(tmp_path):
    """Killed at step 6 after saving at step 5, resumed: TensorBoard shows the resume's step 6, not both."""
    killed = _tensorboard(tmp_path)
    for step, loss in ((2, 2.3), (4, 2.2), (6, 2.1)):
        killed.log_scalars(step, {"train/loss_window": loss})
    killed.close()
    resumed = _tensorboard(tmp_path, resume=ResumePoint(tmp_path / "last.pt", step=5, size=1))
    for step, loss in ((6, 2.0), (8, 1.9)):
        resumed.log_scalars(step, {"train/loss_window": loss})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    shown = [(s.step, round(s.value, 3)) for s in events.Scalars("train/loss_window")]
    assert shown == [(2, 2.3), (4, 2.2), (6, 2.0), (8, 1.9)]


def test_the_image_summary_holds_the_grid_losslessly():
    from PIL import Image

    grid = SampleGrid(torch.randn(6, 3, 5, 5), torch.arange(6)).draw(torch.arange(6))
    (value,) = image_summary("val/samples", grid).value
    assert (value.tag, value.image.height, value.image.width, value.image.colorspace) == ("val/samples", *grid.shape)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(value.image.encoded_image_string))), grid)


def test_tensorboard_checksums_records_in_c_with_its_own_values(tmp_path):
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards
    from tensorboard.summary.writer import record_writer

    rng = np.random.default_rng(0)
    for size in (0, 1, 12, 1000, 50_000):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert masked_crc32c(data) == tensorboards(data)
    logger = _tensorboard(tmp_path)
    logger.log_scalars(1, {"x": 1.0})
    logger.close()
    # The writer's records carry the C checksum, and TensorBoard's reader, which drops any record
    # whose checksum its own code does not match, reads them back.
    assert record_writer.masked_crc32c is masked_crc32c
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [s.value for s in events.Scalars("x")] == [1.0]


def test_an_image_is_encoded_again_only_when_it_changes(tmp_path, monkeypatch):
    import training.loggers.tensorboard as tensorboard

    encodings = []
    monkeypatch.setattr(tensorboard, "image_summary", lambda tag, hwc: encodings.append(tag) or image_summary(tag, hwc))
    images, targets = torch.randn(4, 1, 8, 8), torch.arange(4)
    grid = SampleGrid(images, targets)
    logger = _tensorboard(tmp_path)
    for step, predicted in enumerate(([0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 0]), start=1):
        logger.log_image(step, "val/samples", grid.draw(torch.tensor(predicted)))  # a new array each time
    logger.close()
    assert len(encodings) == 2
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    written = events.Images("val/samples")
    assert [image.step for image in written] == [1, 2, 3]
    from PIL import Image

    last = np.asarray(Image.open(io.BytesIO(written[-1].encoded_image_string)))
    assert np.array_equal(last, SampleGrid(images, targets).draw(torch.tensor([0, 1, 2, 0])))


def test_a_fork_waits_for_the_thread_that_makes_the_writer(tmp_path, monkeypatch):
    """A DataLoader's worker forked while that thread imports TensorBoard could inherit an import
    lock the thread holds, and wait for it forever."""
    making, made = threading.Event(), object()

    def slowly(logger):
        making.set()
        time.sleep(0.3)
        logger._made = made

    monkeypatch.setattr(TensorBoardLogger, "_make_writer", slowly)
    logger = _tensorboard(tmp_path)
    making.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert logger._made is made  # the fork waited for the thread to end
