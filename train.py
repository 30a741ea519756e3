"""Train an image classifier: python train.py [group=option ...] [key=value ...].

Hydra composes the config; we check it against this machine before any process starts, then
the launcher runs training/run.py's worker once per device.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import data
from distributed import environment
from distributed.launch import LaunchPlan, launch, plan_launch
from errors import ConfigError
from training.precision import AUTOCAST_DTYPES
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


def check(cfg: DictConfig) -> LaunchPlan:
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
    if trainer.resume is not None and not Path(trainer.resume).is_file():
        raise ConfigError(f"trainer.resume={trainer.resume}: no such file; give an existing checkpoint path")
    data.check(cfg.dataset, cfg.data)
    return plan


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    labels = {group: hydra_cfg.runtime.choices[group] for group in ("model", "dataset", "strategy")}
    try:
        launch(check(cfg), run, cfg, str(run_dir), labels)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    metrics = run_dir / "metrics.json"
    # A sweep's optimizer (hydra/sweeper) maximises what the task function returns.
    return json.loads(metrics.read_text())["best_val_acc"] if metrics.exists() else None


if __name__ == "__main__":
    main()
