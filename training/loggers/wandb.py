"""logger=wandb: a Weights & Biases run per job, offline unless asked (nothing leaves the machine
until `wandb sync`). Named by the job's overrides, grouped by its sweep, its config the composed one.
A resumed job continues its run: the run's id is kept in <run dir>/wandb/run_id, and each process
of the job writes an offline-run-*-<id> dir that `wandb sync` uploads into that one run, in order."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import yaml

from config.schema import LoggerConfig, RunConfig
from training.loggers.naming import keep_id, kept_id, run_name, sweep_name
from training.loggers.packages import import_for

log = logging.getLogger("train")


class WandbLogger:
    takes_images = True

    def __init__(self, cfg: LoggerConfig, job: RunConfig) -> None:
        self._wandb = wandb = import_for("wandb")
        options = cfg.wandb
        mode = options.mode.value if options.mode is not None else os.environ.get("WANDB_MODE", "offline")
        kept = job.run_dir / "wandb" / "run_id"
        run_id = kept_id(kept)
        self.run = wandb.init(
            dir=job.run_dir,  # <run dir>/wandb/offline-run-<time>-<id>
            id=run_id,  # None: a new run, W&B's id
            resume="allow",  # online: the run if W&B has it already, else a new one with this id
            mode=mode,
            project=options.project,
            entity=options.entity,
            tags=options.tags or None,
            name=run_name(job),
            group=sweep_name(job),
            config={**yaml.safe_load(job.config_yaml), "hparams": job.hparams},
            # train.log has the console already; W&B's own lines would interleave with the run's
            settings=wandb.Settings(console="off", silent=True),
        )
        if run_id is None:
            keep_id(kept, self.run.id)

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None:
        self.run.log({tag: self._wandb.Image(hwc)}, step=step)

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
        """The options beside the composed config, and the final figures as the run's summary:
        the columns of W&B's runs table."""
        self.run.config.update({"hparams": dict(hparams)}, allow_val_change=True)
        self.run.summary.update(dict(metrics))

    def close(self) -> None:
        offline = self.run.settings.mode == "offline"
        where = self.run.settings.sync_dir  # <run dir>/wandb/offline-run-*: what `wandb sync` takes
        self.run.finish()
        if offline:
            log.info("W&B run saved offline in %s: upload it with `wandb sync %s`", where, where)
