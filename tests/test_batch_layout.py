"""An elastic world (torchrun --nnodes=MIN:MAX): the world from the launcher (trainer.num_nodes=null),
the global batch and the sample order kept at any world size by a derived accumulation
(trainer.max_batch_per_device, training/batch_layout.py), and a checkpoint resumed at another world.
The re-forms themselves, on two nodes: tests/test_slurm_elastic.py."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
import torch

from config.schema import TrainerConfig
from distributed import strategies
from distributed.launch import LaunchPlan, plan_launch
from errors import ConfigError
from preflight import _check_world
from tests.configs import typed_config
from tests.runs import last_weights, relative_error, run_train
from training.batch_layout import BatchLayout, carry_over
from training.checkpoint.state import TrainState

# Two nodes of one rank each, as torchrun --nnodes=1:2 --nproc-per-node=1 starts them.
TWO_NODES = {
    "RANK": "1",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "elastic",
}


def test_a_rank_share_above_the_limit_trains_as_equal_micro_batches_accumulated_to_the_same_step():
    settings = TrainerConfig(batch_size=64, accumulate_grad_batches=2, max_batch_per_device=16)
    layouts = {world: BatchLayout.of(settings, world) for world in (1, 2, 4)}
    assert [(lay.micro_batch, lay.split, lay.accumulate) for lay in layouts.values()] == [
        (16, 4, 8),
        (16, 2, 4),
        (16, 1, 2),
    ]
    assert BatchLayout.of(TrainerConfig(batch_size=64), 1).accumulate == 1  # no limit: no split
    # The fewest equal parts: 96 as 2 x 48, not 64 + 32 (unequal parts would weigh samples unequally).
    assert BatchLayout.of(TrainerConfig(batch_size=96, max_batch_per_device=64), 1).micro_batch == 48
    assert BatchLayout.of(TrainerConfig(batch_size=34, max_batch_per_device=16), 2).micro_batch == 1  # 17: prime
    assert BatchLayout.of(TrainerConfig(batch_size=64, max_batch_per_device=16), 1, devices_per_rank=2).split == 2
    val = BatchLayout.of(TrainerConfig(batch_size=20, val_batch_size=100, max_batch_per_device=16), 2)
    assert (val.val_micro_batch, val.val_split) == (10, 5)
    for batch, accumulate, limit, world in [
        (b, a, m, w) for b in (12, 64, 96) for a in (1, 3) for m in (1, 5, 32) for w in (1, 2, 3, 4)
    ]:
        if batch % world:
            continue
        lay = BatchLayout.of(
            TrainerConfig(batch_size=batch, accumulate_grad_batches=accumulate, max_batch_per_device=limit), world
        )
        assert lay.micro_batch * lay.accumulate * world == batch * accumulate and lay.micro_batch <= limit


def test_a_share_that_splits_only_into_small_micro_batches_names_a_batch_that_fills_them():
    prime = TrainerConfig(batch_size=34, max_batch_per_device=16)  # 17 a rank: 17 micro-batches of 1
    assert BatchLayout.of(prime, 2).underfilled(prime) == (
        "trainer.batch_size=34 gives each rank 17 samples, which split evenly only into 17 micro-batches of 1 "
        "under trainer.max_batch_per_device=16: slow; trainer.batch_size=64 fills them"
    )
    for batch, limit, world in [(48, 16, 1), (64, 16, 2), (96, 64, 1), (34, None, 2)]:  # 96 as 2 x 48 fills 64
        settings = TrainerConfig(batch_size=batch, max_batch_per_device=limit)
        assert BatchLayout.of(settings, world).underfilled(settings) is None, (batch, limit, world)
    # strategy=dp: a process's limit is its GPUs' (2 x 16); 34 as 2 x 17 fills them
    assert BatchLayout.of(prime, 1, devices_per_rank=2).underfilled(prime, devices_per_rank=2) is None


@pytest.mark.slow
def test_train_py_warns_once_of_a_prime_batch_that_splits_only_into_micro_batches_of_1(tmp_path):
    job = ["debug=fdr", "trainer.batch_size=13", "trainer.max_batch_per_device=4", "trainer.limit_train_batches=1"]
    result = run_train(tmp_path / "run", *job, "trainer.limit_val_batches=1")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert (
        log.count("into 13 micro-batches of 1 under trainer.max_batch_per_device=4: slow; trainer.batch_size=16") == 1
    )


def test_the_loop_counts_micro_batches_where_the_keys_count_batches():
    settings = TrainerConfig(batch_size=64, max_batch_per_device=16, limit_train_batches=3, limit_val_batches=2)
    loop = BatchLayout.of(settings, 2).loop_settings(settings)
    assert (loop.accumulate_grad_batches, loop.limit_train_batches, loop.limit_val_batches) == (2, 6, 4)
    assert BatchLayout.of(settings, 2).loop_settings(TrainerConfig(overfit_batches=1)).overfit_batches == 2


def test_the_loop_settings_keep_an_optimizer_steps_samples_and_so_the_emas_decay():
    """A share split into micro-batches is the same optimizer step: the EMA's decay, adjusted by a
    step's samples, stays the keys' own (it was refused, counted `split` times over)."""
    settings = TrainerConfig(batch_size=64, max_batch_per_device=16, ema_decay=0.99)
    for world in (1, 2):
        loop = BatchLayout.of(settings, world).loop_settings(settings)
        assert loop.batch_size * loop.accumulate_grad_batches == 64
        assert loop.ema_decay_per_update == settings.ema_decay_per_update


@pytest.mark.slow
def test_train_py_averages_the_weights_under_max_batch_per_device_as_without(tmp_path):
    job = ["debug=fdr", "model=simple_cnn", "trainer.ema_decay=0.99", "trainer.limit_val_batches=1"]
    figures = []
    for name, limit in (("whole", []), ("split", ["trainer.max_batch_per_device=16"])):
        result = run_train(tmp_path / name, *job, *limit)
        assert result.returncode == 0, result.stderr[-3000:]
        figures.append(json.loads((tmp_path / name / "metrics.json").read_text())["val_ema_loss"])
    assert figures[1] == pytest.approx(figures[0], rel=1e-5)


def test_every_optimizer_step_takes_the_same_run_of_the_epochs_order_at_any_world_and_accumulation():
    """DistributedSampler's stride (rank r: positions r, r + W, ...): the world's micro-batches of an
    optimizer step together are one contiguous run of the epoch's order, the same at every world."""
    from data.sampler import train_sampler

    dataset, settings = list(range(96)), TrainerConfig(batch_size=16, accumulate_grad_batches=2, max_batch_per_device=4)
    steps_by_world = {}
    for world in (1, 2, 4):
        lay = BatchLayout.of(settings, world)
        per_rank = []
        for rank in range(world):
            sampler = train_sampler(dataset, world, rank, 1, shuffle=True, seed=7)
            sampler.set_epoch(3)
            order = list(sampler)
            per_rank.append([order[i : i + lay.micro_batch] for i in range(0, len(order), lay.micro_batch)])
        steps_by_world[world] = [
            sorted(i for micro in range(s, s + lay.accumulate) for batches in per_rank for i in batches[micro])
            for s in range(0, len(per_rank[0]), lay.accumulate)
        ]
    assert steps_by_world[1] == steps_by_world[2] == steps_by_world[4]
    whole = torch.randperm(96, generator=torch.Generator().manual_seed(7 + 3)).tolist()
    assert steps_by_world[1] == [sorted(whole[i : i + 32]) for i in range(0, 96, 32)]


