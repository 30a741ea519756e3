"""Each seed's reproduction composes as its text says and runs, tiny, through `python train.py`; a seed's
first name (experiment=seed000) is its recipe's descriptive one."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from config.schema import LauncherName, LrScaling, OptimizerOptions, SchedulerOptions, StrategyName
from config.setup import CONF_DIR
from config.typed import optimizer_options, scheduler_options
from tests.configs import compose_config
from tests.dataset_files import write_cifar, write_idx, write_image_folder
from tests.runs import run_train

# Last, as on a command line: the recipe on the CPU, one batch to train and one to validate (what these
# runs test is that the recipe wires up and runs end to end, which a second batch would not add to).
TINY = ("debug=fdr", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1")
# What these runs test is the recipe's wiring, not its sizes: ResNet-50 at 64 px, not 176-224.
SMALL_CROPS = ("dataset.train_crop=64", "dataset.val_resize=72", "dataset.val_crop=64")


def test_seed000_is_resnet50_ddp_with_128_images_per_device():
    cfg = compose_config("experiment=cifar10_resnet50_ddp", "trainer.devices=4")
    assert (cfg.model.arch, cfg.dataset.name, cfg.strategy.name, cfg.launcher.name) == (
        "resnet50",
        "cifar10",
        StrategyName.ddp,
        LauncherName.spawn,
    )
    assert cfg.trainer.batch_size == 512 and cfg.trainer.epochs == 1
    assert (cfg.optimizer.lr, cfg.optimizer.momentum, cfg.optimizer.weight_decay) == (0.1, 0.9, 5e-4)
    assert (
        compose_config("experiment=cifar10_resnet50_ddp", "trainer.gpus=2", "trainer.num_nodes=2").trainer.batch_size
        == 512
    )


def test_seed001_fine_tunes_resnet18_at_224_with_dp_and_steplr():
    cfg = compose_config("experiment=cifar10_resnet18_finetune_dp", "model.weights=w.pth")
    assert (cfg.model.arch, cfg.strategy.name, cfg.dataset.image_size, cfg.dataset.resize) == (
        "resnet18",
        StrategyName.dp,
        224,
        256,
    )
    assert (cfg.optimizer.lr, cfg.scheduler.step_size, cfg.scheduler.gamma, cfg.trainer.epochs) == (0.001, 7, 0.1, 25)


def test_seed002_is_the_mnist_net_with_adadelta_and_steplr():
    cfg = compose_config("experiment=mnist_net_ddp", "trainer.devices=2")
    assert (cfg.model._target_, cfg.dataset.name, cfg.optimizer._target_) == (
        "models.mnist_net.MnistNet",
        "mnist",
        "torch.optim.Adadelta",
    )
    assert (cfg.optimizer.lr, cfg.scheduler.step_size, cfg.scheduler.gamma, cfg.trainer.epochs) == (1.0, 1, 0.7, 14)
    assert cfg.trainer.batch_size == 128 and cfg.launcher.name == LauncherName.auto


def test_seed003_is_resnet50_ddp_on_an_image_folder():
    cfg = compose_config("experiment=imagenet_resnet50_ddp", "dataset.root=/data/imagenet")
    assert (cfg.model.arch, cfg.dataset.name, cfg.strategy.name, cfg.trainer.batch_size) == (
        "resnet50",
        "imagefolder",
        StrategyName.ddp,
        256,
    )
    assert (cfg.optimizer.weight_decay, cfg.scheduler.step_size, cfg.trainer.epochs) == (1e-4, 30, 90)
    # The example's batch is each node's, split over that node's GPUs.
    assert compose_config("experiment=imagenet_resnet50_ddp", "trainer.num_nodes=2").trainer.batch_size == 512


def test_tv_resnet50_is_torchvisions_published_recipe():
    cfg = compose_config("experiment=tv_resnet50", "dataset.root=/data/imagenet")
    trainer, optimizer, dataset = cfg.trainer, cfg.optimizer, cfg.dataset
    assert (cfg.model.arch, cfg.dataset.name, cfg.strategy.name, trainer.batch_size, trainer.epochs) == (
        "resnet50",
        "imagefolder",
        StrategyName.ddp,
        1024,
        600,
    )
    assert (optimizer._target_, optimizer.lr, optimizer.momentum, optimizer.weight_decay, optimizer.nesterov) == (
        "torch.optim.SGD",
        0.5,
        0.9,
        2e-5,
        False,
    )
    assert optimizer_options(optimizer) == OptimizerOptions(
        LrScaling.linear, reference_batch=1024, norm_weight_decay=0.0
    )
    assert (trainer.label_smoothing, trainer.mixup_alpha, trainer.cutmix_alpha) == (0.1, 0.2, 1.0)
    assert (trainer.ema_decay, trainer.ema_every_n_steps) == (0.99998, 32)
    assert (dataset.auto_augment.name, dataset.random_erase, cfg.data.repeated_augmentations) == ("ta_wide", 0.1, 4)
    assert (dataset.train_crop, dataset.val_resize, dataset.val_crop) == (176, 232, 224)
    assert (cfg.scheduler._target_, cfg.scheduler.T_max) == ("torch.optim.lr_scheduler.CosineAnnealingLR", 595)
    assert scheduler_options(cfg.scheduler) == SchedulerOptions(warmup_epochs=5, warmup_start_factor=0.01)


def test_a_seed_name_is_only_an_alias_of_its_recipe_under_a_descriptive_name():
    seeds = sorted((CONF_DIR / "experiment").glob("seed*.yaml"))
    assert len(seeds) == 4
    for seed in seeds:  # nothing but a defaults entry naming the recipe: one source of truth
        alias = yaml.safe_load(seed.read_text())
        (recipe,) = alias["defaults"]
        assert alias.keys() == {"defaults"} and not recipe.startswith("seed")
        assert (CONF_DIR / "experiment" / f"{recipe}.yaml").is_file()
    assert compose_config("experiment=seed002") == compose_config("experiment=mnist_net_ddp")  # Hydra follows it


def _run(run_dir, *overrides):
    result = run_train(run_dir, *overrides, *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_seed000_runs_tiny_under_ddp(tmp_path):  # one rank: the 2-rank path is tested elsewhere
    write_cifar(tmp_path / "cifar", per_batch=8, val=8)
    metrics = _run(
        tmp_path / "run",
        "experiment=cifar10_resnet50_ddp",
        f"dataset.root={tmp_path / 'cifar'}",
        "dataset.download=false",
        "trainer.devices=1",
        "trainer.batch_size=8",
    )
    assert (metrics["model"], metrics["strategy"], metrics["world_size"]) == ("resnet50", "ddp", 1)


@pytest.mark.slow
def test_seed001_fine_tunes_from_a_local_weights_file_at_224(tmp_path):
    import torchvision

    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)  # the format torchvision ships
    write_cifar(tmp_path / "cifar", per_batch=4, val=4)
    run_dir = tmp_path / "run"
    metrics = _run(
        run_dir,
        "experiment=cifar10_resnet18_finetune_dp",
        f"model.weights={weights}",
        f"dataset.root={tmp_path / 'cifar'}",
        "dataset.download=false",
        "trainer.batch_size=4",
    )
    assert (metrics["model"], metrics["strategy"]) == ("resnet18", "dp")
    assert (run_dir / "checkpoints" / "best.pt").is_file()
    # The head kept fresh is said once: the pre-flight's check of the file stays quiet.
    assert (run_dir / "train.log").read_text().count("fc.weight, fc.bias kept fresh") == 1


@pytest.mark.slow
def test_seed002_runs_tiny_on_mnist_files(tmp_path):
    write_idx(tmp_path / "mnist", train=64, val=32)
    metrics = _run(
        tmp_path / "run",
        "experiment=mnist_net_ddp",
        f"dataset.root={tmp_path / 'mnist'}",
        "dataset.download=false",
        "trainer.devices=2",
        "trainer.batch_size=16",
    )
    assert (metrics["dataset"], metrics["world_size"]) == ("mnist", 2)


@pytest.mark.slow
def test_seed003_runs_tiny_on_an_image_folder(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=2, per_class=2)
    metrics = _run(
        tmp_path / "run",
        "experiment=imagenet_resnet50_ddp",
        f"dataset.root={root}",
        "dataset.num_classes=2",
        "trainer.devices=1",
        "trainer.batch_size=2",
        *SMALL_CROPS,
    )
    assert (metrics["model"], metrics["dataset"]) == ("resnet50", "imagefolder")


@pytest.mark.slow
def test_tv_resnet50_runs_tiny_on_an_image_folder(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=2, size=40)
    run_dir = tmp_path / "run"
    # The EMA every step, not every 32nd, and no warmup: within its 5 warmup epochs the EMA only
    # copies the weights (n_averaged stays 0), and this run is 1 epoch of 1 step.
    metrics = _run(
        run_dir,
        "experiment=tv_resnet50",
        f"dataset.root={root}",
        "trainer.devices=1",
        "trainer.batch_size=2",
        "trainer.ema_every_n_steps=1",
        "scheduler.warmup_epochs=0",
        *SMALL_CROPS,
    )
    assert (metrics["model"], metrics["dataset"], metrics["steps"]) == ("resnet50", "imagefolder", 1)
    assert {"val_ema_acc", "val_acc5", "best_weights"} <= set(metrics)
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert last["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(0.5 * 2 / 1024)  # from 0.5 at 1024
    assert int(last["ema"]["n_averaged"]) == metrics["steps"] > 0  # updated after every step


@pytest.mark.slow
def test_tv_resnet50_on_ready_tensors_names_every_per_image_key_in_one_refusal_whose_fix_runs(tmp_path):
    """The recipe sets five per-image transforms; a refusal naming one at a time took five runs to
    follow."""
    job = ("experiment=tv_resnet50", "dataset=synthetic", "dataset.image_size=32", "trainer.devices=1")
    refused = run_train(tmp_path / "refused", *job, "trainer.batch_size=8", *TINY)
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert "serves ready tensors" in line and "Traceback" not in refused.stderr
    fix = line.rsplit(", or ", 1)[1].split()
    assert len(fix) == 5, line
    _run(tmp_path / "run", *job, "trainer.batch_size=8", "trainer.ema_every_n_steps=1", *fix)
