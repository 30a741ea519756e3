"""The Trainer: the model and everything it trains with, as one object. `fit` runs the epochs,
`train_epoch` the optimizer steps, `step` one micro-batch: the training math. When to report, to
validate, to save and to stop is asked of their owners: Progress (training/progress.py), validation
(training/validation.py) and the callbacks, the Checkpointer and its best checkpoints
(training/checkpoint/), the preemption watch (training/preemption.py). Metrics are all-reduced; only
rank 0 reports and saves."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from config.schema import NonFinite, TrainerConfig
from data import Loaders
from distributed.collectives import all_reduce_max
from distributed.context import DistContext, epoch_seed
from distributed.strategies import Strategy, unwrap
from errors import NonFiniteLoss
from training import validation
from training.batches import Batches
from training.callbacks import Callback, end_validation, handling
from training.checkpoint.cadence import SaveCadence
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.state import TrainState, restore_rng
from training.ema import EMA
from training.loggers.base import Logger
from training.loss import Criterion
from training.metrics import Accumulator, Averages, Window, peak_memory_mb, samples_per_s
from training.mixing import Mixing
from training.precision import Precision
from training.preemption import PreemptionWatch
from training.progress import Progress
from training.scheduler import Warmup

log = logging.getLogger("train")

_NO_BAD_STEP = 2**40  # a first non-finite step s is sent as _NO_BAD_STEP - s: a MAX over ranks finds the earliest


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
        self.callbacks = reporting.callbacks
        self.progress = Progress(ctx, settings, reporting.loggers)
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
        self.batch_callbacks = handling(self.callbacks, "on_validation_batch_end")
        self.added = [name for callback in self.callbacks for name in callback.figures]  # to the line and metrics.json
        self.measure_gradients = self.grad_clip is not None or self.skip_check or bool(self.gradient_callbacks)
        self.ema_every = settings.ema_every_n_steps
        self.saves = SaveCadence(
            settings.checkpoint_every_n_steps, settings.checkpoint_every_n_seconds, agreed=ctx.distributed
        )
        if preemption is not None:
            preemption.carry(self.saves)  # rank 0's clock, agreed at the watch's checks
        limit = settings.overfit_batches or settings.limit_train_batches
        self.train_batches = Batches(ctx.device, limit)
        self.val_batches = Batches(ctx.device, settings.overfit_batches or settings.limit_val_batches)
        self.window = Window()
        # the steps since the last log point (train/loss_window), a resumed run's from its checkpoint
        self.since_logged = _sums(self.state.window_sums, ctx.device)
        self.epoch_total = Accumulator(ctx.device)  # the epoch's steps reported so far (train/loss)
        self.skipped_steps = 0
        self._start_clock()

    def fit(self) -> dict[str, Any]:
        """Train from `state.epoch` to `epochs` (or `max_steps`, or until a callback stops it);
        return the final figures."""
        state, settings = self.state, self.settings
        if state.stopped:
            log.info("nothing to train: the run stopped early, at epoch %d (%s)", state.epoch, state.stopped)
            return {}
        speeds = state.speeds  # each epoch's samples/s, a resumed run's earlier ones first
        train = figures = None
        self._start_clock()
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
            if not math.isnan(speed):
                speeds.append(speed)
            with self._random_stream_kept():
                figures = self.validate()
            if finished:
                if self.scheduler is not None:
                    self.scheduler.step()
                state.epoch, state.batch, state.rng = epoch + 1, 0, None  # rng: unused if resumed at the epoch's end
            self._note_best(figures)
            figures.update(zip(validation.TRAIN_FIGURES, (train.loss, train.acc), strict=True))
            epoch_figures = (
                state.best_val_acc,
                state.best_val_acc5,
                speed,
                samples_per_s(speeds),
                self._clock(),
                data_s,
            )
            figures.update(zip(validation.EPOCH_FIGURES, epoch_figures, strict=True))
            figures.update((f"memory/peak_mb/device{i}", mb) for i, mb in enumerate(peak_memory_mb(self.ctx) or []))
            with self._random_stream_kept():  # the sample grid's first batches come from a DataLoader
                state.stopped = end_validation(self.callbacks, epoch, state.step, figures, self.ctx)
            self.progress.log(state.step, figures)
            where = (
                f"epoch {epoch + 1}/{settings.epochs}"
                if finished
                else f"stopped at step {state.step} (trainer.max_steps) in epoch {epoch + 1} of {settings.epochs}, "
                f"after batch {state.batch} of {batches}"
            )
            # mid-epoch: every rank's random stream as training left it
            self._save(*self._monitored(figures))
            self.saves.saved()
            self.progress.epoch_line(where, train, figures, self.added, self._ranked_best())
            if state.stopped:
                log.info("stopping early at step %d: %s; last.pt is saved", state.step, state.stopped)
                break
            more = state.epoch < settings.epochs and not self._done()
            if more and self.preemption is not None and self.preemption.should_stop(state.step, force=True):
                raise self.preemption.preempted()  # last.pt, just saved, holds this epoch's end
        if figures is None:
            where = (
                f"is at step {state.step}, trainer.max_steps={settings.max_steps}"
                if self._done()
                else f"already finished epoch {state.epoch} of {settings.epochs}"
            )
            log.info("nothing to train: the checkpoint %s", where)
            return {}
        validated = [f"{weights}/{name}" for weights in ("val", "val_ema") for name in validation.FIGURES]
        metrics = {
            **{name.replace("/", "_"): figures[name] for name in [*validated, *self.added] if name in figures},
            "best_val_acc": state.best_val_acc,
            "best_val_acc5": state.best_val_acc5,
            "best_weights": state.best_weights,
            "train_loss": train.loss,
            "train_acc": train.acc,
            "train_samples_per_s": samples_per_s(speeds),
            "peak_memory_mb": peak_memory_mb(self.ctx),  # one per device of the job; None on CPU
            "epochs": state.epoch,
            "steps": state.step,
            "nonfinite_steps_skipped": self.skipped_steps,
            **({"stopped_early": state.stopped} if state.stopped else {}),
        }
        for callback in self.callbacks:
            callback.on_train_end(metrics)
        return metrics

    def validate(self) -> dict[str, float]:
        """The epoch's validation figures: the model's (its batches to the callbacks), and the EMA's."""
        val = self.evaluate(self.loaders.val, callbacks=self.batch_callbacks)
        figures = validation.figures(val, "val/")
        if self.ema is not None:
            figures.update(validation.figures(self.evaluate(self.loaders.val, self.ema.module), "val_ema/"))
        return figures

    def train_epoch(self) -> tuple[Averages, float]:
        """One epoch. trainer.batch_size is the global batch of one micro-batch (as in Lightning):
        an optimizer step sees batch_size * accumulate_grad_batches samples, and state.step and
        max_steps count optimizer steps. The last group of an epoch may hold fewer micro-batches;
        it still steps, with the loss averaged over the micro-batches it has."""
        state, settings, ctx = self.state, self.settings, self.ctx
        self.loaders.train_sampler.set_epoch(state.epoch)
        torch.manual_seed(epoch_seed(settings.seed, state.epoch, ctx.rank))
        self.model.train()
        # Resumed mid-epoch: the batches trained before the checkpoint count in the epoch's figures too.
        carried = state.epoch_sums if state.batch else None
        total = self.epoch_total = _sums(carried, ctx.device)
        carried_samples = int(carried[2]) if carried else 0  # trained by the process that saved them
        state.epoch_sums = None
        steps_in_window = 0
        num_batches, accumulate = self.train_batches.count(self.loaders.train), self.accumulate
        self.progress.start_epoch(state.epoch, num_batches, state.batch)
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
            self.progress.batch_done()
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
            if self.progress.due(state.step):
                self._report_window(total, f"epoch {state.epoch + 1} batch {i + 1}/{num_batches}")
                steps_in_window = 0
            if self._done():
                break
            stop = self.preemption is not None and self.preemption.should_stop(state.step)
            if stop or self.saves.due(state.step):
                self._report_window(total, log_point=False)  # into the sums the checkpoint holds
                steps_in_window = 0
                self._save()
                self.saves.saved()
            if stop:
                self.progress.end_epoch()
                raise self.preemption.preempted()
        if steps_in_window:  # the epoch's last steps: counted in its figures, logged at the next log point
            self._report_window(total, log_point=False)
        elapsed = time.perf_counter() - start  # the all-reduce above synchronised the device
        self.progress.end_epoch()
        averages = total.averages()
        # This process's samples over its time: none trained (resumed at the epoch's end), no speed.
        trained = averages.samples - carried_samples
        return averages, trained / elapsed if trained else math.nan

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

    def evaluate(self, loader: Any, model: nn.Module | None = None, callbacks: Sequence[Callback] = ()) -> Averages:
        model = self.model if model is None else model
        return validation.evaluate(model, loader, self.val_batches, self.ctx, self.criterion, callbacks)

    def _note_best(self, figures: dict[str, float]) -> None:
        """The best accuracy of any weights evaluated (the model's, or the EMA's), and whose it was."""
        state = self.state
        acc, acc5 = figures["val/acc"], figures["val/acc5"]
        ema_acc = figures.get("val_ema/acc", -1.0)
        state.best_val_acc5 = max(state.best_val_acc5, acc5, figures.get("val_ema/acc5", -1.0))
        acc, weights = (ema_acc, "ema") if ema_acc > acc else (acc, "model")
        if acc > state.best_val_acc:
            state.best_val_acc, state.best_weights = acc, weights

    def _monitored(self, figures: dict[str, float]) -> tuple[float | None, str]:
        """The best checkpoints' monitored figure (trainer.checkpoint.monitor) and whose weights scored
        it: of a val/ figure, the better of the model's and the EMA's (val_ema/), as a checkpoint
        holds both. None where no checkpoints are ranked."""
        ranking = self.checkpointer.best
        if ranking is None:
            return None, "model"
        monitor = ranking.monitor
        value, weights = figures[monitor.name], "model"
        ema = "val_ema/" + monitor.name.removeprefix("val/") if monitor.name.startswith("val/") else None
        if ema in figures and monitor.improves(figures[ema], value):
            value, weights = figures[ema], "ema"
        return value, weights

    def _ranked_best(self) -> tuple[str, float] | None:
        """The figure the best checkpoints are ranked by, and its best so far, where the epoch's line
        would not show it already (its best acc is val/acc's)."""
        ranking = self.checkpointer.best
        if ranking is None or ranking.best is None or ranking.monitor.name == "val/acc":
            return None
        return ranking.monitor.name, ranking.best.value

    def _raise_if_nonfinite(self) -> None:
        """Before anything is saved, and at each report: every rank learns the earliest bad step."""
        if self.settings.nonfinite == NonFinite.skip:
            return
        first = self.window.first_nonfinite()
        marker = torch.tensor(_NO_BAD_STEP - first if first is not None else 0, device=self.ctx.device)
        worst = int(all_reduce_max(marker, self.ctx).item())
        if worst:
            raise NonFiniteLoss(_NO_BAD_STEP - worst)

    def _report_window(self, total: Accumulator, where: str | None = None, log_point: bool = True) -> None:
        """The steps since the last report, over all ranks, into the epoch's figures (`total`); at a
        log point (every trainer.log_every_n_steps steps, across epochs), those since the last one to
        the loggers and the bar, as train/loss_window and train/acc_window (train/loss is the epoch's)."""
        self._raise_if_nonfinite()
        window = self.window.drain(self.ctx.device).all_reduce(self.ctx)
        total.add(window)
        self.since_logged.add(window)
        if not log_point:
            return
        averages, self.since_logged = self.since_logged.averages(), Accumulator(self.ctx.device)
        self.progress.report(self.state.step, averages, self.optimizer.param_groups[0]["lr"], where)

    def _start_clock(self) -> None:
        """time/train_s counts on from the checkpoint's: a resume's curve and final figure are the run's."""
        self._clock_started = time.perf_counter() - self.state.train_s

    def _clock(self) -> float:
        return time.perf_counter() - self._clock_started

    def _save(self, value: float | None = None, weights: str = "model") -> None:
        """last.pt (and the best), with the run's clock and the training figures' sums so far."""
        state = self.state
        state.train_s = self._clock()
        state.epoch_sums = self.epoch_total.sums.tolist() if state.batch else None  # mid-epoch
        state.window_sums = self.since_logged.sums.tolist()
        self.checkpointer.save(state, value, weights)

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.state.step >= self.settings.max_steps

    @staticmethod
    def _random_stream_kept() -> contextlib.AbstractContextManager:
        """Validation and the epoch's callbacks draw from a copy of the host's random stream (a
        DataLoader takes its base seed from it; nothing there draws on a GPU): a mid-epoch checkpoint
        saved afterwards holds the stream the training left."""
        return torch.random.fork_rng(devices=[])


def _sums(saved: list[float] | None, device: torch.device) -> Accumulator:
    """An Accumulator holding a checkpoint's sums (none: empty)."""
    sums = Accumulator(device)
    if saved is not None:
        sums.sums = torch.tensor(saved, dtype=torch.float64, device=device)
    return sums