def test_a_mid_epoch_position_goes_on_after_the_same_samples_at_another_world(caplog):
    settings = TrainerConfig(batch_size=16, max_batch_per_device=8)
    two, one = BatchLayout.of(settings, 2), BatchLayout.of(settings, 1)
    with caplog.at_level(logging.INFO, logger="train"):
        assert carry_over(6, two, one) == 12  # 6 steps of 1 micro-batch of 8 per rank: 12 of 8 on one rank
    (line,) = caplog.messages
    assert line.startswith(
        "world size 2 -> 1 (the checkpoint's -> this run's): an optimizer step's 16 samples were 1 micro-batch of 8 "
        "per rank, now 2 micro-batches of 8 per rank, and the epoch goes on after its first 96 samples"
    ), line
    assert carry_over(12, one, two) == 6
    caplog.clear()
    assert carry_over(5, None, one) == 5 and carry_over(5, one, one) == 5  # a checkpoint of before, or of this world
    assert not caplog.messages
    # An epoch's end, padded to each world's multiple, is the new world's end of the epoch too.
    for samples in (100, 97, 64, 7):
        for old, new in [
            (two, one),
            (one, two),
            (
                BatchLayout.of(TrainerConfig(batch_size=12), 3),
                BatchLayout.of(TrainerConfig(batch_size=12, max_batch_per_device=5), 2),
            ),
        ]:
            end = math.ceil(math.ceil(samples / old.world_size) / old.micro_batch)
            assert carry_over(end, old, new) >= math.ceil(math.ceil(samples / new.world_size) / new.micro_batch)


