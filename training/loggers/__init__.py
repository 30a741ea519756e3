"""The run's loggers (conf/logger/): each a Logger (training/loggers/base.py), made on rank 0 only."""

from __future__ import annotations

from config.schema import LoggerConfig, RunConfig
from training.loggers.base import Logger
from training.loggers.csv import CsvLogger
from training.loggers.mlflow import MlflowLogger
from training.loggers.tensorboard import TensorBoardLogger
from training.loggers.wandb import WandbLogger

# logger.<option> -> its backend; an option is on when set (conf/logger/<option>.yaml sets it).
BACKENDS: dict[str, type[Logger]] = {
    "tensorboard": TensorBoardLogger,
    "csv": CsvLogger,
    "wandb": WandbLogger,
    "mlflow": MlflowLogger,
}


def chosen(cfg: LoggerConfig) -> list[type[Logger]]:
    return [backend for option, backend in BACKENDS.items() if getattr(cfg, option)]


def build_loggers(cfg: LoggerConfig, job: RunConfig) -> list[Logger]:
    """The backends `cfg` turns on (none: the console, train.log and metrics.json only)."""
    # TensorBoard's reads no option of its own.
    return [backend(job) if backend is TensorBoardLogger else backend(cfg, job) for backend in chosen(cfg)]


def takes_images(cfg: LoggerConfig) -> bool:
    """Whether a backend `cfg` turns on shows images: the sample grid is drawn only then."""
    return any(backend.takes_images for backend in chosen(cfg))
