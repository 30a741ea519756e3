"""The Trainer: the model and everything it trains with, as one object; fit -> train_epoch ->
step, and evaluate. Metrics are all-reduced; only rank 0 reports and saves."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from config.schema import NonFinite, TrainerConfig
from data import Loaders
from distributed.collectives import all_reduce_max
from distributed.context import DistContext, epoch_seed
from distributed.strategies import Strategy, for_evaluation, prepare_evaluation, unwrap
from errors import NonFiniteLoss
from training.callbacks import Callback, handling
from training.checkpoint import Checkpointer, TrainState, restore_rng
from training.ema import EMA
from training.loggers.base import Logger
from training.loss import Criterion
from training.metrics import Accumulator, Averages, Window, peak_memory_mb, samples_per_s
from training.mixing import Mixing
from training.precision import Precision
from training.preemption import PreemptionWatch
from training.schedule import Warmup

log = logging.getLogger("train")

_NO_BAD_STEP = 2**40  # a first non-finite step s is sent as _NO_BAD_STEP - s: a MAX over ranks finds the earliest


@dataclass
class Batches:
    """Where a batch goes and how many of them an epoch takes; `waited`: the seconds the last
    `take` spent waiting for its loader (the ImageNet example's data time)."""

    device: torch.device
    limit: int | None
    waited: float = 0.0

    def take(
        self,
        loader: Iterable,
        skip: int = 0,
        skipped: Callable[[], None] | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """`skipped` runs once the first `skip` batches are drawn, before the next one is: a
        DataLoader without workers draws its augmentations from the stream the steps draw from."""
        self.waited, resumed = 0.0, time.perf_counter()
        for i, (x, y) in enumerate(loader):
            self.waited += time.perf_counter() - resumed
            if self.limit is not None and i >= self.limit:
                return
            if i < skip:  # resuming mid-epoch: drawn in the same order, trained before the stop
                if i == skip - 1 and skipped is not None:
                    skipped()
            else:
                yield Loaders.to_device(loader, x, y, self.device)
            resumed = time.perf_counter()

    def count(self, loader: Any) -> int:
        return len(loader) if self.limit is None else min(len(loader), self.limit)


@dataclass(frozen=True)
class Optimization:
    """What the weights follow, and how: the criterion, the optimizer, its schedule (an LRScheduler,
    or a Warmup, which also steps after every optimizer step; None: a constant lr) and fp16's loss
    scaler (None: none)."""

    criterion: Criterion
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    scaler: torch.amp.GradScaler | None = None


@dataclass(frozen=True)
class Reporting:
    """Where the run's figures go: the loggers (rank 0's; none on the others) and the callbacks
    (every rank's, in order)."""

    loggers: Sequence[Logger] = ()
    callbacks: Sequence[Callback] = ()


class Trainer:
    def __init__(
        self,
        *,
        model: nn.Module,
        strategy: Strategy,
        optimization: Optimization,
        loaders: Loaders,
        checkpointer: Checkpointer,
        ctx: DistContext,
        settings: TrainerConfig,
        reporting: Reporting = Reporting(),
        state: TrainState | None = None,
        ema: EMA | None = None,
        mixing: Mixing | None = None,
        preemption: PreemptionWatch | None = None,
    ) -> None:
        """`model` is wrapped by `strategy` already; `settings` are read here, once, not per step."""
        self.model, self.strategy, self.ema, self.mixing = model, strategy, ema, mixing
        self.net = unwrap(model)  # what the EMA averages
        self.criterion, self.optimizer = optimization.criterion, optimization.optimizer
        self.scheduler = optimization.scheduler
        self.warmup = self.scheduler if isinstance(self.scheduler, Warmup) else None
        self.scaler = optimization.scaler or torch.amp.GradScaler(ctx.device.type, enabled=False)
        self.loaders, self.checkpointer, self.ctx, self.settings = loaders, checkpointer, ctx, settings
        self.loggers, self.callbacks = reporting.loggers, reporting.callbacks
        self.state = state or TrainState()
        self.preemption = preemption
        # What the step needs, resolved once: at 32 bits it enters no autocast, loss scaling or
        # no_sync context, as a hand-written loop would not; without clipping, a skip check or a
        # callback that wants it, nothing measures the gradients.
        self.precision = Precision.of(settings.precision, ctx.device)
        self.scaled = self.scaler.is_enabled()
        self.channels_last = settings.channels_last
        self.grad_clip = settings.grad_clip
        self.accumulate = settings.accumulate_grad_batches
        # Under fp16 the GradScaler skips a step whose gradients overflow and lowers its scale, as
        # it calibrates in the first steps and after each raise: no skip of ours to count or warn of.
        self.skip_check = settings.nonfinite == NonFinite.skip and not self.scaled
        self.gradient_callbacks = handling(self.callbacks, "after_backward")
        self.step_callbacks = handling(self.callbacks, "on_step_end")
        self.measure_gradients = self.grad_clip is not None or self.skip_check or bool(self.gradient_callbacks)
        self.ema_every = settings.ema_every_n_steps
        limit = settings.overfit_batches or settings.limit_train_batches
        self.train_batches = Batches(ctx.device, limit)
        self.val_batches = Batches(ctx.device, settings.overfit_batches or settings.limit_val_batches)
        self.window = Window()
        self.since_logged = Accumulator(ctx.device)  # the steps since the last log point (train/loss_window)
        self.skipped_steps = 0
        self._announced = False

    def fit(self) -> dict[str, Any]:
        """Train from `state.epoch` to `epochs` (or `max_steps`); return the final figures."""
        state, settings = self.state, self.settings
        speeds: list[float] = []  # each epoch's samples/s
        train = val = ema = memory = None
        started = time.perf_counter()
        while state.epoch < settings.epochs and not self._done():
            epoch = state.epoch
            train, speed = self.train_epoch()
            self._raise_if_nonfinite()
            # The slowest rank's wait for its batches: every rank's steps wait for that rank.
            waited = torch.tensor(self.train_batches.waited, dtype=torch.float64, device=self.ctx.device)
            data_s = all_reduce_max(waited, self.ctx).item()
            # trainer.max_steps may stop partway through: then the epoch stays unfinished and last.pt
            # is a mid-epoch checkpoint, as a preemption's is, so a resume trains the rest of it.
            batches = self.train_batches.count(self.loaders.train)
            finished = state.batch >= batches
            with self._random_stream_kept():
                val = self.evaluate(self.loaders.val)
                ema = self.evaluate(self.loaders.val, self.ema.module) if self.ema is not None else None
            speeds.append(speed)
            if finished:
                if self.scheduler is not None:
                    self.scheduler.step()
                state.epoch, state.batch, state.rng = epoch + 1, 0, None  # rng: unused if resumed at the epoch's end
            improved = self._note_best(val, ema)
            memory = peak_memory_mb(self.ctx)  # per device: DP's first card holds more
            scalars = {
                "train/loss": train.loss,  # the epoch's, as the log line and metrics.json's train_loss
                "train/acc": train.acc,
                "val/loss": val.loss,
                "val/ce": val.ce,
                "val/acc": val.acc,
                "val/acc5": val.acc5,
                "val/best_acc": state.best_val_acc,
                "throughput/samples_per_s": speed,
                "throughput/median_samples_per_s": samples_per_s(speeds),
                "time/train_s": time.perf_counter() - started,
                "time/data_s": data_s,
                **(
                    {"val_ema/loss": ema.loss, "val_ema/ce": ema.ce, "val_ema/acc": ema.acc, "val_ema/acc5": ema.acc5}
                    if ema
                    else {}
                ),
                **{f"memory/peak_mb/device{i}": mb for i, mb in enumerate(memory or [])},
            }
            with self._random_stream_kept():  # the sample grid's first batches come from a DataLoader
                for callback in self.callbacks:
                    callback.on_epoch_end(epoch, state.step, scalars)
            self._log(state.step, scalars)
            where = (
                f"epoch {epoch + 1}/{settings.epochs}"
                if finished
                else f"stopped at step {state.step} (trainer.max_steps) in epoch {epoch + 1} of {settings.epochs}, "
                f"after batch {state.batch} of {batches}"
            )
            log.info(
                "%s  train loss %.4f acc %.4f  val loss %.4f acc %.4f acc5 %.4f%s  best acc %.4f acc5 %.4f"
                "  %.0f samples/s  data wait %.2f s",
                where,
                train.loss,
                train.acc,
                val.loss,
                val.acc,
                val.acc5,
                f"  ema loss {ema.loss:.4f} acc {ema.acc:.4f} acc5 {ema.acc5:.4f}" if ema else "",
                state.best_val_acc,
                state.best_val_acc5,
                speed,
                data_s,
            )
            self.checkpointer.save(state, best=improved)  # mid-epoch: every rank's random stream as training left it
            more = state.epoch < settings.epochs and not self._done()
            if more and self.preemption is not None and self.preemption.should_stop(state.step, force=True):
                raise self.preemption.preempted()  # last.pt, just saved, holds this epoch's end
        if val is None:
            where = (
                f"is at step {state.step}, trainer.max_steps={settings.max_steps}"
                if self._done()
                else f"already finished epoch {state.epoch} of {settings.epochs}"
            )
            log.info("nothing to train: the checkpoint %s", where)
            return {}
        metrics = {
            "val_acc": val.acc,
            "val_acc5": val.acc5,
            "val_loss": val.loss,
            "val_ce": val.ce,
            **(
                {"val_ema_acc": ema.acc, "val_ema_acc5": ema.acc5, "val_ema_loss": ema.loss, "val_ema_ce": ema.ce}
                if ema
                else {}
            ),
            "best_val_acc": state.best_val_acc,
            "best_val_acc5": state.best_val_acc5,
            "best_weights": state.best_weights,
            "train_loss": train.loss,
            "train_acc": train.acc,
            "train_samples_per_s": samples_per_s(speeds),
            "peak_memory_mb": memory,  # one per device of the job; None on CPU
            "epochs": state.epoch,
            "steps": state.step,
            "nonfinite_steps_skipped": self.skipped_steps,
        }
        for callback in self.callbacks:
            callback.on_train_end(metrics)
        return metrics

    def train_epoch(self) -> tuple[Averages, float]:
        """One epoch. trainer.batch_size is the global batch of one micro-batch (as in Lightning):
        an optimizer step sees batch_size * accumulate_grad_batches samples, and state.step and
        max_steps count optimizer steps. The last group of an epoch may hold fewer micro-batches;
        it still steps, with the loss averaged over the micro-batches it has."""
        state, settings, ctx = self.state, self.settings, self.ctx
        self.loaders.train_sampler.set_epoch(state.epoch)
        torch.manual_seed(epoch_seed(settings.seed, state.epoch, ctx.rank))
        self.model.train()
        total = Accumulator(ctx.device)
        steps_in_window = 0
        num_batches, accumulate = self.train_batches.count(self.loaders.train), self.accumulate
        log_every, every = settings.log_every_n_steps, settings.checkpoint_every_n_steps
        bar = tqdm(
            total=num_batches - state.batch,
            desc=f"epoch {state.epoch + 1}",
            # None: tqdm draws on a terminal only, not into a SLURM log, a pipe or a file.
            disable=None if ctx.is_main and settings.progress_bar else True,
            leave=False,
            dynamic_ncols=True,
        )
        start = time.perf_counter()
        rng, state.rng = state.rng, None
        # Resumed mid-epoch: the random stream goes on where it stopped, from the first batch not yet trained.
        resumed = (lambda: restore_rng(rng, ctx)) if rng is not None else None
        batches = self.train_batches.take(self.loaders.train, state.batch, resumed)
        for i, (x, y) in enumerate(batches, start=state.batch):
            x, y, labels = self.mixing(x, y, state.epoch, i) if self.mixing is not None else (x, y, y)
            group_start = i - i % accumulate
            group_size = min(accumulate, num_batches - group_start)
            last_of_group = i == group_start + group_size - 1
            logits, loss = self.step(x, y, group_size, sync=last_of_group)
            self.window.update(loss, logits, labels, state.step + 1)
            bar.update()
            if not last_of_group:
                continue
            self.optimizer_step()
            state.step += 1
            if self.warmup is not None:
                self.warmup.step_update(state.step)
            if self.ema is not None and state.step % self.ema_every == 0:
                self.ema.update_parameters(self.net, state.epoch)
            for callback in self.step_callbacks:
                callback.on_step_end(state.step)
            state.batch = i + 1  # micro-batches of this epoch done: a mid-epoch resume skips them
            steps_in_window += 1
            if not self._announced:
                self._announced = True
                log.info("first optimizer step done")  # bench.startup stops its clock here
            if state.step % log_every == 0:
                window = self._report_window(total, bar)
                steps_in_window = 0
                if bar.disable and ctx.is_main:  # no bar (trainer.progress_bar=false, or no terminal): a line
                    log.info(
                        "step %d  epoch %d batch %d/%d  last %d steps: loss %.4f acc %.4f  lr %.4g",
                        state.step,
                        state.epoch + 1,
                        i + 1,
                        num_batches,
                        log_every,
                        window.loss,
                        window.acc,
                        self.optimizer.param_groups[0]["lr"],
                    )
            if self._done():
                break
            stop = self.preemption is not None and self.preemption.should_stop(state.step)
            if stop or (every and state.step % every == 0):
                self._raise_if_nonfinite()
                self.checkpointer.save(state)
            if stop:
                bar.close()
                raise self.preemption.preempted()
        if steps_in_window:  # the epoch's last steps: counted in its figures, logged at the next log point
            self._report_window(total, bar, log_point=False)
        elapsed = time.perf_counter() - start  # the all-reduce above synchronised the device
        bar.close()
        averages = total.averages()
        return averages, averages.samples / elapsed

    def step(self, x: torch.Tensor, y: torch.Tensor, group_size: int, sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch: forward (under autocast when mixed), backward of its share of the
        group's mean loss.

        Only the group's last micro-batch all-reduces gradients (DDP); the others accumulate
        locally under the strategy's no_sync, so accumulation costs no extra communication.
        """
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if sync:
            return self._forward_backward(x, y, group_size)
        with self.strategy.no_sync(self.model):
            return self._forward_backward(x, y, group_size)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.precision.dtype is None:
            logits = self.model(x)
            loss = self.criterion(logits, y)
        else:
            with self.precision.autocast():
                logits = self.model(x)
                loss = self.criterion(logits, y)
        share = loss / group_size if group_size > 1 else loss
        (self.scaler.scale(share) if self.scaled else share).backward()
        return logits, loss

    def optimizer_step(self) -> None:
        """Prepare the update where something needs the gradients measured, step (skipped by the
        scaler on fp16 overflow, and with trainer.nonfinite=skip on NaN/inf gradients), clear."""
        if self.measure_gradients and not self._prepare_update():
            self.optimizer.zero_grad()
            return
        if self.scaled:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        # Freed under DDP too: its reducer copies a fresh gradient into the bucket as it divides it
        # (one mul_out), where a kept bucket view costs a zero_, an add_ and a div_: kernels that a
        # launch-bound GPU step pays for (bench.gpu_profile).
        self.optimizer.zero_grad()

    def _prepare_update(self) -> bool:
        """The true (unscaled) gradients' total norm, measured once for the callbacks, clipping and
        the skip check; False: it is not finite under trainer.nonfinite=skip, so no update."""
        if self.scaled:
            self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        norm = nn.utils.get_total_norm([p.grad for p in parameters])
        if self.gradient_callbacks:
            whole = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP's: a DTensor of the shards
            for callback in self.gradient_callbacks:
                callback.after_backward(self.state.step + 1, self.model, whole)
        if self.grad_clip is not None:
            nn.utils.clip_grads_with_norm_(parameters, self.grad_clip, norm)
        # The norm is of the whole gradients (DDP's all-reduced, FSDP's shards together): every rank agrees.
        if self.skip_check and not torch.isfinite(norm).item():
            self.skipped_steps += 1
            log.warning("step %d: non-finite gradients, update skipped (trainer.nonfinite=skip)", self.state.step + 1)
            return False
        return True

    def evaluate(self, loader: Iterable, model: nn.Module | None = None) -> Averages:
        return evaluate(self.model if model is None else model, loader, self.val_batches, self.ctx, self.criterion)

    def _note_best(self, val: Averages, ema: Averages | None) -> bool:
        """The best accuracy of any weights evaluated (the model's, or the EMA's), and whose it was."""
        state = self.state
        state.best_val_acc5 = max(state.best_val_acc5, val.acc5, ema.acc5 if ema else -1.0)
        acc, weights = (ema.acc, "ema") if ema is not None and ema.acc > val.acc else (val.acc, "model")
        if acc <= state.best_val_acc:
            return False
        state.best_val_acc, state.best_weights = acc, weights
        return True

    def _raise_if_nonfinite(self) -> None:
        """Before anything is saved, and at each report: every rank learns the earliest bad step."""
        if self.settings.nonfinite == NonFinite.skip:
            return
        first = self.window.first_nonfinite()
        marker = torch.tensor(_NO_BAD_STEP - first if first is not None else 0, device=self.ctx.device)
        worst = int(all_reduce_max(marker, self.ctx).item())
        if worst:
            raise NonFiniteLoss(_NO_BAD_STEP - worst)

    def _report_window(self, total: Accumulator, bar: tqdm, log_point: bool = True) -> Averages | None:
        """The steps since the last report, over all ranks, into the epoch's figures (`total`); at a
        log point (every trainer.log_every_n_steps steps, across epochs), those since the last one to
        the loggers, as train/loss_window and train/acc_window (train/loss is the epoch's), and the bar."""
        self._raise_if_nonfinite()
        window = self.window.drain(self.ctx.device).all_reduce(self.ctx)
        total.add(window)
        self.since_logged.add(window)
        if not log_point:
            return None
        averages, self.since_logged = self.since_logged.averages(), Accumulator(self.ctx.device)
        lr = float(f"{self.optimizer.param_groups[0]['lr']:.6g}")  # as a schedule means it, without float noise
        self._log(self.state.step, {"train/loss_window": averages.loss, "train/acc_window": averages.acc, "lr": lr})
        bar.set_postfix(loss=f"{averages.loss:.4f}", acc=f"{averages.acc:.3f}", refresh=False)
        return averages

    def _log(self, step: int, values: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log_scalars(step, values)

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.state.step >= self.settings.max_steps

    @staticmethod
    def _random_stream_kept() -> contextlib.AbstractContextManager:
        """Validation and the epoch's callbacks draw from a copy of the host's random stream (a
        DataLoader takes its base seed from it; nothing there draws on a GPU): a mid-epoch checkpoint
        saved afterwards holds the stream the training left."""
        return torch.random.fork_rng(devices=[])


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, batches: Batches, ctx: DistContext, criterion: Criterion) -> Averages:
    """The criterion's loss, accuracy, top-5 and cross-entropy over every rank's validation shard,
    summed across ranks."""
    net = for_evaluation(model)
    net.eval()
    sums = Accumulator(ctx.device, validation=True)
    padding = prepare_evaluation(net, batches.count(loader), ctx)  # FSDP: every forward takes all ranks
    for x, y in batches.take(loader):
        sums.update_validation(net(x), y, criterion)
    for _ in range(padding):
        net(x[:0])
    net.train()
    return sums.all_reduce(ctx).averages()
