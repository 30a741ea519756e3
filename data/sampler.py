"""data.repeated_augmentations: torchvision's RASampler (from DeiT) on DistributedSampler's terms."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler


class RepeatedAugmentationSampler(DistributedSampler):
    """Each drawn image N times in a row of the shuffled order, so ranks r, r+1, ... each get a
    copy (augmented differently); an epoch still draws as many samples as the set holds, about
    len/N distinct images. Sharding is DistributedSampler's stride, so the ranks' batches together
    are the single process's batch, and the order is a function of (seed, epoch): exact under DDP
    and on resume. torchvision also cuts each epoch to a multiple of 256 images, which would leave
    small sets empty; here it is cut to a multiple of the world size instead."""

    def __init__(
        self, dataset: Dataset, num_replicas: int, rank: int, repetitions: int, shuffle: bool = True, seed: int = 0
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.repetitions = repetitions
        self.repeated_size = math.ceil(len(dataset) * repetitions / num_replicas) * num_replicas
        self.num_samples = max(1, len(dataset) // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(len(self.dataset))
        repeated = order.repeat_interleave(self.repetitions).tolist()
        # Every rank the same count: the order again from its start, as often as a set smaller than the world needs.
        repeated = (repeated * math.ceil(self.repeated_size / len(repeated)))[: self.repeated_size]
        return iter(repeated[self.rank : self.repeated_size : self.num_replicas][: self.num_samples])


def train_sampler(
    dataset: Dataset, num_replicas: int, rank: int, repetitions: int, shuffle: bool, seed: int
) -> DistributedSampler:
    """DistributedSampler at world size 1 is a seeded shuffle: single and DDP draw from one permutation."""
    if repetitions > 1:
        return RepeatedAugmentationSampler(dataset, num_replicas, rank, repetitions, shuffle, seed)
    return DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
