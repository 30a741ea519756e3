"""A split held whole as tensors, cut into batches where it lies: on the training device
(`data.loader=device`), or in host memory for any in-memory dataset on the default path.

No worker processes and no per-sample Python: one gather per batch, then crop/flip as batched
tensor ops on the stored dtype (the fastest CIFAR-10 trainers' recipe), and normalisation on the
training device (to_device). Sharding reuses DistributedSampler, so each rank sees exactly the
indices, in the order, that a DataLoader over it would give.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler

from data.arrays import ImageArrays
from data.transforms import BatchTransform, ToDevice
from distributed.context import epoch_seed


class TensorLoader:
    def __init__(
        self,
        arrays: ImageArrays,
        transform: BatchTransform,
        to_device: ToDevice,
        batch_size: int,
        device: torch.device,
        order: DistributedSampler | range,
        seed: int = 0,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        """`order`: a DistributedSampler to train (reshuffled and re-augmented per epoch), or the
        fixed indices of this rank's validation shard (no augmentation). `device`: where the
        split is held and the batches are cut; `to_device` takes each one from there to the
        training device, normalised."""
        self.images = arrays.images.to(device)
        self.labels = arrays.labels.to(device)
        self.transform = transform
        self.to_device = to_device
        self.batch_size = batch_size
        self.device = device
        self.order = order
        self.seed, self.rank = seed, rank
        self.drop_last = drop_last

    @property
    def training(self) -> bool:
        return isinstance(self.order, DistributedSampler)

    def __len__(self) -> int:
        batches = len(self.order) / self.batch_size
        return math.floor(batches) if self.drop_last else math.ceil(batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = None
        if self.training:
            # (seed, epoch, rank): a resumed run draws the same crops and flips as an unbroken one. On a
            # GPU the generator is CUDA's, whose stream is not the CPU's: a CPU rehearsal draws others.
            generator = torch.Generator(self.device).manual_seed(epoch_seed(self.seed, self.order.epoch, self.rank))
        indices = torch.as_tensor(list(self.order), dtype=torch.long).to(self.device, non_blocking=True)
        for batch in indices.split(self.batch_size)[: len(self)]:
            yield self.transform(self.images[batch], generator), self.labels[batch]
