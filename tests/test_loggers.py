"""The logger backends, each read back with the tool its users read it with: the CSV with pandas,
W&B's offline run file with W&B's own record type, the MLflow store through MlflowClient."""
from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from config.schema import LoggerConfig, MlflowConfig, WandbConfig
from errors import ConfigError
from tests.configs import job_config, typed_config

FINAL = {"val_acc": 0.97, "best_val_acc": 0.98, "steps": 100, "peak_memory_mb": None, "devices": 1}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A sweep's job: `python train.py -m optimizer.lr=0.1,0.2 trainer.epochs=2`, its first."""
    sweep = tmp_path_factory.mktemp("multirun") / "2026-11-26" / "18-55-00"
    run_dir = sweep / "0_optimizer.lr-0.1+trainer.epochs-2"
    run_dir.mkdir(parents=True)
    return replace(job_config(run_dir, "optimizer.lr=0.1", "trainer.epochs=2"), sweep_dir=sweep)


def test_logger_options_compose_alone_or_as_a_list():
    assert typed_config().logger == LoggerConfig(tensorboard=True)  # logger=tensorboard, the default
    chosen = typed_config("logger=[tensorboard,csv,wandb,mlflow]", "logger.mlflow.tracking_uri=http://h:5000").logger
    assert chosen == LoggerConfig(tensorboard=True, csv=True, wandb=WandbConfig(),
                                  mlflow=MlflowConfig(tracking_uri="http://h:5000"))
    alone = typed_config("logger=csv").logger  # CSV alone: no TensorBoard left on from a default
    assert (alone.tensorboard, alone.csv, alone.wandb, alone.mlflow) == (False, True, None, None)


def test_csv_is_a_row_per_step_a_column_per_tag_and_a_resume_rewrites_the_steps_it_runs_again(job):
    from training.loggers.csv import CsvLogger

    logger = CsvLogger(LoggerConfig(csv=True), job)
    logger.log_scalars(0, {"train/loss": 2.5, "lr": 0.1})
    logger.log_scalars(50, {"train/loss": 1.25, "lr": 0.1})
    logger.log_scalars(50, {"val/acc": 0.5})  # a new tag at a step already written: one row, wider
    logger.log_scalars(100, {"train/loss": 0.75, "lr": 0.05})
    logger.log_scalars(100, {"val/acc": 0.875})
    read = pd.read_csv(job.run_dir / "metrics.csv")  # flushed: readable while the run goes on
    assert list(read.columns) == ["step", "train/loss", "lr", "val/acc"]
    assert read["step"].tolist() == [0, 50, 100] and read["train/loss"].tolist() == [2.5, 1.25, 0.75]
    assert np.isnan(read["val/acc"][0]) and read["val/acc"][1:].tolist() == [0.5, 0.875]
    logger.close()

    with (job.run_dir / "metrics.csv").open("a") as f:
        f.write("1")  # the kill cut off row "150,...": read whole, it would be a row at step 1
    resumed = CsvLogger(LoggerConfig(csv=True), job)  # resumed from the step-50 checkpoint
    resumed.log_scalars(100, {"train/loss": 0.625, "lr": 0.05})
    resumed.log_hparams({"model": "mnist_net", "lr": 0.1}, FINAL)
    resumed.close()
    read = pd.read_csv(job.run_dir / "metrics.csv")
    assert read["step"].tolist() == [0, 50, 100] and read["train/loss"].tolist() == [2.5, 1.25, 0.625]
    assert np.isnan(read["val/acc"][2])  # step 100's old validation went with the step

    table = pd.concat([pd.read_csv(job.run_dir / "hparams.csv")] * 2)  # a sweep's, one row per job
    assert list(table.columns) == ["model", "lr", *FINAL] and table["best_val_acc"].tolist() == [0.98, 0.98]


