"""Where training is, as every checkpoint form holds it: the train state, and each rank's random
streams for a resume mid-epoch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from distributed.collectives import all_gather_object
from distributed.context import DistContext
from training.batch_layout import BatchLayout


@dataclass
class TrainState:
    epoch: int = 0  # the epoch running (or next to run)
    step: int = 0  # optimizer steps taken so far
    best_val_acc: float = -1.0
    batch: int = 0  # batches of `epoch` already trained: a mid-epoch checkpoint resumes after them
    rng: list[torch.Tensor] | None = None  # this rank's RNG state to restore once those batches are skipped
    best_val_acc5: float = -1.0
    best_weights: str = "model"  # which of a checkpoint's weights scored best_val_acc: model or ema
    stopped: str | None = None  # why a callback stopped training early; a resume then trains nothing
    layout: BatchLayout | None = None  # the micro-batches `batch` counts: the world it was trained at
    # The run's clock and speeds so far, over every process that trained it: a resume goes on from
    # them, so that time/train_s, wall_s and the median samples/s are the whole run's, not its last part's.
    train_s: float = 0.0  # seconds trained, validation and saves included, as of the checkpoint
    speeds: list[float] = field(default_factory=list)  # each epoch's samples/s (training.metrics.samples_per_s)
    # The training figures' sums (loss*n, correct, n, over every rank) not yet reported when it was saved:
    # of `epoch`'s batches trained (mid-epoch), and of the steps since the last log point. A resume adds
    # to them, so that its epoch's train/loss and its first train/loss_window are an unbroken run's.
    epoch_sums: list[float] | None = None
    window_sums: list[float] | None = None


def gather_rng(ctx: DistContext) -> list[list[torch.Tensor]]:
    """Each rank's RNG states (CPU, then each GPU it drives: dp's replicas draw dropout on
    every one of them), indexed by rank. Every rank calls it."""
    states = [torch.get_rng_state()]
    if ctx.device.type == "cuda":
        states += [torch.cuda.get_rng_state(device) for device in ctx.devices]
    return all_gather_object(states, ctx)


def restore_rng(rng: list[torch.Tensor], ctx: DistContext) -> None:
    torch.set_rng_state(rng[0].cpu())
    if ctx.device.type == "cuda":  # a GPU run's checkpoint resumed on the CPU has nowhere to put them
        for device, state in zip(ctx.devices, rng[1:]):
            torch.cuda.set_rng_state(state.cpu(), device)


def host_copy(value: Any) -> Any:
    """`value` with every tensor copied to host memory: training may change the originals (the
    optimizer's buffers, the weights) while the copy is being written."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(item) for item in value)
    return value
