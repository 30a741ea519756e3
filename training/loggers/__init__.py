"""The run's loggers (conf/logger/): each a Logger (training/loggers/base.py), made on rank 0 only."""
from __future__ import annotations

from config.schema import LoggerConfig, RunConfig
from training.loggers.base import Logger
from training.loggers.tensorboard import TensorBoardLogger


def build_loggers(cfg: LoggerConfig, job: RunConfig) -> list[Logger]:
    """The backends `cfg` turns on (none: the console, train.log and metrics.json only)."""
    return [TensorBoardLogger(job)] if cfg.tensorboard else []
