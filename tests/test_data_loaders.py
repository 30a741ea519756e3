"""The two loaders: `data.loader=device` shards and orders exactly like the DataLoader path, its
batched augmentation is the torchvision one, randomness follows (seed, epoch, rank); worker counts."""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from data import build_loaders, imagefolder, num_workers
from data.sampler import RepeatedAugmentationSampler
from data.transforms import random_crop_flip
from distributed.context import make_context
from errors import ConfigError
from tests.configs import typed_config
from tests.dataset_files import write_cifar


def _ctx(rank: int = 0, world_size: int = 1):
    return make_context(rank, rank, world_size, world_size, "cpu", use_process_group=False)


def _loaders(cfg, rank=0, world_size=1, batch=16, seed=0):
    return build_loaders(cfg.dataset, cfg.data, _ctx(rank, world_size), global_batch=batch, seed=seed)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, per_batch=13, val=21)  # 65 training images: 2 ranks need one padded duplicate
    return root


def _cifar(root, *overrides):
    return typed_config("dataset=cifar10", f"dataset.root={root}", "data.num_workers=0", *overrides)


def test_device_shards_are_disjoint_cover_the_epoch_and_match_the_dataloader_order(cifar_root):
    labels, shards = {}, {}
    for rank in range(2):
        for name in ("dataloader", "device"):
            loaders = _loaders(_cifar(cifar_root, f"data.loader={name}"), rank, 2, batch=8)
            loaders.train_sampler.set_epoch(3)
            labels[name, rank] = torch.cat([y for _, y in loaders.train])
            assert len(loaders.train) == 9  # 33 samples per rank in batches of 4
        shards[rank] = list(loaders.train.order)
    # the same samples in the same order as DistributedSampler hands the DataLoader
    assert all(torch.equal(labels["device", r], labels["dataloader", r]) for r in range(2))
    assert set(shards[0]) | set(shards[1]) == set(range(65))
    assert len(set(shards[0]) & set(shards[1])) == 1  # the sampler's one padded duplicate


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_device_validation_equals_the_dataloader_path_and_counts_each_sample_once(cifar_root, world_size):
    seen = 0
    for rank in range(world_size):
        device = _loaders(_cifar(cifar_root, "data.loader=device"), rank, world_size).val
        reference = _loaders(_cifar(cifar_root), rank, world_size).val
        pairs = list(zip(device, reference, strict=True))
        for (x, y), (x_ref, y_ref) in pairs:
            assert torch.equal(y, y_ref)
            torch.testing.assert_close(x, x_ref, rtol=0, atol=1e-6)
            seen += len(y)
    assert seen == 21


def test_digits_device_loader_trains_on_the_same_batches_as_the_dataloader():
    batches = {}
    for name in ("dataloader", "device"):
        loaders = _loaders(typed_config(f"data.loader={name}"), batch=64)
        loaders.train_sampler.set_epoch(1)
        batches[name] = list(loaders.train)
    for (x, y), (x_ref, y_ref) in zip(batches["device"], batches["dataloader"], strict=True):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_synthetic_device_loader_serves_the_tensors_unchanged():
    x, y = next(iter(_loaders(typed_config("dataset=synthetic", "data.loader=device"), batch=512).val))
    x_ref, y_ref = next(iter(_loaders(typed_config("dataset=synthetic"), batch=512).val))
    assert x.shape == (512, 3, 32, 32) and torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_batched_crop_and_flip_are_torchvisions_per_image_ones():
    images = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    padded = torch.nn.functional.pad(images, (2,) * 4)
    candidates = [padded[:, :, top : top + 8, left : left + 8] for top in range(5) for left in range(5)]
    candidates += [c.flip(3) for c in candidates]
    generator = torch.Generator().manual_seed(0)
    out = random_crop_flip(images, 2, True, generator)
    hits = torch.stack([(out == c).flatten(1).all(1) for c in candidates])  # candidate x image
    assert hits.any(0).all()  # every output is one of the 50 crops/flips of its own image
    offsets_used = hits.float().argmax(0)
    assert len(offsets_used.unique()) > 10  # and they vary from image to image
    assert 0.25 < (hits[25:].any(0) & ~hits[:25].any(0)).float().mean() < 0.75  # about half flipped
    flipped_only = random_crop_flip(images, 0, True, generator)
    assert all(torch.equal(o, i) or torch.equal(o, i.flip(2)) for o, i in zip(flipped_only, images))


