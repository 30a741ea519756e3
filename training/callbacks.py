"""Callbacks: a few events of the Trainer's loop, for what watches training without steering it.

Those a run asks for are `_target_` nodes in conf/callbacks/ (`callbacks=grad_norm`, or a list:
`callbacks=[grad_norm,...]`), built on every rank (and once before launch, to check their options:
keep `__init__` light); the sample grid (training/samples.py) is one the run makes itself. The
loop's own figures go to the loggers without a callback; the EMA (which needs the weights after
each update) and the preemption check (which stops the loop) stay in the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class Callback:
    """Override the events you need; an event nobody overrides costs the loop nothing.

    Every rank calls every event, in the order of the Trainer's callbacks, so a callback may run a
    collective (an all-reduce, an FSDP forward) as long as it does so on every rank. Nothing here
    may wait for the device every step (`.item()`, `.tolist()`, a print of a tensor) unless an
    option of the callback asks for it: keep per-step figures on the device, read them at the
    epoch's end.
    """

    def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
        """Optimizer step `step` (counted from 1) has its gradients: summed over the ranks and the
        accumulated micro-batches, unscaled (fp16), not yet clipped or applied. `grad_norm` is their
        total 2-norm over every rank's shards, a 0-dim tensor on the device, computed once for this,
        trainer.grad_clip and trainer.nonfinite=skip. `model` is the trained (wrapped) module."""

    def on_step_end(self, step: int) -> None:
        """Optimizer step `step` (from 1) is done: the update (and the EMA's) applied, the gradients
        cleared. It comes every step: keep it to host-side bookkeeping (the profiler marks its steps
        here)."""

    def on_epoch_end(self, epoch: int, step: int, scalars: dict[str, float]) -> None:
        """Epoch `epoch` (from 0) is validated, at optimizer step `step`: `scalars` holds its figures
        (val/*, throughput/*, time/*, memory/*), which go to the loggers after every callback has
        seen them; add yours to it."""

    def on_train_end(self, metrics: dict[str, Any]) -> None:
        """Training is over: `metrics` holds the run's final figures, which go to metrics.json (and
        the loggers' hparams) after every callback has seen them; add yours to it."""


def handling(callbacks: Sequence[Callback], event: str) -> list[Callback]:
    """The callbacks that override `event`: the loop does not call the others' no-op per step."""
    return [c for c in callbacks if getattr(type(c), event) is not getattr(Callback, event)]


class GradNorm(Callback):
    """train/grad_norm: the total gradient norm before clipping, averaged over each epoch's optimizer
    steps with a finite norm (fp16's overflows, whose updates the loss scaler skips, are left out).
    Summed on the device and read once an epoch: no host sync per step."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # the finite norms' sum and their count

    def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
        finite = grad_norm.isfinite()
        norm = torch.stack([torch.where(finite, grad_norm, 0.0), finite.to(grad_norm.dtype)])
        self.sums = norm if self.sums is None else self.sums + norm

    def on_epoch_end(self, epoch: int, step: int, scalars: dict[str, float]) -> None:
        if self.sums is not None:
            total, steps = self.sums.tolist()
            if steps:
                scalars["train/grad_norm"] = total / steps
        self.sums = None
