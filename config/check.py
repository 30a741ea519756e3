"""Before any process starts: the composed config against this machine, as one-line errors;
then the typed RunConfig every worker receives."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import data
from config.schema import PRECISIONS, Accelerator, Config, RunConfig
from distributed import strategies
from distributed.launch import LaunchPlan, plan_launch
from errors import ConfigError
from training.checkpoint import check_resumable, find_resume, load_checkpoint
from training.preemption import parse_signals


def typed(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)


def check(cfg: Config, run_dir: Path | None = None) -> LaunchPlan:
    """Everything that can be wrong before training starts, as one-line ConfigErrors."""
    trainer = cfg.trainer
    strategy = strategies.get(cfg.strategy)
    plan = plan_launch(trainer, strategy, cfg.launcher)
    strategy.check_model(factory(cfg.model))
    if trainer.epochs < 1:
        raise ConfigError(f"trainer.epochs={trainer.epochs}: train for at least 1 epoch")
    if trainer.batch_size % plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={trainer.batch_size} is the global batch and must split evenly over "
            f"{plan.world_size} processes; use a multiple of {plan.world_size}"
        )
    if trainer.precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={trainer.precision}: choose 32, bf16-mixed or 16-mixed")
    if trainer.precision == "16-mixed" and plan.accelerator == Accelerator.cpu.value:
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
    for key in ("checkpoint_every_n_steps", "preempt_check_every_n_steps", "overfit_batches"):
        value = getattr(trainer, key)
        if value is not None and value < 1:
            raise ConfigError(f"trainer.{key}={value}: use a positive number, or null")
    signals = parse_signals(trainer.preempt_signals, "trainer.preempt_signals")
    parse_signals(trainer.requeue_signals, "trainer.requeue_signals")
    _check_resume(cfg, run_dir)
    data.check(cfg.dataset, cfg.data)
    return replace(plan, forward_signals=tuple(signals))


def _check_resume(cfg: Config, run_dir: Path | None) -> None:
    """Refuse a checkpoint that cannot continue this run, and never overwrite a run's last.pt."""
    resume = cfg.trainer.resume
    path = find_resume(resume, run_dir) if run_dir is not None or resume != "auto" else None
    if path is not None:
        if not path.exists():
            raise ConfigError(f"trainer.resume={resume}: no such file; give an existing checkpoint path")
        if path.is_dir():  # strategy=fsdp's sharded last.pt, checked from its metadata and train state
            from distributed import sharded_state  # torch.distributed.checkpoint: ~1 s to import

            checkpoint = sharded_state.describe(path)
        else:
            checkpoint = load_checkpoint(path, torch.device("cpu"))
        check_resumable(checkpoint, factory(cfg.model)(), path)
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if last is not None and last.exists() and (path is None or path.resolve() != last.resolve()):
        raise ConfigError(
            f"hydra.run.dir={run_dir} already holds checkpoints/last.pt; continue it with trainer.resume=auto "
            "or train in another hydra.run.dir"
        )


def factory(node: Any) -> Callable[..., Any]:
    """A `_target_` node as a picklable factory: each rank builds its own (Hydra's _partial_)."""
    return instantiate(node, _partial_=True, _convert_="all")


def overridden_keys(overrides: list[str]) -> list[str]:
    """`model=resnet18`, `+trainer.x=1`, `~y` -> the keys they set: what tells sweep jobs apart."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides]


def run_config(
    cfg: DictConfig, settings: Config, run_dir: Path, choices: dict[str, str], swept: list[str]
) -> RunConfig:
    """The typed config every worker receives. `settings`: `cfg` typed; `choices`: the group
    options Hydra picked; `swept`: the keys set on the command line."""
    labels = {group: choices[group] for group in ("model", "dataset", "strategy")}
    return RunConfig(
        trainer=settings.trainer,
        strategy=settings.strategy,
        launcher=settings.launcher,
        data=settings.data,
        dataset=settings.dataset,
        logger=settings.logger,
        model=factory(cfg.model),
        optimizer=factory(cfg.optimizer),
        scheduler=factory(cfg.scheduler) if cfg.scheduler.get("_target_") else None,
        run_dir=run_dir,
        labels=labels,
        hparams=_hparams(cfg, settings, labels, swept),
        config_yaml=OmegaConf.to_yaml(cfg),
    )


def _hparams(cfg: DictConfig, settings: Config, labels: dict[str, str], swept: list[str]) -> dict[str, Any]:
    """The choices that tell one sweep job from another, for TensorBoard's HParams tab."""
    trainer = settings.trainer
    options = {
        **labels,
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": cfg.optimizer.lr,
        "scheduler": cfg.scheduler.get("_target_", "none").rsplit(".", 1)[-1],
        "accelerator": trainer.accelerator.value if trainer.gpus is None else "gpu",
        "devices": trainer.devices_per_node * trainer.num_nodes,
        "batch_size": trainer.batch_size,
        "epochs": trainer.epochs,
        "seed": trainer.seed,
        "precision": trainer.precision,
    }
    for key in swept:  # anything else the command line set, under its own name
        value = OmegaConf.select(cfg, key)
        if key not in options and isinstance(value, (int, float, str, bool)):
            options[key] = value
    return options


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
