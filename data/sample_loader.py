"""The DataLoader path: per-sample work (reading, decoding, resizing, per-image augmentation) in
worker processes, whose batches the training device finishes (`to_device`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from data.worker_errors import OneLineErrorsLoader


@dataclass
class Split:
    dataset: Dataset  # training's is indexed by data.EpochIndices' (index, epoch, position)
    to_device: Callable[[Any, Any], tuple[Any, Any]]  # (batch, labels) -> the network's input and labels, on the device
    collate: Callable | None = None  # None: DataLoader's default


class SampleLoader(OneLineErrorsLoader):
    """A DataLoader over `split.dataset` whose batches reach the training device through `to_device`."""

    def __init__(self, split: Split, **options: Any) -> None:
        super().__init__(split.dataset, collate_fn=split.collate, **options)
        self.to_device = split.to_device
