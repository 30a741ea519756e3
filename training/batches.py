"""Batches from a loader to the device, as many as an epoch takes (trainer.limit_*_batches,
trainer.overfit_batches), timing the wait for them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from data import Loaders


@dataclass
class Batches:
    """Where a batch goes and how many of them an epoch takes; `waited`: the seconds the last
    `take` spent waiting for its loader (the ImageNet example's data time)."""

    device: torch.device
    limit: int | None
    waited: float = 0.0

    def take(
        self,
        loader: Iterable,
        skip: int = 0,
        skipped: Callable[[], None] | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """`skipped` runs once the first `skip` batches are drawn, before the next one is: a
        DataLoader without workers draws its augmentations from the stream the steps draw from."""
        self.waited, resumed = 0.0, time.perf_counter()
        for i, (x, y) in enumerate(loader):
            self.waited += time.perf_counter() - resumed
            if self.limit is not None and i >= self.limit:
                return
            if i < skip:  # resuming mid-epoch: drawn in the same order, trained before the stop
                if i == skip - 1 and skipped is not None:
                    skipped()
            else:
                yield Loaders.to_device(loader, x, y, self.device)
            resumed = time.perf_counter()

    def count(self, loader: Any) -> int:
        return len(loader) if self.limit is None else min(len(loader), self.limit)
