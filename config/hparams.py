"""The options a run is compared by (TensorBoard's HParams tab, the loggers' tables), and the ones
that differ between the jobs of a sweep."""

from __future__ import annotations

import functools
import itertools
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from config.overrides import sweep_grid, swept_overrides
from config.setup import compose

# The HParams tab's options besides a job's overrides: the group options, then these keys.
HPARAM_GROUPS = ("model", "dataset", "strategy", "optimizer", "scheduler", "loss")
HPARAM_KEYS = (
    "optimizer.lr",
    "trainer.batch_size",
    "trainer.epochs",
    "trainer.seed",
    "trainer.precision",
    "trainer.accelerator",
    "trainer.devices",
)


def hparams(cfg: DictConfig, choices: dict[str, str], swept: dict[str, Any]) -> dict[str, Any]:
    """The run's main options and every override of its command line, for the loggers' tables
    (TensorBoard's HParams tab): each under its key as the command line types it (`optimizer`,
    `optimizer.lr`, `trainer.epochs`), so that a sweep's and a search's columns read alike and an
    override is its option; each value as the config spells it (`sgd`, 0.05, 3, `auto`).
    optimizer.lr is as written: the lr trained with, after optimizer.lr_scaling, is the `lr` series."""
    options = {group: choices[group] for group in HPARAM_GROUPS}
    for key in HPARAM_KEYS:
        value = OmegaConf.select(cfg, key)
        options[key] = value.name if isinstance(value, Enum) else value
    options.update((key, value) for key, value in swept.items() if key not in options)
    return {key: value for key, value in options.items() if value is not None}


def varied_hparams(sweep_record: Path) -> dict[str, tuple[Any, ...]]:
    """The options (hparams') whose value differs between the jobs of a sweep, each with the values
    it takes there: the config of every job the sweep's record lists (config.overrides.sweep_grid),
    composed, so that optimizer.lr differs where optimizer=sgd,adamw picks it. A key an interval or a
    glob sweeps differs, its values unlisted. {} where there is no record."""
    return _varied_hparams(sweep_record.read_text()) if sweep_record.is_file() else {}


@functools.lru_cache(maxsize=1)  # one per sweep: its jobs run one after another in the sweep's process
def _varied_hparams(record: str) -> dict[str, tuple[Any, ...]]:
    fixed, swept = sweep_grid(record)
    jobs = []
    for combination in itertools.product(*(lines for lines in swept.values() if lines)):
        cfg = compose(*fixed, *combination, hydra=True)
        jobs.append(hparams(cfg, cfg.hydra.runtime.choices, swept_overrides(combination)))
    varied = {key: () for key, lines in swept.items() if not lines}
    for key in dict.fromkeys(key for job in jobs for key in job):
        values = list(dict.fromkeys(job.get(key) for job in jobs))
        if len(values) > 1:
            varied[key] = tuple(value for value in values if value is not None)
    return varied
