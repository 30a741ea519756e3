"""Callbacks: the Trainer's events, for what watches training and what steers it.

Those a run asks for are `_target_` nodes in conf/callbacks/ (`callbacks=early_stopping`, or a list:
`callbacks=[early_stopping,confusion_matrix]`), built on every rank (and once before launch, to
check their options: keep `__init__` light); the sample grid and the profiler are ones the run makes
itself. The built-in ones: `grad_norm`, `early_stopping`, `confusion_matrix` (a module each here).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from distributed.collectives import all_gather_object, all_reduce_max
from distributed.context import DistContext
from errors import ConfigError

if TYPE_CHECKING:
    from training.loggers.base import Logger


@dataclass(frozen=True)
class RunInfo:
    """What a callback may need of the run, given once before training (`setup`)."""

    ctx: DistContext  # this rank: a collective must run on every rank alike
    loggers: Sequence[Logger]  # rank 0's backends (none on the other ranks), for images
    class_names: Sequence[str]  # the dataset's, in class-index order
    run_dir: Path


class Callback:
    """Override the events you need; an event nobody overrides costs the loop nothing.

    Every rank calls every event, in the order of the Trainer's callbacks, so a callback may run a
    collective (an all-reduce, an FSDP forward) as long as it does so on every rank. Nothing here
    may wait for the device every step (`.item()`, `.tolist()`, a print of a tensor) unless an
    option of the callback asks for it: keep per-step figures on the device, read them at
    validation's end.
    """

    # The figures this callback adds at validation's end: what a monitor (trainer.checkpoint.monitor,
    # early_stopping's) may name, checked before launch.
    figures: ClassVar[tuple[str, ...]] = ()

    def setup(self, run: RunInfo) -> None:
        """Once, before training (and before a resumed run's state is loaded into it)."""

    def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
        """Optimizer step `step` (counted from 1) has its gradients: summed over the ranks and the
        accumulated micro-batches, unscaled (fp16), not yet clipped or applied. `grad_norm` is their
        total 2-norm over every rank's shards, a 0-dim tensor on the device, computed once for this,
        trainer.grad_clip and trainer.nonfinite=skip. `model` is the trained (wrapped) module."""

    def on_step_end(self, step: int) -> None:
        """Optimizer step `step` (from 1) is done: the update (and the EMA's) applied, the gradients
        cleared. It comes every step: keep it to host-side bookkeeping (the profiler marks its steps
        here)."""

    def on_validation_batch_end(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """A batch of this rank's validation shard, evaluated with the model's weights (not the
        EMA's): its logits (N x classes) and its labels (N), on the device. Every rank sees its own
        shard; sum what you count and all-reduce it at validation's end."""

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        """Epoch `epoch` (from 0) is validated, at optimizer step `step`: `figures` holds its figures
        (val/*, val_ema/*, train/*, throughput/*, time/*), every one the same on every rank; add
        yours (name them in `figures`, the class attribute). They go to the loggers, the epoch's log
        line and metrics.json after every callback has seen them. The callbacks that add figures see
        this event before those that add none, so any callback may read what they add.

        Return a reason to stop training, or None: if any rank returns one, every rank stops here,
        last.pt is saved, and the run ends as a finished one, its log and metrics.json saying why."""
        return None

    def on_train_end(self, metrics: dict[str, Any]) -> None:
        """Training is over: `metrics` holds the run's final figures, which go to metrics.json (and
        the loggers' hparams) after every callback has seen them; add yours to it."""

    def state_dict(self) -> dict[str, Any]:
        """What this callback must remember across a resume (patience spent, a best value): saved in
        every checkpoint from rank 0 and given back to every rank, so keep it the same on every rank
        (derive it from figures, which are) and of tensors and primitives."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """`state` as state_dict returned it, when a run resumes."""


def end_validation(
    callbacks: Sequence[Callback], epoch: int, step: int, figures: dict[str, float], ctx: DistContext
) -> str | None:
    """Every callback's on_validation_end: first those that add figures, then the others, each group
    in the run's order, so that a monitor may name a figure a callback adds wherever the list puts it
    (each held to the figures it names). Then the ranks agree: the reason to stop that a rank's
    callbacks gave (the lowest rank's first), or None, the same on every rank, so that every rank
    stops at this step or none does. One small all-reduce per validation."""
    adders_first = sorted(callbacks, key=lambda callback: not callback.figures)  # a stable sort
    reasons = [reason for callback in adders_first if (reason := _held_to_figures(callback, epoch, step, figures))]
    reason = reasons[0] if reasons else None
    if not ctx.distributed:
        return reason
    asked = torch.tensor(float(reason is not None), device=ctx.device)
    if not all_reduce_max(asked, ctx).item():
        return None
    return next(r for r in all_gather_object(reason, ctx) if r)


def _held_to_figures(callback: Callback, epoch: int, step: int, figures: dict[str, float]) -> str | None:
    """A callback's on_validation_end, which must add the figures it names (`figures`): a monitor,
    the epoch's line and metrics.json take those names from it, so a figure added under another
    spelling would be missing from the last two without a word, and a KeyError where a monitor
    reads it."""
    before = set(figures)
    reason = callback.on_validation_end(epoch, step, figures)
    missing = [name for name in callback.figures if name not in figures]
    if missing:
        added = sorted(set(figures) - before)
        close = difflib.get_close_matches(missing[0], added, n=1)
        what = (
            f"it added {close[0]}" if close else f"it added {len(added)} other figure(s)" if added else "it added none"
        )
        kind = type(callback)
        raise ConfigError(
            f"{kind.__module__}.{kind.__qualname__} names {', '.join(missing)} in its `figures` but did not add "
            f"it at epoch {epoch + 1}'s validation ({what}); add each figure it names, under that name, at every "
            "validation's end (NaN where it has none)"
        )
    return reason


def handling(callbacks: Sequence[Callback], event: str) -> list[Callback]:
    """The callbacks that override `event`: the loop does not call the others' no-op per step."""
    return [c for c in callbacks if getattr(type(c), event) is not getattr(Callback, event)]
