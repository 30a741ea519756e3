"""Loss/accuracy sums kept on the device: no host sync per step, one all-reduce per report."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed.collectives import all_reduce_sum
from distributed.context import DistContext


@dataclass(frozen=True)
class Averages:
    loss: float
    acc: float  # fraction 0..1
    samples: int


class Accumulator:
    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n

    def update(self, loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        n = targets.shape[0]
        self.sums[0] += loss.detach() * n
        self.sums[1] += (logits.argmax(dim=1) == targets).sum()
        self.sums[2] += n

    def all_reduce(self, ctx: DistContext) -> "Accumulator":
        """Sum over ranks in place: afterwards every rank holds the global figures."""
        all_reduce_sum(self.sums, ctx)
        return self

    def add(self, other: "Accumulator") -> None:
        self.sums += other.sums

    def reset(self) -> None:
        self.sums.zero_()

    def averages(self) -> Averages:
        loss_sum, correct, n = self.sums.tolist()  # the one host sync
        return Averages(loss_sum / max(n, 1), correct / max(n, 1), int(n))


def peak_memory_mb(devices: list[torch.device], ctx: DistContext) -> list[float] | None:
    """Peak allocated CUDA memory of every device in the job, in MB; None on CPU.

    Rank r fills its own slots (DP: one per GPU it drives) and a sum over ranks gathers them.
    """
    if ctx.device.type != "cuda":
        return None
    local = [torch.cuda.max_memory_allocated(device) for device in devices]
    slots = torch.zeros(ctx.world_size * len(local), dtype=torch.float64, device=ctx.device)
    slots[ctx.rank * len(local):(ctx.rank + 1) * len(local)] = torch.tensor(local, dtype=torch.float64)
    return (all_reduce_sum(slots, ctx) / 1e6).tolist()
