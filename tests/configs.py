"""The config `python train.py ...` composes, as Hydra gives it to main() and as a worker gets it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, open_dict

from config.overrides import swept_overrides
from config.schema import Config, RunConfig
from config.setup import compose
from preflight import run_config, typed
from training.preemption import parse_signals


def compose_config(*overrides: str) -> DictConfig:
    """The config `python train.py *overrides` composes, as Hydra gives it to main()."""
    return compose(*overrides)


def typed_config(*overrides: str) -> Config:
    return typed(compose(*overrides))


def job_config(run_dir: Path, *overrides: str) -> RunConfig:
    """What train.py hands each worker for `python train.py *overrides`, run in `run_dir`."""
    cfg = compose(*overrides, hydra=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    settings = typed(cfg)
    signals = tuple(parse_signals(settings.trainer.preempt_signals, "trainer.preempt_signals"))
    requeue = tuple(parse_signals(settings.trainer.requeue_signals, "trainer.requeue_signals"))
    return run_config(cfg, settings, run_dir, choices, swept_overrides(overrides), signals, requeue)