def wandb_records(run_file: Path):
    """The records of a .wandb file (LevelDB's log format: 32 KiB blocks of length-prefixed chunks
    after W&B's 7-byte header), as W&B's own protobuf type. wandb 0.31 ships no reader of its own."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, position, chunks = run_file.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if (left := 32768 - position % 32768) < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        chunks += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            yield Record.FromString(chunks)
            chunks = b""


def test_wandb_writes_an_offline_run_named_by_the_overrides_grouped_by_the_sweep(job, monkeypatch, tmp_path):
    from training.loggers.wandb import WandbLogger

    for variable in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # not the user's home
        monkeypatch.setenv(variable, str(tmp_path / variable))
    logger = WandbLogger(LoggerConfig(wandb=WandbConfig()), job)
    logger.log_scalars(0, {"train/loss": 2.5})
    logger.log_scalars(50, {"train/loss": 1.25, "val/acc": 0.5})
    logger.log_image(50, "val/samples", np.zeros((8, 8, 3), np.uint8))
    logger.log_hparams(job.hparams, FINAL)
    logger.close()

    [run_dir] = (job.run_dir / "wandb").glob("offline-run-*")
    records = list(wandb_records(next(run_dir.glob("run-*.wandb"))))
    [run] = [r.run for r in records if r.HasField("run")]
    assert run.display_name == "optimizer.lr=0.1 trainer.epochs=2" and run.run_group == "2026-11-26/18-55-00"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"]["epochs"] == 2 and config["hparams"]["optimizer.lr"] == 0.1
    history = {r.history.step.num: {"/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.HasField("history")}
    assert history[0]["train/loss"] == 2.5 and history[50]["train/loss"] == 1.25 and history[50]["val/acc"] == 0.5
    assert history[50]["val/samples/_type"] == "image-file"  # W&B flattens an image's fields into the step's keys
    summary = {i.key: json.loads(i.value_json) for r in records if r.HasField("summary") for i in r.summary.update if i.key}
    assert {key: summary[key] for key in FINAL} == FINAL
    assert list(run_dir.glob(f"files/{history[50]['val/samples/path']}"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow.*")  # MLflow's own use of SQLAlchemy
def test_mlflow_keeps_a_sweeps_jobs_in_one_sqlite_experiment_under_the_sweep_dir(job, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from training.loggers.mlflow import MlflowLogger

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = LoggerConfig(mlflow=MlflowConfig())
    second = replace(job, run_dir=job.sweep_dir / "1_optimizer.lr-0.2+trainer.epochs-2",
                     swept={"optimizer.lr": 0.2, "trainer.epochs": 2}, hparams={**job.hparams, "optimizer.lr": 0.2})
    for run, loss in ((job, 1.25), (second, 1.5)):
        logger = MlflowLogger(cfg, run)
        logger.log_scalars(0, {"train/loss": 2.5})
        logger.log_scalars(50, {"train/loss": loss, "val/acc": 0.5})
        logger.log_image(50, "val/samples", np.zeros((8, 8, 3), np.uint8))
        logger.log_hparams(run.hparams, FINAL)
        logger.close()

    client = MlflowClient(f"sqlite:///{job.sweep_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("2026-11-26/18-55-00")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"optimizer.lr=0.1 trainer.epochs=2", "optimizer.lr=0.2 trainer.epochs=2"}
    first = runs["optimizer.lr=0.1 trainer.epochs=2"]
    assert first.info.status == "FINISHED" and first.data.params["optimizer.lr"] == "0.1" and first.data.params["optimizer"] == "sgd"
    assert first.data.metrics["best_val_acc"] == 0.98 and "peak_memory_mb" not in first.data.metrics
    assert [(m.step, m.value) for m in client.get_metric_history(first.info.run_id, "train/loss")] == [(0, 2.5), (50, 1.25)]
    artifacts = Path(first.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(job.sweep_dir / "mlartifacts") and not (tmp_path / "mlruns").exists()
    assert json.loads((artifacts / "metrics.json").read_text()) == FINAL
    assert "epochs: 2" in (artifacts / "config.yaml").read_text() and list(artifacts.glob("images/*.png"))


def test_a_single_run_is_named_by_its_overrides_or_else_its_dir_and_belongs_to_no_sweep(job):
    from training.loggers.naming import run_name, sweep_name

    single = replace(job, sweep_dir=None, swept={})
    assert (run_name(single), sweep_name(single)) == ("0_optimizer.lr-0.1+trainer.epochs-2", None)
    assert (run_name(job), sweep_name(job)) == ("optimizer.lr=0.1 trainer.epochs=2", "2026-11-26/18-55-00")


def test_a_logger_whose_package_is_missing_is_one_line_naming_the_requirements_file(monkeypatch):
    from training.loggers import packages

    monkeypatch.setitem(packages.PACKAGES, "wandb", "wandb_not_installed")
    cfg = LoggerConfig(tensorboard=True, wandb=WandbConfig())
    for attempt in (lambda: packages.check_installed(cfg), lambda: packages.import_for("wandb")):
        with pytest.raises(ConfigError) as error:
            attempt()
        assert str(error.value) == ("logger=wandb needs wandb_not_installed, which is not installed: "
                                    "pip install -r requirements-extras.txt (or leave it out of logger=)")
    packages.check_installed(LoggerConfig(tensorboard=True, csv=True))
