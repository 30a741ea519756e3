"""callbacks=balanced_accuracy: val/balanced_acc, the mean of the classes' accuracies."""

from __future__ import annotations

import torch

from distributed.collectives import all_reduce_sum
from training.callbacks import Callback, RunInfo


class BalancedAccuracy(Callback):
    """val/balanced_acc: each class's share of its samples predicted right, averaged over the classes
    the validation set holds; on a set with as many samples in every class, the accuracy. Counted on
    the device a batch at a time, summed over the ranks once."""

    figures = ("val/balanced_acc",)

    def __init__(self) -> None:
        self.run: RunInfo | None = None
        self.counts: torch.Tensor | None = None  # [samples, right] per class

    def setup(self, run: RunInfo) -> None:
        self.run = run

    def on_validation_batch_end(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        classes = outputs.shape[1]
        right = (outputs.argmax(dim=1) == targets).long()
        counts = torch.stack([torch.bincount(targets, minlength=classes), torch.bincount(targets, right, classes)])
        self.counts = counts if self.counts is None else self.counts + counts

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        counts, self.counts = self.counts, None
        if counts is None:  # no validation batch on this rank (fewer samples than ranks): it still joins the sum
            # float64, as a batch's are (bincount with weights): every rank sums the same dtype
            counts = torch.zeros(2, len(self.run.class_names), dtype=torch.float64, device=self.run.ctx.device)
        samples, right = all_reduce_sum(counts, self.run.ctx).tolist()
        shares = [r / n for n, r in zip(samples, right) if n]
        figures["val/balanced_acc"] = sum(shares) / len(shares)
