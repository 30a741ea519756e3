"""Train an image classifier: python train.py [group=option ...] [key=value ...].

Hydra composes the config; we check it against this machine before any process starts, then
the launcher runs training/run.py's worker once per device.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

import data
import models
from distributed import environment
from distributed.launch import LaunchPlan, launch, plan_launch
from errors import ConfigError, Preempted, RankFailed
from training.checkpoint import check_resumable, find_resume, load_checkpoint
from training.precision import AUTOCAST_DTYPES
from training.preemption import parse_signals, requeue_or_explain, resume_command
from training.run import run
from training.schema import Config

ConfigStore.instance().store(name="schema", node=Config)
# conf/config.yaml names the run dir with these, so every torchrun/SLURM rank picks the same one.
OmegaConf.register_new_resolver(
    "run_name", lambda launcher, default: environment.run_name(launcher, os.environ, default), replace=True
)
OmegaConf.register_new_resolver(
    "rank_zero_only", lambda launcher, value: value if environment.is_rank_zero(launcher, os.environ) else None,
    replace=True,
)
# Seed recipes give a batch per GPU; trainer.batch_size is global: ${per_device:128} = 128 x processes.
OmegaConf.register_new_resolver(
    "per_device",
    lambda batch, *, _root_: batch * (_root_.trainer.gpus or _root_.trainer.devices) * _root_.trainer.num_nodes,
    replace=True,
)
log = logging.getLogger("train")


class OutputDirCheck(Callback):
    """Hydra makes the run dir before main() runs; one it cannot make would end in a traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_writable("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_writable("hydra.sweep.dir", config.hydra.sweep.dir)


def _exit_unless_writable(key: str, directory: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("permission denied")
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"error: {key}={directory}: cannot write there ({reason}); choose a writable {key}", file=sys.stderr)
        sys.exit(2)


def check(cfg: DictConfig, run_dir: Path | None = None) -> LaunchPlan:
    """Everything that can be wrong before training starts, as one-line ConfigErrors."""
    trainer = cfg.trainer
    plan = plan_launch(trainer, cfg.strategy, cfg.launcher)
    if trainer.epochs < 1:
        raise ConfigError(f"trainer.epochs={trainer.epochs}: train for at least 1 epoch")
    if trainer.batch_size % plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={trainer.batch_size} is the global batch and must split evenly over "
            f"{plan.world_size} processes; use a multiple of {plan.world_size}"
        )
    if trainer.precision not in AUTOCAST_DTYPES:
        raise ConfigError(f"trainer.precision={trainer.precision}: choose 32, bf16-mixed or 16-mixed")
    if trainer.precision == "16-mixed" and plan.accelerator == "cpu":
        raise ConfigError(
            "trainer.precision=16-mixed needs CUDA (fp16 autocast with a GradScaler); "
            "on CPU use trainer.precision=bf16-mixed or 32"
        )
    if trainer.accumulate_grad_batches < 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches}: use 1 (no accumulation) or more"
        )
    if trainer.grad_clip is not None and trainer.grad_clip <= 0:
        raise ConfigError(f"trainer.grad_clip={trainer.grad_clip}: give a positive max norm, or null for none")
    for key in ("checkpoint_every_n_steps", "preempt_check_every_n_steps"):
        if trainer[key] is not None and trainer[key] < 1:
            raise ConfigError(f"trainer.{key}={trainer[key]}: use a positive number of steps, or null")
    signals = parse_signals(trainer.preempt_signals, "trainer.preempt_signals")
    parse_signals(trainer.requeue_signals, "trainer.requeue_signals")
    _check_resume(cfg, run_dir)
    data.check(cfg.dataset, cfg.data)
    return replace(plan, forward_signals=tuple(signals))


def _check_resume(cfg: DictConfig, run_dir: Path | None) -> None:
    """Refuse a checkpoint that cannot continue this run, and never overwrite a run's last.pt."""
    resume = cfg.trainer.resume
    path = find_resume(resume, run_dir) if run_dir is not None or resume != "auto" else None
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"trainer.resume={resume}: no such file; give an existing checkpoint path")
        check_resumable(load_checkpoint(path, torch.device("cpu")), models.build(cfg.model), path)
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if last is not None and last.exists() and (path is None or path.resolve() != last.resolve()):
        raise ConfigError(
            f"hydra.run.dir={run_dir} already holds checkpoints/last.pt; continue it with trainer.resume=auto "
            "or train in another hydra.run.dir"
        )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    labels = {group: hydra_cfg.runtime.choices[group] for group in ("model", "dataset", "strategy")}
    try:
        launch(check(cfg, run_dir), run, cfg, str(run_dir), labels)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RankFailed as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        if e.is_main:
            requeue = parse_signals(cfg.trainer.requeue_signals, "trainer.requeue_signals")
            requeue_or_explain(e, requeue, resume_command(list(hydra_cfg.overrides.task), str(run_dir)))
        sys.exit(e.exit_code)
    metrics = run_dir / "metrics.json"
    # A sweep's optimizer (hydra/sweeper) maximises what the task function returns.
    return json.loads(metrics.read_text())["best_val_acc"] if metrics.exists() else None


if __name__ == "__main__":
    main()
