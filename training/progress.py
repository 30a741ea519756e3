"""What a run shows while it trains, and when: rank 0's progress bar (on a terminal), the training
figures every trainer.log_every_n_steps (to the loggers, and to the log where no bar is drawn), and
each epoch's figures and line."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from tqdm import tqdm

from config.schema import TrainerConfig
from distributed.context import DistContext
from training.loggers.base import Logger
from training.metrics import Averages

log = logging.getLogger("train")


class Progress:
    def __init__(self, ctx: DistContext, settings: TrainerConfig, loggers: Sequence[Logger]) -> None:
        self.ctx, self.settings, self.loggers = ctx, settings, loggers
        self.bar: tqdm | None = None

    def start_epoch(self, epoch: int, batches: int, done: int) -> None:
        self.bar = tqdm(
            total=batches - done,
            desc=f"epoch {epoch + 1}",
            # None: tqdm draws on a terminal only, not into a SLURM log, a pipe or a file.
            disable=None if self.ctx.is_main and self.settings.progress_bar else True,
            leave=False,
            dynamic_ncols=True,
        )

    def batch_done(self) -> None:
        self.bar.update()

    def due(self, step: int) -> bool:
        """Whether optimizer step `step` reports the training figures."""
        return step % self.settings.log_every_n_steps == 0

    def report(self, step: int, window: Averages, lr: float, where: str | None = None) -> None:
        """The figures of the steps since the last log point (over every rank) at `step`:
        train/loss_window and train/acc_window (train/loss is the epoch's); `where` (epoch and batch):
        also a line in the log, if no bar shows them."""
        lr = float(f"{lr:.6g}")  # as a schedule means it, without float noise (0.0375, not 0.037500000000000006)
        self.log(step, {"train/loss_window": window.loss, "train/acc_window": window.acc, "lr": lr})
        self.bar.set_postfix(loss=f"{window.loss:.4f}", acc=f"{window.acc:.3f}", refresh=False)
        if where is not None and self.bar.disable and self.ctx.is_main:
            every = self.settings.log_every_n_steps
            log.info(
                "step %d  %s  last %d steps: loss %.4f acc %.4f  lr %.4g",
                step,
                where,
                every,
                window.loss,
                window.acc,
                lr,
            )

    def end_epoch(self) -> None:
        self.bar.close()

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for logger in self.loggers:
            logger.log_scalars(step, values)

    def epoch_line(
        self,
        where: str,
        train: Averages,
        figures: Mapping[str, float],
        added: Sequence[str],
        ranked: tuple[str, float] | None = None,
    ) -> None:
        """The epoch's line: the training and validation figures, the EMA's, the best so far (also of
        `ranked`, the figure the best checkpoints are ranked by, where it is not val/acc), the speed;
        then each figure a callback added that it names (`added`)."""
        ema = (
            f"  ema loss {figures['val_ema/loss']:.4f} acc {figures['val_ema/acc']:.4f} "
            f"acc5 {figures['val_ema/acc5']:.4f}"
            if "val_ema/acc" in figures
            else ""
        )
        theirs = "".join(f"  {name} {figures[name]:.4f}" for name in added if name in figures)
        best = f"  best {ranked[0]} {ranked[1]:.4f}" if ranked is not None else ""
        log.info(
            "%s  train loss %.4f acc %.4f  val loss %.4f acc %.4f acc5 %.4f%s  best acc %.4f acc5 %.4f%s"
            "  %.0f samples/s  data wait %.2f s%s",
            where,
            train.loss,
            train.acc,
            figures["val/loss"],
            figures["val/acc"],
            figures["val/acc5"],
            ema,
            figures["val/best_acc"],
            figures["val/best_acc5"],
            best,
            figures["throughput/samples_per_s"],
            figures["time/data_s"],
            theirs,
        )