def test_device_augmentation_follows_seed_epoch_and_rank(cifar_root):
    cfg = _cifar(cifar_root, "data.loader=device")

    def first_batch(epoch, rank=0, seed=0):
        loaders = _loaders(cfg, rank, 2, seed=seed)
        loaders.train_sampler.set_epoch(epoch)
        return next(iter(loaders.train))[0]

    unbroken = _loaders(cfg, 0, 2)
    for epoch in range(2):
        unbroken.train_sampler.set_epoch(epoch)
        after_epoch_0 = next(iter(unbroken.train))[0]
    assert torch.equal(first_batch(1), after_epoch_0)  # a run resumed at epoch 1 draws the same
    assert not torch.equal(first_batch(1), first_batch(2))
    assert not torch.equal(first_batch(1, rank=0), first_batch(1, rank=1))


def test_each_rank_trains_its_epoch_from_a_seed_of_its_own(tmp_path):
    """Dropout and in-process augmentation draw from the host stream the epoch seeds: one seed for
    every rank would give all ranks the same dropout masks and crops."""
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from data import Loaders
    from tests.test_train_step import _trainer

    data = TensorDataset(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    loaders = Loaders(DataLoader(data, batch_size=2, sampler=sampler), DataLoader(data), sampler)
    seeds = []
    for rank in (0, 1, 0):
        trainer = _trainer(nn.Linear(2, 2), tmp_path / str(rank), _ctx(rank, 2), loaders=loaders)
        trainer.train_epoch()
        seeds.append(torch.initial_seed())  # what the epoch seeded the host stream with
    assert seeds[0] == seeds[2] != seeds[1]


@pytest.mark.slow
def test_persistent_workers_augment_a_resumed_epoch_as_an_unbroken_run_does(cifar_root):
    cfg = _cifar(cifar_root, "data.num_workers=2", "dataset.resize=40")  # ImageNet-style: per sample
    unbroken = _loaders(cfg)
    for epoch in range(2):
        unbroken.train_sampler.set_epoch(epoch)
        batches = [x for x, _ in unbroken.train]
    resumed = _loaders(cfg)
    resumed.train_sampler.set_epoch(1)
    for x, x_ref in zip(resumed.train, batches, strict=True):
        assert torch.equal(x[0], x_ref)


@pytest.mark.parametrize("per_image, loader", [(("dataset.resize=40",), "DataLoader"), ((), "TensorLoader")])
def test_repeated_augmentation_reaches_both_loaders_each_image_three_times_in_a_row(cifar_root, per_image, loader):
    loaders = _loaders(_cifar(cifar_root, "data.repeated_augmentations=3", *per_image), batch=12)
    assert isinstance(loaders.train, torch.utils.data.DataLoader) == (loader == "DataLoader")
    assert isinstance(loaders.train_sampler, RepeatedAugmentationSampler) and loaders.train_sampler.repetitions == 3
    loaders.train_sampler.set_epoch(1)
    if loader == "DataLoader":  # the indices the loader itself draws (with their epoch and position)
        indices = [index for index, *_ in next(iter(loaders.train.batch_sampler))]
    else:
        indices = list(loaders.train.order)[:12]
    runs = torch.tensor(indices).view(4, 3)
    assert (runs == runs[:, :1]).all() and len(set(runs[:, 0].tolist())) == 4, indices
    _, labels = next(iter(loaders.train))  # and the batch it serves: 4 images, each 3 times
    assert (labels.view(4, 3) == labels.view(4, 3)[:, :1]).all(), labels


def test_num_workers_auto_splits_the_tasks_cpus_among_local_ranks(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))  # the CPUs this process may use
    cfg = typed_config()
    two_ranks = make_context(0, 0, 2, 2, "cpu", use_process_group=False)
    assert num_workers(cfg.data, two_ranks, env={"SLURM_CPUS_PER_TASK": "8"}) == 4
    assert num_workers(cfg.data, two_ranks, env={}) == 4
    # srun started each rank as a task of its own: the task's CPUs are this rank's alone, but never
    # more than it may use (since SLURM 22.05 an srun without -c binds fewer than the variable says)
    srun_task = {"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}
    assert num_workers(cfg.data, two_ranks, env=srun_task | {"SLURM_CPUS_PER_TASK": "6"}) == 6
    assert num_workers(cfg.data, two_ranks, env=srun_task | {"SLURM_CPUS_PER_TASK": "16"}) == 8
    fixed = typed_config("data.num_workers=3")
    assert num_workers(fixed.data, two_ranks, env={"SLURM_CPUS_PER_TASK": "8"}) == 3


def test_in_memory_sets_are_cut_into_batches_without_workers_and_files_go_through_a_dataloader(tmp_path):
    """Per-sample work (and worker processes) only where images must be decoded or resized."""
    from data.tensor_loader import TensorLoader
    from tests.dataset_files import write_image_folder

    for overrides in ((), ("dataset=synthetic",)):
        loaders = _loaders(typed_config(*overrides))
        assert isinstance(loaders.train, TensorLoader) and loaders.train.device == torch.device("cpu")
    root = write_image_folder(tmp_path, classes=2, per_class=2, size=8)
    folder = _loaders(typed_config("dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=2"))
    assert isinstance(folder.train, torch.utils.data.DataLoader)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_unreadable_image_is_one_line_whether_or_not_a_worker_decodes_it(tmp_path, workers):
    """A DataLoader worker re-raises an error around its whole traceback (torch's ExceptionWrapper)."""
    from tests.dataset_files import write_image_folder

    root = write_image_folder(tmp_path, classes=2, per_class=1, size=8)
    broken = root / "val" / "class1" / "broken.png"
    broken.write_bytes(b"not a png")
    cfg = typed_config(
        "dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=2", f"data.num_workers={workers}"
    )
    loaders = _loaders(cfg, batch=4)
    with pytest.raises(ConfigError) as error:
        list(loaders.val)
    message = str(error.value)
    # Kept, the ExceptionInfo and this frame would hold each other, and the loader with its persistent
    # worker, until a garbage collection in a later test, which then waits 5 s for the worker
    # (data/worker_errors.py says why).
    del error
    assert message.startswith(f"{broken}: unreadable image (") and message.endswith("; delete or replace it")
    assert "\n" not in message
    assert len(list(loaders.train)) == 1  # the loader still serves the readable split


@pytest.mark.parametrize("persistent", [True, False])
def test_a_workers_one_line_error_lets_its_worker_go_at_once(tmp_path, persistent):
    """Not at a garbage collection, which would wait 5 s for the worker (data/worker_errors.py):
    with the collector off, dropping the loader after its error ends the worker there and then."""
    from tests.dataset_files import write_image_folder

    root = write_image_folder(tmp_path, classes=2, per_class=1, size=8)
    (root / "val" / "class1" / "broken.png").write_bytes(b"not a png")
    cfg = typed_config(
        "dataset=imagefolder",
        f"dataset.root={root}",
        "dataset.num_classes=2",
        "data.num_workers=1",
        f"data.persistent_workers={persistent}",
    )
    # data.imagefolder imported with this file: importing torchvision keeps the importer's frame, and
    # a first import inside build_loaders would keep its frame, with the loaders it makes, for good.
    assert imagefolder
    before = set(multiprocessing.active_children())
    gc.disable()
    try:
        loaders = _loaders(cfg, batch=4)
        try:  # not pytest.raises, which keeps the error past the block
            list(loaders.val)
        except ConfigError:
            pass
        else:
            pytest.fail("the broken image raised no ConfigError")
        del loaders
        assert set(multiprocessing.active_children()) == before
    finally:
        gc.enable()
