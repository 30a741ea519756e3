"""Validation: the criterion's loss, accuracy, top-5 and cross-entropy over every rank's
validation shard, summed over the ranks; the callbacks see each of the model's batches."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from distributed.context import DistContext
from distributed.strategies import for_evaluation, prepare_evaluation
from training.batches import Batches
from training.callbacks import Callback
from training.loss import Criterion
from training.metrics import Accumulator, Averages

# What validation measures of a set of weights: val/<figure> for the model's, val_ema/<figure> for
# the EMA's (trainer.ema_decay), in the loggers' scalars and in metrics.json (val_<figure>).
FIGURES = ("loss", "ce", "acc", "acc5")
# The epoch's training figures (the epoch's line's, metrics.json's train_loss and train_acc), which
# validation's end holds too; train/loss_window is the figure of the steps since the last log point.
TRAIN_FIGURES = ("train/loss", "train/acc")
# What validation's end holds besides those and what the callbacks add (the Trainer's fit fills
# these, in this order); memory/peak_mb/device<i> too, on GPUs.
EPOCH_FIGURES = (
    "val/best_acc",
    "val/best_acc5",
    "throughput/samples_per_s",
    "throughput/median_samples_per_s",
    "time/train_s",
    "time/data_s",
)


# metrics.json's numbers besides each validated figure (val_loss, val_ema_acc) and those the
# callbacks add (val_macro_f1): what the Trainer's fit and training.run write of every run.
RUN_FIGURES = (
    "best_val_acc",
    "best_val_acc5",
    "train_loss",
    "train_acc",
    "train_samples_per_s",
    "epochs",
    "steps",
    "nonfinite_steps_skipped",
    "world_size",
    "devices",
    "batch_size",
    "wall_s",
    "parameters",
    "trainable_parameters",
    "model_mb",
    "flops_per_sample",
)


def final_figures(ema: bool, callback_figures: Sequence[str]) -> list[str]:
    """The numbers a run's metrics.json holds, what optimized_metric may name: each validated figure
    and each callback's with its "/" as "_" (val/loss: val_loss), then RUN_FIGURES."""
    return [*_validated(ema, "_"), *(name.replace("/", "_") for name in callback_figures), *RUN_FIGURES]


def produced(ema: bool, callbacks: Sequence[Callback]) -> list[str]:
    """The figures every validation's end of a run holds: what a monitor may name."""
    callback_figures = (name for callback in callbacks for name in callback.figures)
    return [*_validated(ema, "/"), *TRAIN_FIGURES, *EPOCH_FIGURES, *callback_figures]


def _validated(ema: bool, sep: str) -> list[str]:
    """Each validated figure, the EMA's weights' too: val/loss as the loggers name it (`sep` "/"),
    val_loss as metrics.json does ("_")."""
    return [f"{weights}{sep}{name}" for weights in (["val", "val_ema"] if ema else ["val"]) for name in FIGURES]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    batches: Batches,
    ctx: DistContext,
    criterion: Criterion,
    callbacks: Sequence[Callback] = (),
) -> Averages:
    """The figures over every rank's shard; `callbacks` (those that handle on_validation_batch_end)
    see each batch's logits and labels."""
    net = for_evaluation(model)
    net.eval()
    sums = Accumulator(ctx.device, validation=True)
    padding = prepare_evaluation(net, batches.count(loader), ctx)  # FSDP: every forward takes all ranks
    for x, y in batches.take(loader):
        logits = net(x)
        sums.update_validation(logits, y, criterion)
        for callback in callbacks:
            callback.on_validation_batch_end(logits, y)
    for _ in range(padding):
        net(x[:0])
    net.train()
    return sums.all_reduce(ctx).averages()


def figures(averages: Averages, prefix: str) -> dict[str, float]:
    """`prefix` + each of FIGURES: `val/` or `val_ema/` for the loggers, `val_` or `val_ema_` for
    metrics.json."""
    return {f"{prefix}{name}": getattr(averages, name) for name in FIGURES}
