"""Datasets and per-rank loaders. Knows DistContext, nothing else of the distributed world."""

from __future__ import annotations

import importlib
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, Subset, get_worker_info

from config.schema import DataConfig, DatasetConfig, Loader
from data.sampler import train_sampler
from distributed.context import DistContext, cpus_per_rank, epoch_seed
from errors import ConfigError

if TYPE_CHECKING:
    from data.arrays import ImageArrays
    from data.sample_loader import SampleLoader
    from data.tensor_loader import TensorLoader

# dataset.name -> what serves it: a module ("data.cifar10"), or an object in one ("data.fashion_mnist:
# FASHION_MNIST"), imported on use to keep start-up lean. The one list of datasets: every message, the
# download command's usage and the tests derive theirs from it; conf/dataset/<name>.yaml picks one.
DATASETS = {
    "digits": "data.digits",
    "synthetic": "data.synthetic",
    "mnist": "data.mnist:MNIST",
    "fashion_mnist": "data.fashion_mnist:FASHION_MNIST",
    "kmnist": "data.kmnist:KMNIST",
    "cifar10": "data.cifar10",
    "imagefolder": "data.imagefolder",
}


@runtime_checkable
class InMemory(Protocol):
    """Whole splits that fit in memory: a TensorLoader cuts them into batches and augments a batch at a
    time, on the CPU or, with data.loader=device, on the training device."""

    def arrays(self, cfg: DatasetConfig) -> tuple[ImageArrays, ImageArrays]: ...  # (train, val)


@runtime_checkable
class PerSample(Protocol):
    """Datasets of (image tensor, label) for DataLoader workers: files decoded, or images transformed
    (dataset.auto_augment, resize, random_erase), one at a time."""

    def load(self, cfg: DatasetConfig) -> tuple[Dataset, Dataset]: ...  # (train, val)


@runtime_checkable
class ImageFiles(Protocol):
    """A folder of image files, listed as (path, class index): DataLoader workers read them, and
    decode and cut them (data.decode=cpu) or hand the bytes to the training device to (gpu)."""

    def image_files(self, cfg: DatasetConfig) -> tuple[Sequence[tuple[str, int]], Sequence[tuple[str, int]]]: ...


@runtime_checkable
class OnDisk(Protocol):
    """Files under dataset.root in torchvision's layout, which rank 0 fetches in a run (or
    `python download.py` ahead of one) and data.check reads whole before launch."""

    def files(self, root: Path) -> list[Path]: ...  # every file, as it lies under root
    def download(self, root: Path) -> None: ...  # torchvision's download code
    def read(self, root: Path) -> tuple[ImageArrays, ImageArrays]: ...  # malformed: a one-line ConfigError


DatasetModule = InMemory | PerSample | ImageFiles
"""What serves one dataset: a module of data/, or an object, named in DATASETS.

Required: `arrays(cfg)` (InMemory), `load(cfg)` (PerSample), or both; or `image_files(cfg)`
(ImageFiles: decoded to RGB, so dataset.channels=3); with files to fetch, also `files`, `download`
and `read` (OnDisk). Optional:
- IMAGE_SIZE: int, the stored images' side (data.check holds dataset.image_size to it);
- PER_IMAGE_TRANSFORMS: bool, whether `load` or `image_files` takes the per-image options (auto_augment, resize, ...);
- check(cfg): its own checks before launch, as one-line ConfigErrors;
- count_classes(cfg) -> int: what dataset.num_classes=null counts;
- class_names(cfg) -> list[str]: each class's name, by label (else class_names() gives the labels' numbers).
Every function takes the typed DatasetConfig (config.schema) or dataset.root; docs/EXTENDING.md has the recipe.
"""


def dataset_module(name: str) -> DatasetModule:
    if name not in DATASETS:
        raise ConfigError(
            f"dataset.name={name}: no module serves it; register one in data/__init__.py's DATASETS "
            f'("{name}": "data.{name}"), beside {", ".join(sorted(DATASETS))}'
        )
    where, _, attribute = DATASETS[name].partition(":")
    module = importlib.import_module(where)
    served = getattr(module, attribute) if attribute else module
    if not isinstance(served, (InMemory, PerSample, ImageFiles)):
        raise ConfigError(
            f"{DATASETS[name]} serves dataset={name} but has none of arrays(cfg), load(cfg), image_files(cfg); "
            "give it one (data.DatasetModule)"
        )
    return served


