"""Datasets and per-rank loaders. Knows DistContext, nothing else of the distributed world."""
from __future__ import annotations

import importlib
import multiprocessing
import os
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset, get_worker_info

from config.schema import DataConfig, DatasetConfig, Loader
from data.sampler import train_sampler
from distributed.context import DistContext, cpus_per_rank, epoch_seed
from errors import ConfigError

if TYPE_CHECKING:
    from data.sample_loader import SampleLoader
    from data.tensor_loader import TensorLoader

# dataset name -> module with `arrays(cfg) -> (train, val)` ImageArrays where the split fits in
# memory (cut into batches by a TensorLoader), and `load(cfg) -> (train, val)` datasets for
# per-sample DataLoaders where it must transform one image at a time, or `image_files(cfg) ->
# (train, val)` lists of (path, label) for folders of image files (decoded per data.decode);
# downloaded ones add `files(root)`, `download(root)`, `read(root)`. Imported on use to keep
# start-up lean.
_MODULES = {
    "digits": "data.digits",
    "synthetic": "data.synthetic",
    "mnist": "data.mnist",
    "cifar10": "data.cifar10",
    "imagefolder": "data.imagefolder",
}

def dataset_module(name: str) -> ModuleType:
    if name not in _MODULES:
        raise ConfigError(f"dataset.name={name}: choose one of {', '.join(_MODULES)}")
    return importlib.import_module(_MODULES[name])


def num_classes(dataset: DatasetConfig) -> int:
    """dataset.num_classes=null: what the dataset holds (an image folder counts its class folders)."""
    module = dataset_module(dataset.name)
    if not hasattr(module, "count_classes"):
        raise ConfigError(f"dataset.num_classes=null: dataset={dataset.name} cannot count its classes; give the number")
    return module.count_classes(dataset)


def check(dataset: DatasetConfig, data: DataConfig) -> None:
    """What train.py can find wrong before any process starts: loader choice, files, folders."""
    from data import decode, download
    from data.transforms import per_image_options, resize_options

    module = dataset_module(dataset.name)
    decode.check(module, dataset, data)
    if data.num_workers is not None and data.num_workers < 0:
        raise ConfigError(
            f"data.num_workers={data.num_workers}: use 0 (load in the training process), a number of worker "
            "processes, or null (this task's CPUs shared among its ranks)"
        )
    if data.loader == Loader.device and not hasattr(module, "arrays"):
        raise ConfigError(
            f"data.loader=device holds the dataset in device memory, which dataset={dataset.name} does not "
            "suit; use data.loader=dataloader"
        )
    resizing = resize_options(dataset)
    for key, value in {**resizing, **per_image_options(dataset)}.items():
        off = f"dataset.{key}={0 if key == 'random_erase' else 'null'}"
        if data.loader == Loader.device:
            raise ConfigError(
                f"data.loader=device transforms whole batches at the stored size, but dataset.{key}={value} is a "
                f"per-image transform of the DataLoader path; use data.loader=dataloader, or {off}"
            )
        if not getattr(module, "PER_IMAGE_TRANSFORMS", False):
            raise ConfigError(
                f"dataset.{key}={value} transforms each image, but dataset={dataset.name} serves ready tensors; "
                f"use dataset=mnist, cifar10 or imagefolder, or {off}"
            )
    if resizing and (dataset.val_resize or dataset.resize) is None:
        key = next(iter(resizing))
        raise ConfigError(
            f"dataset.{key}={resizing[key]} asks for ImageNet-style transforms, which validate after a resize; "
            "set dataset.val_resize too (e.g. 256)"
        )
    stored = getattr(module, "IMAGE_SIZE", None)
    if stored is not None and not resizing and dataset.image_size != stored:  # the model is built for image_size
        resize = ", or dataset.resize=<px> to resize them" if getattr(module, "PER_IMAGE_TRANSFORMS", False) else ""
        raise ConfigError(
            f"dataset.image_size={dataset.image_size}: the {dataset.name} images are {stored}x{stored} and nothing "
            f"resizes them; set dataset.image_size={stored}{resize}"
        )
    if hasattr(module, "check"):
        module.check(dataset)
    if hasattr(module, "files"):
        download.require(module, dataset)
        if not download.missing(module, dataset):
            module.read(download.dataset_root(dataset))  # a malformed file fails here, in one line


