"""Epochs of training and evaluation. Metrics are all-reduced; only rank 0 reports and saves."""
from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data import Loaders
from distributed.context import DistContext, epoch_seed
from distributed.strategy import devices_of, unwrap
from training.checkpoint import Checkpointer, TrainState, restore_rng
from training.metrics import Accumulator, Averages, peak_memory_mb
from training.precision import autocast
from training.preemption import PreemptionWatch
from training.reporting import Reporter

log = logging.getLogger("train")


@dataclass
class Batches:
    """Where a batch goes and how many of them an epoch takes."""

    ctx: DistContext
    limit: int | None

    def take(self, loader: Any, skip: int = 0):
        for i, (x, y) in enumerate(loader):
            if self.limit is not None and i >= self.limit:
                return
            if i < skip:  # resuming mid-epoch: drawn in the same order, trained before the stop
                continue
            yield x.to(self.ctx.device, non_blocking=True), y.to(self.ctx.device, non_blocking=True)

    def count(self, loader: Any) -> int:
        return len(loader) if self.limit is None else min(len(loader), self.limit)


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loaders: Loaders,
    ctx: DistContext,
    trainer: Any,
    state: TrainState,
    reporter: Reporter,
    checkpointer: Checkpointer,
    scaler: torch.amp.GradScaler,
    preemption: PreemptionWatch | None = None,
) -> dict[str, Any]:
    """Train from `state.epoch` to `trainer.epochs` (or `max_steps`); return the final figures."""
    samples_per_s: list[float] = []
    train = val = memory = None
    while state.epoch < trainer.epochs and not _done(state, trainer):
        epoch = state.epoch
        train, speed = train_epoch(
            model, optimizer, loaders, ctx, trainer, state, reporter, checkpointer, scaler, preemption
        )
        val = evaluate(model, loaders.val, Batches(ctx, trainer.limit_val_batches), ctx)
        samples_per_s.append(speed)
        if scheduler is not None:
            scheduler.step()
        state.epoch, state.batch, state.rng = epoch + 1, 0, None  # rng: unused if resumed at the epoch's end
        improved = val.acc > state.best_val_acc
        state.best_val_acc = max(state.best_val_acc, val.acc)
        memory = peak_memory_mb(devices_of(model, ctx), ctx)  # per device: DP's first card holds more
        reporter.scalars(
            state.step,
            {
                "val/loss": val.loss, "val/acc": val.acc, "throughput/samples_per_s": speed,
                **{f"memory/peak_mb/device{i}": mb for i, mb in enumerate(memory or [])},
            },
        )
        reporter.samples(state.step, model, loaders.val)
        log.info(
            "epoch %d/%d  train loss %.4f acc %.4f  val loss %.4f acc %.4f  %.0f samples/s",
            epoch + 1, trainer.epochs, train.loss, train.acc, val.loss, val.acc, speed,
        )
        if improved:
            checkpointer.save_best(state)
        checkpointer.save("last.pt", state)
        more = state.epoch < trainer.epochs and not _done(state, trainer)
        if more and preemption is not None and preemption.should_stop(state.step, force=True):
            raise preemption.preempted()  # last.pt, just saved, holds this epoch's end
    if val is None:
        log.info("nothing to train: the checkpoint already finished epoch %d of %d", state.epoch, trainer.epochs)
        return {}
    # The first epoch pays for warm-up (allocator, lazy init); report the steady state after it.
    steady = samples_per_s[1:] or samples_per_s
    return {
        "val_acc": val.acc,
        "val_loss": val.loss,
        "best_val_acc": state.best_val_acc,
        "train_loss": train.loss,
        "train_acc": train.acc,
        "train_samples_per_s": statistics.median(steady),
        "peak_memory_mb": memory,  # one per device of the job; None on CPU
        "epochs": state.epoch,
        "steps": state.step,
    }


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loaders: Loaders,
    ctx: DistContext,
    trainer: Any,
    state: TrainState,
    reporter: Reporter,
    checkpointer: Checkpointer,
    scaler: torch.amp.GradScaler,
    preemption: PreemptionWatch | None = None,
) -> tuple[Averages, float]:
    """One epoch. trainer.batch_size is the global batch of one micro-batch (as in Lightning):
    an optimizer step sees batch_size * accumulate_grad_batches samples, and state.step and
    max_steps count optimizer steps. The last group of an epoch may hold fewer micro-batches;
    it still steps, with the loss averaged over the micro-batches it has."""
    loaders.train_sampler.set_epoch(state.epoch)
    torch.manual_seed(epoch_seed(trainer.seed, state.epoch, ctx.rank))
    model.train()
    batches = Batches(ctx, trainer.limit_train_batches)
    window, total = Accumulator(ctx.device), Accumulator(ctx.device)
    steps_in_window = 0
    num_batches, accumulate = batches.count(loaders.train), trainer.accumulate_grad_batches
    bar = tqdm(
        total=batches.count(loaders.train) - state.batch,
        desc=f"epoch {state.epoch + 1}",
        disable=not (ctx.is_main and trainer.progress_bar),
        leave=False,
        dynamic_ncols=True,
    )
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches.take(loaders.train, skip=state.batch), start=state.batch):
        if state.rng is not None:  # resumed mid-epoch: continue the random stream where it stopped
            restore_rng(state.rng)
            state.rng = None
        group_start = i - i % accumulate
        group_size = min(accumulate, num_batches - group_start)
        last_of_group = i == group_start + group_size - 1
        logits, loss = forward_backward(model, x, y, trainer, scaler, group_size, sync=last_of_group)
        window.update(loss, logits, y)
        bar.update()
        if not last_of_group:
            continue
        optimizer_step(model, optimizer, scaler, trainer.grad_clip)
        state.step += 1
        state.batch = i + 1  # micro-batches of this epoch done: a mid-epoch resume skips them
        steps_in_window += 1
        if state.step % trainer.log_every_n_steps == 0:
            _report_window(window, total, ctx, reporter, state.step, optimizer, bar)
            steps_in_window = 0
        if _done(state, trainer):
            break
        stop = preemption is not None and preemption.should_stop(state.step)
        every = trainer.checkpoint_every_n_steps
        if stop or (every and state.step % every == 0):
            checkpointer.save("last.pt", state)
        if stop:
            bar.close()
            raise preemption.preempted()
    if steps_in_window:
        _report_window(window, total, ctx, reporter, state.step, optimizer, bar)
    elapsed = time.perf_counter() - start  # the all-reduce above synchronised the device
    bar.close()
    averages = total.averages()
    return averages, averages.samples / elapsed


