"""The config `python train.py ...` composes, as Hydra gives it to main() and as a worker gets it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, open_dict

from config.hparams import hparams
from config.overrides import swept_overrides
from config.schema import Config, RunConfig
from config.setup import compose
from config.typed import Composition, run_config, typed
from data import num_classes


def compose_config(*overrides: str) -> DictConfig:
    """The config `python train.py *overrides` composes, as Hydra gives it to main()."""
    return compose(*overrides)


def typed_config(*overrides: str) -> Config:
    return typed(compose(*overrides))


def job_config(run_dir: Path, *overrides: str) -> RunConfig:
    """What train.py hands each worker for `python train.py *overrides`, run in `run_dir` (no resume)."""
    return job_and_config(run_dir, *overrides)[0]


def job_and_config(run_dir: Path, *overrides: str) -> tuple[RunConfig, Config]:
    """job_config's RunConfig and the typed config it was made from (what the pre-flight checks and
    plans), from one compose."""
    cfg = compose(*overrides, hydra=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    config = typed(cfg)
    swept = swept_overrides(overrides)
    composition = Composition(run_dir, choices, swept, hparams(cfg, choices))
    job = run_config(config, composition, num_classes=config.dataset.num_classes or num_classes(config.dataset))
    return job, config
