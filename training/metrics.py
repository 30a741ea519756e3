"""Loss/accuracy sums kept on the device: no host sync per step, one all-reduce per report; the
run's samples/s."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from distributed.collectives import all_reduce_sum
from distributed.context import DistContext
from training.loss import Criterion


@dataclass(frozen=True)
class Averages:
    loss: float  # the criterion's
    acc: float  # fraction 0..1
    samples: int
    acc5: float | None = None  # the label among the 5 highest logits (validation only)
    ce: float | None = None  # plain cross-entropy, whatever the criterion (validation only)


class Accumulator:
    def __init__(self, device: torch.device, validation: bool = False) -> None:
        # loss*n, correct, n[, top-5 hits, cross-entropy*n]
        self.sums = torch.zeros(5 if validation else 3, dtype=torch.float64, device=device)

    def update_validation(self, logits: torch.Tensor, targets: torch.Tensor, criterion: Criterion) -> None:
        """Per-sample losses summed in float64, top-5 hits and cross-entropy (needs validation=True).
        Per-batch float32 means made the loss depend on the split into batches and ranks (digits,
        2 ranks: in its 9th digit); these sums move by float64 rounding at most (not at all in the tests)."""
        self.sums[0] += criterion(logits, targets, reduction="none").double().sum()
        self.sums[1] += (logits.argmax(dim=1) == targets).sum()
        self.sums[2] += targets.shape[0]
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        self.sums[3] += (top == targets[:, None]).any(dim=1).sum()
        self.sums[4] += F.cross_entropy(logits, targets, reduction="none").double().sum()

    def all_reduce(self, ctx: DistContext) -> Accumulator:
        """Sum over ranks in place: afterwards every rank holds the global figures."""
        all_reduce_sum(self.sums, ctx)
        return self

    def add(self, other: Accumulator) -> None:
        self.sums += other.sums

    def averages(self) -> Averages:
        loss_sum, correct, n, *validation = self.sums.tolist()  # the one host sync
        n_ = max(n, 1)
        top5, ce = (validation[0] / n_, validation[1] / n_) if validation else (None, None)
        return Averages(loss_sum / n_, correct / n_, int(n), top5, ce)


class Window:
    """The training micro-batches since the last report, kept on the device as they are: each
    one's loss (a reference, no copy) and predicted classes (one argmax); counted once per report.

    Non-finite losses are left out of the averages; `first_nonfinite` names the optimizer step of
    the first one, so a NaN is reported exactly however rarely the loop synchronises.
    """

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.predicted: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self.steps: list[int] = []  # the optimizer step each micro-batch belongs to

    def update(self, loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, step: int) -> None:
        self.losses.append(loss.detach())
        self.predicted.append(logits.detach().argmax(dim=1))
        self.targets.append(targets)
        self.steps.append(step)

    def first_nonfinite(self) -> int | None:
        """The step of the first non-finite loss held, or None (a host sync)."""
        if not self.losses:
            return None
        bad = ~torch.isfinite(torch.stack(self.losses))
        return self.steps[int(bad.int().argmax())] if bool(bad.any()) else None

    def drain(self, device: torch.device) -> Accumulator:
        """The held micro-batches' sums (finite losses only), as an Accumulator; then empty."""
        sums = Accumulator(device)
        if self.losses:
            sizes = torch.tensor([len(t) for t in self.targets], dtype=torch.float64).to(device, non_blocking=True)
            losses = torch.stack(self.losses).double()
            finite = torch.isfinite(losses)
            correct = torch.stack([(p == t).sum() for p, t in zip(self.predicted, self.targets)])
            sums.sums[0] = torch.where(finite, losses, 0.0).mul(sizes).sum()
            sums.sums[1] = torch.where(finite, correct, 0).sum()
            sums.sums[2] = sizes.mul(finite).sum()
        for held in (self.losses, self.predicted, self.targets, self.steps):
            held.clear()
        return sums


def reset_peak_memory(ctx: DistContext) -> None:
    """Jobs that share a process (a torchrun/SLURM rank running a -m sweep) share CUDA's counters:
    without a reset each job would report the running maximum of those before it."""
    if ctx.device.type == "cuda":
        for device in ctx.devices:
            torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(ctx: DistContext) -> list[float] | None:
    """Peak allocated CUDA memory of every device in the job, in MB; None on CPU. What torch's caching
    allocator gave out: the CUDA context and NCCL's buffers come on top (GPU-only).

    Rank r fills its own slots (DP: one per GPU it drives) and a sum over ranks gathers them.
    """
    if ctx.device.type != "cuda":
        return None
    local = [torch.cuda.max_memory_allocated(device) for device in ctx.devices]
    slots = torch.zeros(ctx.world_size * len(local), dtype=torch.float64, device=ctx.device)
    slots[ctx.rank * len(local) : (ctx.rank + 1) * len(local)] = torch.tensor(local, dtype=torch.float64)
    return (all_reduce_sum(slots, ctx) / 1e6).tolist()


def samples_per_s(per_epoch: list[float]) -> float:
    """A run's samples/s, its one definition: the median over its epochs after the first, which pays
    for the warm-up (allocator, lazy initialisation, compilation); the first alone while there is no
    other. metrics.json's train_samples_per_s, bench.report's samples/s and the HParams tab's (the
    last point of throughput/median_samples_per_s, this over the epochs so far); NaN before any (a
    run resumed at its first epoch's end has trained no sample of it)."""
    return statistics.median(per_epoch[1:] or per_epoch) if per_epoch else math.nan
