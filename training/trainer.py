"""The Trainer: the model and everything it trains with, as one object; fit -> train_epoch ->
step, and evaluate. Metrics are all-reduced; only rank 0 reports and saves."""
from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from config.schema import NonFinite, TrainerConfig
from data import Loaders
from distributed.collectives import all_reduce_max
from distributed.context import DistContext, epoch_seed
from distributed.strategies import Strategy, prepare_evaluation, unwrap
from errors import NonFiniteLoss
from training.checkpoint import Checkpointer, TrainState, restore_rng
from training.metrics import Accumulator, Averages, peak_memory_mb
from training.precision import Precision
from training.preemption import PreemptionWatch
from training.reporting import Reporter

log = logging.getLogger("train")

_NO_BAD_STEP = 2**40  # first non-finite step s is kept as _NO_BAD_STEP - s: a MAX over ranks finds the earliest


@dataclass
class Batches:
    """Where a batch goes and how many of them an epoch takes."""

    device: torch.device
    limit: int | None

    def take(self, loader: Iterable, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, (x, y) in enumerate(loader):
            if self.limit is not None and i >= self.limit:
                return
            if i < skip:  # resuming mid-epoch: drawn in the same order, trained before the stop
                continue
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def count(self, loader: Any) -> int:
        return len(loader) if self.limit is None else min(len(loader), self.limit)


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        strategy: Strategy,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        loaders: Loaders,
        checkpointer: Checkpointer,
        reporter: Reporter,
        scaler: torch.amp.GradScaler,
        ctx: DistContext,
        settings: TrainerConfig,
        state: TrainState | None = None,
        preemption: PreemptionWatch | None = None,
    ) -> None:
        """`model` is wrapped by `strategy` already; `settings` are read here, once, not per step."""
        self.model, self.strategy, self.optimizer, self.scheduler = model, strategy, optimizer, scheduler
        self.loaders, self.checkpointer, self.reporter, self.ctx = loaders, checkpointer, reporter, ctx
        self.state = state or TrainState()
        self.preemption = preemption
        self.settings = settings
        self.precision = Precision.of(settings.precision, ctx.device)
        self.scaler = scaler
        self.channels_last = settings.channels_last
        self.grad_clip = settings.grad_clip
        self.accumulate = settings.accumulate_grad_batches
        self.skip_nonfinite = settings.nonfinite == NonFinite.skip
        limit = settings.overfit_batches or settings.limit_train_batches
        self.train_batches = Batches(ctx.device, limit)
        self.val_batches = Batches(ctx.device, settings.overfit_batches or settings.limit_val_batches)
        self._first_bad = torch.zeros((), dtype=torch.int64, device=ctx.device)
        self.skipped_steps = 0

    def fit(self) -> dict[str, Any]:
        """Train from `state.epoch` to `epochs` (or `max_steps`); return the final figures."""
        state, settings = self.state, self.settings
        samples_per_s: list[float] = []
        train = val = memory = None
        while state.epoch < settings.epochs and not self._done():
            epoch = state.epoch
            train, speed = self.train_epoch()
            self._raise_if_nonfinite()
            val = self.evaluate(self.loaders.val)
            samples_per_s.append(speed)
            if self.scheduler is not None:
                self.scheduler.step()
            state.epoch, state.batch, state.rng = epoch + 1, 0, None  # rng: unused if resumed at the epoch's end
            improved = val.acc > state.best_val_acc
            state.best_val_acc = max(state.best_val_acc, val.acc)
            memory = peak_memory_mb(self.ctx)  # per device: DP's first card holds more
            self.reporter.scalars(
                state.step,
                {
                    "val/loss": val.loss, "val/acc": val.acc, "throughput/samples_per_s": speed,
                    **{f"memory/peak_mb/device{i}": mb for i, mb in enumerate(memory or [])},
                },
            )
            self.reporter.samples(state.step, self.model, self.loaders.val)
            log.info(
                "epoch %d/%d  train loss %.4f acc %.4f  val loss %.4f acc %.4f  %.0f samples/s",
                epoch + 1, settings.epochs, train.loss, train.acc, val.loss, val.acc, speed,
            )
            if improved:
                self.checkpointer.save_best(state)
            self.checkpointer.save("last.pt", state)
            more = state.epoch < settings.epochs and not self._done()
            if more and self.preemption is not None and self.preemption.should_stop(state.step, force=True):
                raise self.preemption.preempted()  # last.pt, just saved, holds this epoch's end
        if val is None:
            log.info("nothing to train: the checkpoint already finished epoch %d of %d", state.epoch, settings.epochs)
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
            "nonfinite_steps_skipped": self.skipped_steps,
        }

    def train_epoch(self) -> tuple[Averages, float]:
        """One epoch. trainer.batch_size is the global batch of one micro-batch (as in Lightning):
        an optimizer step sees batch_size * accumulate_grad_batches samples, and state.step and
        max_steps count optimizer steps. The last group of an epoch may hold fewer micro-batches;
        it still steps, with the loss averaged over the micro-batches it has."""
        state, settings, ctx = self.state, self.settings, self.ctx
        self.loaders.train_sampler.set_epoch(state.epoch)
        torch.manual_seed(epoch_seed(settings.seed, state.epoch, ctx.rank))
        self.model.train()
        window, total = Accumulator(ctx.device), Accumulator(ctx.device)
        steps_in_window = 0
        num_batches, accumulate = self.train_batches.count(self.loaders.train), self.accumulate
        bar = tqdm(
            total=num_batches - state.batch,
            desc=f"epoch {state.epoch + 1}",
            disable=not (ctx.is_main and settings.progress_bar),
            leave=False,
            dynamic_ncols=True,
        )
        start = time.perf_counter()
        for i, (x, y) in enumerate(self.train_batches.take(self.loaders.train, skip=state.batch), start=state.batch):
            if state.rng is not None:  # resumed mid-epoch: continue the random stream where it stopped
                restore_rng(state.rng, ctx)
                state.rng = None
            group_start = i - i % accumulate
            group_size = min(accumulate, num_batches - group_start)
            last_of_group = i == group_start + group_size - 1
            logits, loss = self.step(x, y, group_size, sync=last_of_group)
            finite = self._note_finite(loss)
            window.update(loss, logits, y, finite)
            bar.update()
            if not last_of_group:
                continue
            self.optimizer_step()
            state.step += 1
            state.batch = i + 1  # micro-batches of this epoch done: a mid-epoch resume skips them
            steps_in_window += 1
            if state.step % settings.log_every_n_steps == 0:
                self._report_window(window, total, bar)
                steps_in_window = 0
            if self._done():
                break
            stop = self.preemption is not None and self.preemption.should_stop(state.step)
            every = settings.checkpoint_every_n_steps
            if stop or (every and state.step % every == 0):
                self._raise_if_nonfinite()
                self.checkpointer.save("last.pt", state)
            if stop:
                bar.close()
                raise self.preemption.preempted()
        if steps_in_window:
            self._report_window(window, total, bar)
        elapsed = time.perf_counter() - start  # the all-reduce above synchronised the device
        bar.close()
        averages = total.averages()
        return averages, averages.samples / elapsed

    def step(self, x: torch.Tensor, y: torch.Tensor, group_size: int, sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch: forward under autocast, backward of its share of the group's mean loss.

        Only the group's last micro-batch all-reduces gradients (DDP); the others accumulate
        locally under the strategy's no_sync, so accumulation costs no extra communication.
        """
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.strategy.no_sync(self.model) if not sync else contextlib.nullcontext():
            with self.precision.autocast():
                logits = self.model(x)
                loss = F.cross_entropy(logits, y)
            self.scaler.scale(loss / group_size if group_size > 1 else loss).backward()
        return logits, loss

    def optimizer_step(self) -> None:
        """Clip the true (unscaled) gradients, step (skipped by the scaler on fp16 overflow, and
        with trainer.nonfinite=skip on NaN/inf gradients), clear."""
        if self.grad_clip is not None or self.skip_nonfinite:
            self.scaler.unscale_(self.optimizer)
            parameters = [p for p in self.model.parameters() if p.grad is not None]
            if self.grad_clip is not None:
                norm = nn.utils.clip_grad_norm_(parameters, self.grad_clip)
            else:
                norm = nn.utils.get_total_norm([p.grad for p in parameters])
            # After DDP's all-reduce every rank holds the same gradients, so every rank agrees.
            if self.skip_nonfinite and not torch.isfinite(norm).item():
                self.skipped_steps += 1
                log.warning("step %d: non-finite gradients, update skipped (trainer.nonfinite=skip)", self.state.step + 1)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=self.strategy.zero_grad_to_none)
                return
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.strategy.zero_grad_to_none)

    def evaluate(self, loader: Iterable) -> Averages:
        return evaluate(self.model, loader, self.val_batches, self.ctx)

    def _note_finite(self, loss: torch.Tensor) -> torch.Tensor | None:
        """stop: remember the first non-finite step on the device (checked where the loop syncs
        anyway); skip: the mask that keeps the micro-batch out of the reported averages."""
        finite = torch.isfinite(loss.detach())
        if self.skip_nonfinite:
            return finite
        marker = _NO_BAD_STEP - (self.state.step + 1)
        self._first_bad = torch.where(finite | (self._first_bad > 0), self._first_bad, marker)
        return None

    def _raise_if_nonfinite(self) -> None:
        """Before anything is saved, and at each report: every rank learns the earliest bad step."""
        if self.skip_nonfinite:
            return
        first = int(all_reduce_max(self._first_bad.clone(), self.ctx).item())
        if first:
            raise NonFiniteLoss(_NO_BAD_STEP - first)

    def _report_window(self, window: Accumulator, total: Accumulator, bar: tqdm) -> None:
        window.all_reduce(self.ctx)
        self._raise_if_nonfinite()
        total.add(window)
        averages = window.averages()
        window.reset()
        lr = self.optimizer.param_groups[0]["lr"]
        self.reporter.scalars(self.state.step, {"train/loss": averages.loss, "train/acc": averages.acc, "lr": lr})
        bar.set_postfix(loss=f"{averages.loss:.4f}", acc=f"{averages.acc:.3f}", refresh=False)

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.state.step >= self.settings.max_steps




@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, batches: Batches, ctx: DistContext) -> Averages:
    """Loss and accuracy over every rank's validation shard, summed across ranks."""
    net = unwrap(model)  # DDP's forward would try to sync buffers; shards may differ in length
    net.eval()
    sums = Accumulator(ctx.device)
    padding = prepare_evaluation(net, batches.count(loader), ctx)  # FSDP: every forward takes all ranks
    for x, y in batches.take(loader):
        logits = net(x)
        sums.update(F.cross_entropy(logits, y), logits, y)
    for _ in range(padding):
        net(x[:0])
    net.train()
    return sums.all_reduce(ctx).averages()