@dataclass
class Loaders:
    train: SampleLoader | TensorLoader
    val: SampleLoader | TensorLoader
    train_sampler: DistributedSampler  # call set_epoch(e) before each epoch

    @staticmethod
    def to_device(loader: Iterable, x: Any, y: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """How every batch reaches the training device: one of these loaders finishes its own
        batch there (decodes, cuts, normalises: `loader.to_device`); another iterable's batch
        (a test's) is moved as it is."""
        finish = getattr(loader, "to_device", None)
        if finish is not None:
            return finish(x, y)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    @property
    def start_processes(self) -> bool:
        """Iterating them starts worker processes (forked, where the platform can)."""
        return any(isinstance(loader, DataLoader) and loader.num_workers > 0 for loader in (self.train, self.val))


def batched(module: ModuleType, dataset: DatasetConfig) -> bool:
    """In memory, with augmentations that run on a whole batch: no per-sample work at all."""
    from data.transforms import per_image_options, resize_options

    return hasattr(module, "arrays") and not resize_options(dataset) and not per_image_options(dataset)


def build_loaders(
    dataset: DatasetConfig, data: DataConfig, ctx: DistContext, global_batch: int, seed: int,
    shuffle: bool = True, drop_last: bool = False, global_val_batch: int | None = None,
) -> Loaders:
    """Each rank gets `global_batch / world_size` per step; validation covers every sample once,
    `global_val_batch` (default `global_batch`) at a time. `shuffle=False` (trainer.overfit_batches):
    every epoch draws the same batches; `drop_last`: every training batch has the same shape."""
    from data import decode
    from data.download import prepare
    from data.sample_loader import SampleLoader, Split
    from data.transforms import ToDevice

    module = dataset_module(dataset.name)
    prepare(module, dataset, ctx)
    batch = global_batch // ctx.world_size
    val_batch = (global_val_batch or global_batch) // ctx.world_size
    if batched(module, dataset):  # data.check sent data.loader=device nowhere else
        held_on = ctx.device if data.loader == Loader.device else torch.device("cpu")
        return _tensor_loaders(module, dataset, data, ctx, (batch, val_batch), seed, shuffle, drop_last, held_on)
    if hasattr(module, "image_files"):
        train_split, val_split = decode.splits(module, dataset, data, ctx.device, seed, ctx.rank)
    else:
        train_set, val_set = module.load(dataset)
        finish = ToDevice(dataset, 255, ctx.device)  # the uint8 that PILToTensor ends in
        train_split, val_split = Split(EpochSeeded(train_set, seed, ctx.rank), finish), Split(val_set, finish)
    workers = num_workers(data, ctx)
    pin = ctx.device.type == "cuda" if data.pin_memory is None else data.pin_memory
    options = dict(
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=data.persistent_workers and workers > 0,
        multiprocessing_context=_fork_if_possible() if workers > 0 else None,
    )
    sampler = train_sampler(train_split.dataset, ctx.world_size, ctx.rank, data.repeated_augmentations, shuffle, seed)
    train = SampleLoader(train_split, batch_size=batch, sampler=EpochIndices(sampler), drop_last=drop_last, **options)
    # A strided shard without padding: every validation sample is counted exactly once globally.
    val_shard = Subset(val_split.dataset, range(ctx.rank, len(val_split.dataset), ctx.world_size))
    val = SampleLoader(replace(val_split, dataset=val_shard), batch_size=val_batch, shuffle=False, **options)
    return Loaders(train, val, sampler)


def _tensor_loaders(
    module: ModuleType, dataset: DatasetConfig, data: DataConfig, ctx: DistContext, batches: tuple[int, int],
    seed: int, shuffle: bool, drop_last: bool, held_on: torch.device,
) -> Loaders:
    from data.tensor_loader import TensorLoader
    from data.transforms import BatchTransform, ToDevice

    train_set, val_set = module.arrays(dataset)
    transform, to_device = BatchTransform(dataset), ToDevice(dataset, train_set.scale, ctx.device)
    sampler = train_sampler(train_set, ctx.world_size, ctx.rank, data.repeated_augmentations, shuffle, seed)
    batch, val_batch = batches
    train = TensorLoader(train_set, transform, to_device, batch, held_on, sampler, seed, ctx.rank, drop_last)
    val = TensorLoader(val_set, transform, to_device, val_batch, held_on, range(ctx.rank, len(val_set), ctx.world_size))
    return Loaders(train, val, sampler)


def num_workers(data: DataConfig, ctx: DistContext, env: Mapping[str, str] = os.environ) -> int:
    """`data.num_workers=null`: one worker per CPU of this rank (distributed.context.cpus_per_rank)."""
    if data.num_workers is not None:
        return data.num_workers
    return cpus_per_rank(ctx.local_world_size, env)


def _fork_if_possible() -> str | None:
    """Ranks started by torch.multiprocessing.spawn would spawn their workers too, and each would
    import torch and the project afresh (seconds each); forked workers start at once."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


class EpochIndices(Sampler):
    """The sampler's indices, each with the epoch it was drawn for and its position in it (see
    EpochSeeded, and data.files.Positioned)."""

    def __init__(self, sampler: DistributedSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return ((index, self.sampler.epoch, position) for position, index in enumerate(self.sampler))


class EpochSeeded(Dataset):
    """Reseeds each DataLoader worker at the start of every epoch from (seed, epoch, rank, worker).

    Persistent workers are created once and would otherwise carry their random state across
    epochs, so a run resumed at epoch e would augment differently from one that got there.
    Without workers the training loop has already seeded this process for the epoch.
    """

    def __init__(self, dataset: Dataset, seed: int, rank: int) -> None:
        self.dataset, self.seed, self.rank = dataset, seed, rank
        self.epoch: int | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int, int]) -> Any:
        index, epoch, _ = item
        worker = get_worker_info()
        if worker is not None and epoch != self.epoch:
            self.epoch = epoch
            torch.manual_seed(epoch_seed(self.seed, epoch, self.rank) + worker.id)
        return self.dataset[index]
