"""One rank's whole life: join the group, build data/model/strategy, train, leave (also on error)."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

import models
from data import build_loaders
from distributed import context
from distributed.context import DistContext
from distributed.strategy import unwrap, wrap
from errors import Preempted
from training.checkpoint import Checkpointer, TrainState, find_resume
from training.loop import fit
from training.precision import grad_scaler
from training.preemption import PreemptionWatch, parse_signals
from training.reporting import Reporter, configure_logging

log = logging.getLogger("train")


def run(ctx: DistContext, cfg: DictConfig, run_dir: str, labels: dict[str, str]) -> None:
    """The worker every launcher starts once per device. `labels` name the chosen config options."""
    configure_logging(ctx, Path(run_dir))
    context.init(ctx, cfg.launcher.timeout_s)
    finished = False
    try:
        train(ctx, cfg, Path(run_dir), labels)
        finished = True
    except Preempted:
        finished = True  # every rank stopped at the same step: leave together, after rank 0 saved
        raise
    finally:
        context.shutdown(ctx, clean=finished)


def train(ctx: DistContext, cfg: DictConfig, run_dir: Path, labels: dict[str, str]) -> nn.Module:
    """Build everything from `cfg`, train, report; return the trained (unwrapped) model."""
    from hydra.utils import instantiate

    start = time.perf_counter()
    trainer = cfg.trainer
    signals = parse_signals(trainer.preempt_signals, "trainer.preempt_signals")
    # From here on a preemption signal is noted, not fatal: the loop stops at an agreed step.
    preemption = PreemptionWatch(ctx, signals, trainer.preempt_check_every_n_steps or trainer.log_every_n_steps)
    torch.manual_seed(trainer.seed)  # the same initial weights on every rank
    loaders = build_loaders(cfg.dataset, cfg.data, ctx, trainer.batch_size, trainer.seed)
    net = models.build(cfg.model).to(ctx.device)
    if trainer.channels_last:
        net = net.to(memory_format=torch.channels_last)
    model = wrap(net, cfg.strategy, ctx, devices=_devices(trainer, ctx), compile=trainer.compile)
    optimizer = instantiate(cfg.optimizer, model.parameters())
    scheduler = instantiate(cfg.scheduler, optimizer) if cfg.scheduler.get("_target_") else None
    scaler = grad_scaler(trainer.precision, ctx.device)
    checkpointer = Checkpointer(
        ctx, run_dir / "checkpoints", model, optimizer, scheduler, OmegaConf.to_yaml(cfg), scaler=scaler
    )
    resume = find_resume(trainer.resume, run_dir)
    state = checkpointer.restore(resume) if resume else TrainState()
    log.info(
        "%s on %s: %s, world size %d (%s), global batch %d, from epoch %d%s",
        labels["model"], labels["dataset"], labels["strategy"], ctx.world_size, ctx.device.type,
        trainer.batch_size, state.epoch + 1, f" batch {state.batch + 1} ({resume})" if resume else "",
    )
    reporter = Reporter(ctx, run_dir)
    try:
        metrics = fit(
            model, optimizer, scheduler, loaders, ctx, trainer, state, reporter, checkpointer, scaler, preemption
        )
        if metrics:
            devices = _devices(trainer, ctx)
            final = {
                **metrics, **labels, "world_size": ctx.world_size, "devices": devices,
                "batch_size": trainer.batch_size, "wall_s": time.perf_counter() - start,
            }
            reporter.write_metrics(final)
            reporter.hparams(_options(cfg, labels, devices, ctx), final)
    finally:
        preemption.close()
        reporter.close()
    return unwrap(model)


def _devices(trainer: DictConfig, ctx: DistContext) -> int:
    """DDP runs one rank per device; DP drives all of them from one process."""
    return max(ctx.world_size, int(trainer.gpus or trainer.devices))


def _options(cfg: DictConfig, labels: dict[str, str], devices: int, ctx: DistContext) -> dict[str, Any]:
    """The choices that tell one sweep job from another, for TensorBoard's HParams tab."""
    trainer = cfg.trainer
    return {
        **labels,
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": cfg.optimizer.lr,
        "scheduler": cfg.scheduler.get("_target_", "none").rsplit(".", 1)[-1],
        "accelerator": ctx.device.type,
        "devices": devices,
        "batch_size": trainer.batch_size,
        "epochs": trainer.epochs,
        "seed": trainer.seed,
        "precision": trainer.precision,
    }
