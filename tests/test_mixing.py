"""trainer.mixup_alpha / cutmix_alpha against torchvision's transforms, seeded from (seed, epoch,
rank, batch); which of them Mixing.of builds (test_recipes.py holds what each does to a batch)."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from config.schema import TrainerConfig
from distributed.context import epoch_seed
from training.mixing import Mixing


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(4, 1, 8, 8, generator=generator), torch.tensor([0, 1, 2, 3])


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("transform, alphas", [(v2.MixUp, (0.2, 0.0)), (v2.CutMix, (0.0, 0.5))])
def test_a_batch_is_mixed_as_torchvision_mixes_it_seeded_by_seed_epoch_rank_and_batch(transform, alphas):
    x, y = _batch()
    mixed = Mixing(*alphas, num_classes=4, seed=3, rank=1)(x, y, epoch=2, batch=5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(epoch_seed(3, 2, 1) + 5)
        images, targets = transform(alpha=max(alphas), num_classes=4)(x, y)
    assert _same(mixed, (images, targets, targets.argmax(dim=1)))


def test_a_run_resumed_in_a_later_epoch_mixes_as_an_unbroken_one():
    x, y = _batch()
    unbroken = Mixing(0.2, 1.0, num_classes=4, seed=3, rank=0)
    unbroken(x, y, epoch=0, batch=0)
    resumed = Mixing(0.2, 1.0, num_classes=4, seed=3, rank=0)  # its first batch is epoch 1's
    assert _same(resumed(x, y, epoch=1, batch=2), unbroken(x, y, epoch=1, batch=2))


def test_mixing_of_the_settings_builds_what_they_ask_for():
    x, y = _batch()
    assert Mixing.of(TrainerConfig(), num_classes=4, rank=0) is None
    for mixup, cutmix in ((0.5, 0.0), (0.0, 0.5), (0.5, 2.0)):
        built = Mixing.of(TrainerConfig(mixup_alpha=mixup, cutmix_alpha=cutmix, seed=7), num_classes=4, rank=1)
        assert _same(built(x, y, 1, 2), Mixing(mixup, cutmix, num_classes=4, seed=7, rank=1)(x, y, 1, 2))
