"""Per-rank loaders: the global batch splits evenly and validation counts every sample once."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

import data
from config.schema import AutoAugment
from config.setup import CONF_DIR
from data import DATASETS, EpochSeeded, build_loaders, dataset_module
from distributed.context import make_context
from errors import ConfigError
from tests.configs import typed_config
from tests.dataset_files import write_image_folder


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_validation_shards_cover_every_sample_exactly_once(world_size):
    cfg = typed_config()
    seen = []
    for rank in range(world_size):
        ctx = make_context(rank, rank, world_size, world_size, "cpu", use_process_group=False)
        loaders = build_loaders(cfg.dataset, cfg.data, ctx, global_batch=12, seed=0)
        seen += list(loaders.val.order)
        assert loaders.train.batch_size == 12 // world_size
    assert sorted(seen) == list(range(360))


def test_train_shards_are_disjoint_and_reshuffled_each_epoch():
    cfg = typed_config()
    orders = {}
    for rank in range(2):
        ctx = make_context(rank, rank, 2, 2, "cpu", use_process_group=False)
        sampler = build_loaders(cfg.dataset, cfg.data, ctx, global_batch=8, seed=0).train_sampler
        for epoch in range(2):
            sampler.set_epoch(epoch)
            orders[rank, epoch] = list(sampler)
    for epoch in range(2):
        # 1,437 samples: DistributedSampler pads one duplicate so both ranks take 719 steps' worth
        assert len(set(orders[0, epoch]) | set(orders[1, epoch])) == 1437
    assert orders[0, 0] != orders[0, 1]


def test_digits_are_sklearns_and_the_split_is_stratified_and_fixed():
    from data import digits

    images, labels = digits.images_and_labels()
    # sklearn.datasets.load_digits(return_X_y=True) of scikit-learn 1.9.1, as uint8 bytes, images then labels
    shipped = hashlib.sha256(images.astype(np.uint8).tobytes() + labels.astype(np.uint8).tobytes()).hexdigest()
    assert shipped == "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
    assert images.shape == (1797, 64) and images.min() == 0 and images.max() == 16
    train, val = digits.stratified_split(labels, 0.2)
    assert (len(train), len(val)) == (1437, 360) and not set(train) & set(val)
    share = np.bincount(labels[val]) / np.bincount(labels)
    assert share.min() > 0.18 and share.max() < 0.22  # every class keeps its fifth
    assert np.array_equal(val, digits.stratified_split(labels, 0.2)[1])


@pytest.fixture(scope="module")
def defaults():
    return typed_config()  # dataset=digits


@pytest.fixture(scope="module")
def digits_labels():
    from data import digits

    return digits.images_and_labels()[1]


@pytest.mark.parametrize("fraction", [-0.1, 0.0, 1e-9, 0.2, 0.9994, 0.9995, 1.0, 1.5])
def test_digits_val_fraction_is_refused_before_launch_exactly_when_a_side_would_be_empty(
    defaults, digits_labels, fraction
):
    from data import check, digits

    assert digits.SIZE == len(digits_labels)
    in_range = 0 <= fraction <= 1  # stratified_split cannot even be asked outside
    train, val = digits.stratified_split(digits_labels, fraction) if in_range else ([], [])
    dataset = replace(defaults.dataset, val_fraction=fraction)
    if len(train) and len(val):
        check(dataset, defaults.data)
        return
    with pytest.raises(ConfigError) as error:
        check(dataset, defaults.data)
    assert f"dataset.val_fraction={fraction}:" in str(error.value) and "\n" not in str(error.value)


def test_negative_num_workers_is_refused_before_launch(defaults):
    from data import check

    with pytest.raises(ConfigError, match=r"^data.num_workers=-1: use 0 .*or null"):
        check(defaults.dataset, replace(defaults.data, num_workers=-1))
    check(defaults.dataset, replace(defaults.data, num_workers=0))


@pytest.mark.parametrize("source", ["digits", "imagefolder"])  # a batched loader, and a DataLoader of files
def test_validation_takes_its_own_global_batch(tmp_path, source):
    options = (
        []
        if source == "digits"
        else [
            "dataset=imagefolder",
            f"dataset.root={write_image_folder(tmp_path, classes=2, per_class=5)}",
            "dataset.num_classes=2",
            "data.num_workers=0",
        ]
    )
    cfg = typed_config(*options)
    ctx = make_context(1, 1, 2, 2, "cpu", use_process_group=False)
    loaders = build_loaders(cfg.dataset, cfg.data, ctx, global_batch=4, seed=0, global_val_batch=8)
    assert [len(y) for _, y in loaders.train][0] == 2
    assert [len(y) for _, y in loaders.val][0] == 4  # 8 over 2 ranks


def test_each_dataloader_worker_augments_from_a_seed_of_its_own(monkeypatch):
    draws = {}
    for worker in (0, 1, 0):
        monkeypatch.setattr(data, "get_worker_info", lambda worker=worker: SimpleNamespace(id=worker))
        seeded = EpochSeeded(_RandomItems(), seed=0, rank=0)
        draws.setdefault(worker, []).append([seeded[i, 0, i].item() for i in range(3)])
    assert draws[0][0] == draws[0][1] != draws[1][0]  # repeatable per worker, apart between workers


class _RandomItems(torch.utils.data.Dataset):
    """Each item a fresh draw, as a random crop or flip is."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(())


def test_every_dataset_config_is_served_by_a_registered_module_and_every_module_has_a_config():
    names = {path.stem: yaml.safe_load(path.read_text())["name"] for path in (CONF_DIR / "dataset").glob("*.yaml")}
    assert all(stem == name for stem, name in names.items())  # dataset=<file> is dataset.name=<file>
    assert set(names) == set(DATASETS)
    for name in DATASETS:
        dataset_module(name)  # imports, and serves arrays(cfg) or load(cfg)


def test_a_dataset_no_module_serves_is_one_line_saying_where_to_register(defaults):
    with pytest.raises(ConfigError) as error:
        data.check(replace(defaults.dataset, name="fashion"), defaults.data)
    assert str(error.value).startswith(
        'dataset.name=fashion: no module serves it; register one in data/__init__.py\'s DATASETS ("fashion": '
        '"data.fashion"), beside cifar10, digits, '
    )
    assert "\n" not in str(error.value)


def test_per_image_options_on_ready_tensors_name_the_datasets_that_take_them(defaults):
    with pytest.raises(ConfigError) as error:
        data.check(replace(defaults.dataset, random_erase=0.5), defaults.data)
    takes = [name for name in DATASETS if getattr(dataset_module(name), "PER_IMAGE_TRANSFORMS", False)]
    assert f"use a dataset that takes it ({', '.join(sorted(takes))}), or dataset.random_erase=0" in str(error.value)
    assert {"mnist", "fashion_mnist", "kmnist", "cifar10", "imagefolder"} <= set(takes)


def test_per_image_options_on_ready_tensors_are_named_together_with_one_fix(defaults):
    with pytest.raises(ConfigError) as error:
        data.check(replace(defaults.dataset, random_erase=0.5, auto_augment=AutoAugment.ta_wide), defaults.data)
    message = str(error.value)
    assert message.startswith("dataset.auto_augment=ta_wide, dataset.random_erase=0.5 transform each image")
    assert message.endswith("or dataset.auto_augment=null dataset.random_erase=0")
