"""A Hydra callback: a sweep (`-m`, or an hparams_search) says where it writes, as it starts and
as it ends, with the command that compares its jobs."""
from __future__ import annotations

import logging
import shlex
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


def report_command(sweep_dir: str) -> str:
    return f"python -m bench.report {shlex.quote(sweep_dir)}"


class SweepDir(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        log.info("Sweep dir: %s (a dir per job); once it ends, compare them: %s", sweep_dir, report_command(sweep_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        log.info("Sweep done, in %s; compare its jobs: %s", sweep_dir, report_command(sweep_dir))