def test_the_train_state_keeps_the_layout_its_position_counts_in_every_checkpoint(tmp_path):
    from distributed.context import DistContext
    from models.mnist_net import MnistNet
    from tests.runs import resume_point
    from training.checkpoint.checkpointer import Checkpointer

    ctx = DistContext(0, 0, 1, 1, torch.device("cpu"), None)
    model = MnistNet(1, 10, 8)
    checkpointer = Checkpointer(ctx, tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1), None, "")
    layout = BatchLayout.of(TrainerConfig(batch_size=16, max_batch_per_device=4), 2)
    checkpointer.save(TrainState(epoch=1, step=5, batch=10, layout=layout))
    checkpointer.close()
    assert torch.load(tmp_path / "last.pt", weights_only=True)["layout"]["split"] == 2
    restored = checkpointer.restore(resume_point(tmp_path / "last.pt"))
    assert (restored.batch, restored.layout) == (10, layout)


def test_num_nodes_null_takes_the_nodes_torchrun_started_and_a_fixed_count_must_agree():
    cfg = typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.num_nodes=null")
    assert plan_launch(cfg.trainer, strategies.get(cfg.strategy), cfg.launcher, TWO_NODES).num_nodes == 2
    assert plan_launch(cfg.trainer, strategies.get(cfg.strategy), cfg.launcher, {}).num_nodes == 1  # spawn: here
    fixed = typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.num_nodes=1")
    with pytest.raises(ConfigError, match="on 2 node.*but trainer.devices=1 trainer.num_nodes=1; set"):
        plan_launch(fixed.trainer, strategies.get(fixed.strategy), fixed.launcher, TWO_NODES)


def test_a_batch_per_device_or_node_needs_a_count_of_nodes_in_one_line():
    for experiment, resolver in [("mnist_net_ddp", "per_device:64"), ("imagenet_resnet50_ddp", "per_node:256")]:
        with pytest.raises(ConfigError) as error:
            typed_config(f"experiment={experiment}", "trainer.num_nodes=null")
        assert str(error.value) == (
            f"${{{resolver}}} counts the nodes, and trainer.num_nodes=null leaves them to the launcher; give the "
            "global batch itself (trainer.batch_size=N), or trainer.num_nodes"
        )


def test_an_elastic_world_the_global_batch_does_not_split_over_names_the_fix():
    plan = LaunchPlan("torchrun", "cpu", 1, 1, 3, True, None, None)
    with pytest.raises(ConfigError) as error:
        _check_world(TrainerConfig(batch_size=64, num_nodes=None), plan)
    assert str(error.value) == (
        "trainer.batch_size=64 is the global batch and must split evenly over 3 processes; use a multiple of 3, and "
        "with trainer.num_nodes=null, of every world size torchrun may re-form the job at (--nnodes=MIN:MAX x "
        "--nproc-per-node)"
    )


@pytest.mark.slow
def test_a_run_resumed_mid_epoch_at_another_world_ends_as_the_unbroken_run(tmp_path):
    """DDP(2) stopped after step 3 of 6 (trainer.max_steps: a mid-epoch last.pt), resumed at world 1
    with trainer.max_batch_per_device=8: each step's 16 samples as 2 micro-batches of 8, from the 49th
    sample of the epoch on. SimpleCNN (no dropout, no BatchNorm) makes it the same math as an unbroken
    DDP(2) run, summed in another order."""
    job = ["model=simple_cnn", "trainer.accelerator=cpu", "strategy=ddp", "trainer.batch_size=16", "trainer.epochs=1"]
    job += ["trainer.limit_train_batches=6", "trainer.limit_val_batches=1", "logger=none"]
    unbroken, run_dir = tmp_path / "unbroken", tmp_path / "run"
    for where, overrides in [
        (unbroken, ["trainer.devices=2"]),
        (run_dir, ["trainer.devices=2", "trainer.max_steps=3"]),
        (run_dir, ["trainer.devices=1", "trainer.max_batch_per_device=8", "trainer.resume=auto"]),
    ]:
        result = run_train(where, *job, *overrides)
        assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert re.search(r"world size 2 -> 1 .* and the epoch goes on after its first 48 samples", log), log[-2000:]
    assert "global batch 16 (2 micro-batches of 8 per rank: trainer.max_batch_per_device), from epoch 1 batch 7" in log
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 6
    assert relative_error(last_weights(run_dir), last_weights(unbroken)) < 1e-5
