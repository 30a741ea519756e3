"""callbacks=grad_norm: train/grad_norm, the epoch's mean gradient norm."""

from __future__ import annotations

import math

import torch
from torch import nn

from training.callbacks import Callback


class GradNorm(Callback):
    """train/grad_norm: the total gradient norm before clipping, averaged over each epoch's optimizer
    steps with a finite norm (fp16's overflows, whose updates the loss scaler skips, are left out; an
    epoch of them only is NaN). Summed on the device and read once an epoch: no host sync per step."""

    figures = ("train/grad_norm",)

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # the finite norms' sum and their count

    def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
        finite = grad_norm.isfinite()
        norm = torch.stack([torch.where(finite, grad_norm, 0.0), finite.to(grad_norm.dtype)])
        self.sums = norm if self.sums is None else self.sums + norm

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        total, steps = self.sums.tolist() if self.sums is not None else (0.0, 0)
        figures["train/grad_norm"] = total / steps if steps else math.nan  # no finite norm: none to average
        self.sums = None
