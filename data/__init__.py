"""Datasets and per-rank loaders. Knows DistContext, nothing else of the distributed world."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from distributed.context import DistContext

# dataset name -> module with `load(cfg) -> (train, val)`; imported on use to keep start-up lean.
_MODULES = {"digits": "data.digits", "synthetic": "data.synthetic"}


def load_datasets(dataset: Any) -> tuple[Dataset, Dataset]:
    return importlib.import_module(_MODULES[dataset.name]).load(dataset)


@dataclass
class Loaders:
    train: DataLoader
    val: DataLoader
    train_sampler: DistributedSampler  # call set_epoch(e) before each epoch


def build_loaders(dataset: Any, data: Any, ctx: DistContext, global_batch: int, seed: int) -> Loaders:
    """Each rank gets `global_batch / world_size` per step; validation covers every sample once."""
    train_set, val_set = load_datasets(dataset)
    batch = global_batch // ctx.world_size
    pin = ctx.device.type == "cuda" if data.pin_memory is None else data.pin_memory
    options = dict(num_workers=data.num_workers, pin_memory=pin, persistent_workers=data.num_workers > 0)
    # DistributedSampler at world size 1 is a seeded shuffle: single and DDP draw from one permutation.
    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed)
    train = DataLoader(train_set, batch_size=batch, sampler=sampler, **options)
    # A strided shard without padding: every validation sample is counted exactly once globally.
    val_shard = Subset(val_set, range(ctx.rank, len(val_set), ctx.world_size))
    val = DataLoader(val_shard, batch_size=batch, shuffle=False, **options)
    return Loaders(train, val, sampler)