def forward_backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, trainer: Any, scaler: torch.amp.GradScaler,
    group_size: int, sync: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch: forward under autocast, backward of its share of the group's mean loss.

    DDP all-reduces gradients only on the group's last micro-batch; the others accumulate
    locally under no_sync(), so accumulation costs no extra communication.
    """
    if trainer.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    skip_sync = isinstance(model, DistributedDataParallel) and not sync
    with model.no_sync() if skip_sync else contextlib.nullcontext():
        with autocast(trainer.precision, x.device):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(loss / group_size).backward()
    return logits, loss


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, grad_clip: float | None
) -> None:
    """Clip the true (unscaled) gradients, step (skipped by the scaler on fp16 overflow), clear."""
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def _report_window(
    window: Accumulator, total: Accumulator, ctx: DistContext, reporter: Reporter, step: int, optimizer, bar
) -> None:
    window.all_reduce(ctx)
    total.add(window)
    averages = window.averages()
    window.reset()
    lr = optimizer.param_groups[0]["lr"]
    reporter.scalars(step, {"train/loss": averages.loss, "train/acc": averages.acc, "lr": lr})
    bar.set_postfix(loss=f"{averages.loss:.4f}", acc=f"{averages.acc:.3f}", refresh=False)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any, batches: Batches, ctx: DistContext) -> Averages:
    """Loss and accuracy over every rank's validation shard, summed across ranks."""
    net = unwrap(model)  # DDP's forward would try to sync buffers; shards may differ in length
    net.eval()
    sums = Accumulator(ctx.device)
    for x, y in batches.take(loader):
        logits = net(x)
        sums.update(F.cross_entropy(logits, y), logits, y)
    net.train()
    return sums.all_reduce(ctx).averages()


def _done(state: TrainState, trainer: Any) -> bool:
    return trainer.max_steps is not None and state.step >= trainer.max_steps
