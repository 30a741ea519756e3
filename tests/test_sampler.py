"""data.repeated_augmentations' sampler against its definition (torchvision's RASampler, DeiT), and
on the edges: a set smaller than the world, no shuffle (test_recipes.py holds the common case)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

from data.sampler import RepeatedAugmentationSampler, train_sampler


def _ranks(size: int, world: int, repetitions: int, **options) -> list[list[int]]:
    return [
        list(RepeatedAugmentationSampler(list(range(size)), world, rank, repetitions, **options))
        for rank in range(world)
    ]


def test_the_order_is_the_seeded_permutation_of_seed_plus_epoch_each_image_n_times_strided_over_the_ranks():
    sampler = RepeatedAugmentationSampler(list(range(7)), num_replicas=2, rank=1, repetitions=3, seed=5)
    sampler.set_epoch(2)
    drawn = torch.randperm(7, generator=torch.Generator().manual_seed(5 + 2)).repeat_interleave(3).tolist()
    assert list(sampler) == drawn[1::2][:3] and len(sampler) == 3  # 7 // 2 samples a rank


def test_without_shuffle_each_image_comes_n_times_in_the_sets_order():
    assert _ranks(6, 2, 2, shuffle=False) == [[0, 1, 2], [0, 1, 2]]


def test_its_default_seed_is_distributed_samplers():
    data = list(range(6))
    assert list(RepeatedAugmentationSampler(data, 1, 0, 2)) == list(RepeatedAugmentationSampler(data, 1, 0, 2, seed=0))
    assert RepeatedAugmentationSampler(data, 1, 0, 2).seed == DistributedSampler(data, 1, 0).seed


@pytest.mark.parametrize("world, repetitions", [(2, 1), (4, 1), (8, 3)])
def test_every_rank_draws_as_many_samples_as_it_counts_even_from_a_set_smaller_than_the_world(world, repetitions):
    # Ranks that drew fewer batches than the others would wait for them at the next all-reduce.
    samplers = [RepeatedAugmentationSampler([0], world, rank, repetitions) for rank in range(world)]
    assert [list(sampler) for sampler in samplers] == [[0]] * world and {len(s) for s in samplers} == {1}


@pytest.mark.parametrize("shuffle", [False, True])
def test_train_sampler_hands_on_the_order_options(shuffle):
    data = list(range(8))
    plain = train_sampler(data, 2, 1, repetitions=1, shuffle=shuffle, seed=3)
    assert list(plain) == list(DistributedSampler(data, 2, 1, shuffle=shuffle, seed=3))
    repeated = train_sampler(data, 2, 1, repetitions=2, shuffle=shuffle, seed=3)  # 2: already repeated
    assert list(repeated) == list(RepeatedAugmentationSampler(data, 2, 1, 2, shuffle=shuffle, seed=3))
    assert list(repeated) != list(plain)