def serving(kind: type) -> list[str]:
    """The datasets whose module is `kind` (InMemory, PerSample, ImageFiles, OnDisk), for the lists messages give."""
    return sorted(name for name in DATASETS if isinstance(dataset_module(name), kind))


def _per_image(module: DatasetModule) -> bool:
    return getattr(module, "PER_IMAGE_TRANSFORMS", False)


def num_classes(dataset: DatasetConfig) -> int:
    """dataset.num_classes=null: what the dataset holds (an image folder counts its class folders)."""
    module = dataset_module(dataset.name)
    if not hasattr(module, "count_classes"):  # optional (DatasetModule)
        raise ConfigError(f"dataset.num_classes=null: dataset={dataset.name} cannot count its classes; give the number")
    return module.count_classes(dataset)


def class_names(dataset: DatasetConfig) -> list[str]:
    """Each class's name, by label: what the dataset calls them (its optional class_names(cfg): CIFAR-10's
    names, an image folder's folders), else the label's number. Runs record them (training.manifest),
    so that what reads a run back names its classes without the dataset's files."""
    module = dataset_module(dataset.name)
    if hasattr(module, "class_names"):  # optional (DatasetModule)
        return list(module.class_names(dataset))
    return [str(label) for label in range(dataset.num_classes)]


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
    if data.loader == Loader.device and not isinstance(module, InMemory):
        raise ConfigError(
            f"data.loader=device holds the dataset in device memory, which dataset={dataset.name} does not "
            "suit; use data.loader=dataloader"
        )
    resizing = resize_options(dataset)
    per_image = {**resizing, **per_image_options(dataset)}
    # Every such key in one line: a recipe sets several (tv_resnet50: five), and naming one at a time
    # turns the fix into as many runs.
    given = ", ".join(f"dataset.{key}={value}" for key, value in per_image.items())
    off = " ".join(f"dataset.{key}={0 if key == 'random_erase' else 'null'}" for key in per_image)
    if per_image and data.loader == Loader.device:
        what = "is a per-image transform" if len(per_image) == 1 else "are per-image transforms"
        raise ConfigError(
            f"data.loader=device transforms whole batches at the stored size, but {given} {what} of the "
            f"DataLoader path; use data.loader=dataloader, or {off}"
        )
    if per_image and not _per_image(module):
        others = ", ".join(name for name in sorted(DATASETS) if _per_image(dataset_module(name)))
        verb, it = ("transforms", "it") if len(per_image) == 1 else ("transform", "them")
        raise ConfigError(
            f"{given} {verb} each image, but dataset={dataset.name} serves ready tensors; "
            f"use a dataset that takes {it} ({others}), or {off}"
        )
    if resizing and (dataset.val_resize or dataset.resize) is None:
        key = next(iter(resizing))
        raise ConfigError(
            f"dataset.{key}={resizing[key]} asks for ImageNet-style transforms, which validate after a resize; "
            "set dataset.val_resize too (e.g. 256)"
        )
    stored = getattr(module, "IMAGE_SIZE", None)
    if stored is not None and not resizing and dataset.image_size != stored:  # the model is built for image_size
        resize = ", or dataset.resize=<px> to resize them" if _per_image(module) else ""
        raise ConfigError(
            f"dataset.image_size={dataset.image_size}: the {dataset.name} images are {stored}x{stored} and nothing "
            f"resizes them; set dataset.image_size={stored}{resize}"
        )
    if hasattr(module, "check"):  # optional (DatasetModule)
        module.check(dataset)
    if isinstance(module, OnDisk):
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


def batched(module: DatasetModule, dataset: DatasetConfig) -> bool:
    """In memory, with augmentations that run on a whole batch: no per-sample work at all."""
    from data.transforms import per_image_options, resize_options

    return isinstance(module, InMemory) and not resize_options(dataset) and not per_image_options(dataset)


def build_loaders(
    dataset: DatasetConfig,
    data: DataConfig,
    ctx: DistContext,
    global_batch: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
    global_val_batch: int | None = None,
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
    if isinstance(module, ImageFiles):
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
    module: InMemory,
    dataset: DatasetConfig,
    data: DataConfig,
    ctx: DistContext,
    batches: tuple[int, int],
    seed: int,
    shuffle: bool,
    drop_last: bool,
    held_on: torch.device,
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
    EpochSeeded, and data.file_batches.Positioned)."""

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
