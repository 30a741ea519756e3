"""The recipe knobs through `python train.py`, tiny: what each one changes shows in the run's
checkpoint, metrics.json, TensorBoard or log."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from data import Loaders, build_loaders
from distributed.context import make_context
from tests.configs import job_config
from tests.dataset_files import write_cifar, write_image_folder
from tests.runs import run_train
from training.mixing import Mixing

pytestmark = pytest.mark.slow

CPU = ("trainer.accelerator=cpu",)
DDP = ("strategy=ddp", "trainer.devices=2")


def _train(run_dir, *overrides) -> dict:
    result = run_train(run_dir, *CPU, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text())


def _checkpoint(run_dir, name: str = "last.pt") -> dict:
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)


def _scalars(run_dir) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return events


def _first_step(run_dir, *overrides: str):
    """The run's job, its freshly initialised model and its first batch, rebuilt as the run made them."""
    job = job_config(run_dir, *overrides)
    torch.manual_seed(job.trainer.seed)
    loaders = build_loaders(job.dataset, job.data, make_context(0, 0, 1, 1, "cpu", False), 64, job.trainer.seed)
    model = job.model()
    return job, model, Loaders.to_device(loaders.train, *next(iter(loaders.train)), torch.device("cpu"))


def test_warmup_lr_scaling_and_decay_groups(run_dir):
    # 3 epochs of 4 steps at batch 64: lr 0.05 x 64 / 128, warmed up over epoch 1, then cosine over 2.
    _train(
        run_dir,
        "trainer.epochs=3",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",
        "logger.sample_images=0",
        "scheduler.warmup_epochs=1",
        "optimizer.lr_scaling=linear",
        "optimizer.reference_batch=128",
        "optimizer.norm_weight_decay=0",
    )
    lrs = [event.value for event in _scalars(run_dir).Scalars("lr")]  # after each step: the next step's
    warm = [0.025 * (0.01 + 0.99 * k / 4) for k in (1, 2, 3, 4)]
    assert lrs == pytest.approx(warm + [0.025] * 4 + [0.0125] * 4)
    groups = _checkpoint(run_dir)["optimizer"]["param_groups"]
    assert [group["weight_decay"] for group in groups] == [5e-4, 0.0]
    assert len(groups[1]["params"]) == 4  # mnist_net's biases (it has no normalisation layers)
    assert groups[0]["initial_lr"] == pytest.approx(0.025)


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_label_smoothing_is_in_the_first_steps_loss(tmp_path, precision):
    # bf16-mixed computes the loss on another line, under autocast: the same loss all the same.
    overrides = (
        "model=simple_cnn",
        "trainer.max_steps=1",
        "trainer.limit_val_batches=1",
        "trainer.label_smoothing=0.2",
        f"trainer.precision={precision}",
    )
    metrics = _train(tmp_path / "run", *overrides)
    _, model, (x, y) = _first_step(tmp_path / "job", *overrides)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        expected = F.cross_entropy(model(x), y, label_smoothing=0.2).item()
        unsmoothed = F.cross_entropy(model(x), y).item()
    assert metrics["train_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["train_loss"] != pytest.approx(unsmoothed, rel=1e-5)


@pytest.mark.parametrize("alpha", ["trainer.mixup_alpha=0.4", "trainer.cutmix_alpha=1.0"])
def test_mixup_or_cutmix_is_in_the_first_steps_loss(tmp_path, alpha):
    overrides = ("model=simple_cnn", "trainer.max_steps=1", "trainer.limit_val_batches=1", alpha)
    metrics = _train(tmp_path / "run", *overrides)
    job, model, (x, y) = _first_step(tmp_path / "job", *overrides)
    mixing = Mixing.of(job.trainer, job.dataset.num_classes, rank=0)
    mixed, targets, _ = mixing(x, y, epoch=0, batch=0)  # as the Trainer mixes epoch 0's batch 0 on rank 0
    assert targets.shape == (len(y), job.dataset.num_classes) and not torch.equal(mixed, x)
    expected = F.cross_entropy(model(mixed), targets).item()
    # An untrained net's loss is near log(10) whatever it is given: mixup moves it by ~1e-5, so a
    # float32 tolerance (the same ops on one thread, here and in the run) tells the two apart.
    assert metrics["train_loss"] == pytest.approx(expected, rel=1e-6)
    assert metrics["train_loss"] != pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-6)  # unmixed


MIXED_EMA = (
    "trainer.epochs=2",
    "trainer.limit_train_batches=5",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=5",
    "logger.sample_images=0",
    "trainer.mixup_alpha=0.2",
    "trainer.cutmix_alpha=1.0",
    "trainer.ema_decay=0.99",  # adjusted: 0.68 per update (0.9 would be 0, a copy of the model, refused)
    "data.repeated_augmentations=3",
)


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ema") / "run"
    return run_dir, _train(run_dir, *MIXED_EMA)


def test_mixing_and_ema_are_reported_beside_the_model(ema_run):
    run_dir, metrics = ema_run
    for key in ("val_acc5", "best_val_acc5", "val_ema_acc", "val_ema_acc5", "val_ema_loss"):
        assert 0 <= metrics[key] < math.inf, key
    assert metrics["val_acc5"] >= metrics["val_acc"] and metrics["val_ema_acc5"] >= metrics["val_ema_acc"]
    assert {"val/acc5", "val_ema/acc", "val_ema/acc5", "val_ema/loss"} <= set(_scalars(run_dir).Tags()["scalars"])
    last, best = _checkpoint(run_dir), _checkpoint(run_dir, "best.pt")
    assert int(last["ema"]["n_averaged"]) == 10 and set(last["ema"]) - {"n_averaged"} == {
        f"module.{key}" for key in last["model"]
    }
    assert best["best_weights"] in ("model", "ema") and best["best"] == metrics["best_val_acc"]
    assert metrics["best_val_acc"] >= max(metrics["val_acc"], metrics["val_ema_acc"])
    log = (run_dir / "train.log").read_text()
    assert "ema loss" in log and f"best acc {metrics['best_val_acc']:.4f} acc5 {metrics['best_val_acc5']:.4f}" in log


@pytest.mark.parametrize("mixing", [("trainer.mixup_alpha=0.4",), ("trainer.cutmix_alpha=0.5", "data.loader=device")])
def test_mixup_or_cutmix_alone_trains_on_either_loader(run_dir, mixing):
    metrics = _train(run_dir, "debug=fdr", *mixing)
    assert math.isfinite(metrics["train_loss"]) and 0 <= metrics["train_acc"] <= 1


def test_test_only_under_ddp_reports_exactly_the_single_process_figures(ema_run, tmp_path):
    checkpoint = ema_run[0] / "checkpoints" / "last.pt"
    args = ("trainer.test_only=true", f"trainer.resume={checkpoint}")
    single = _train(tmp_path / "single", *args)
    ddp = _train(tmp_path / "ddp", *args, *DDP)
    figures = ("val_acc", "val_acc5", "val_loss", "val_samples", "val_ema_acc", "val_ema_acc5", "val_ema_loss")
    assert {k: single[k] for k in figures} == {k: ddp[k] for k in figures}
    assert (single["val_samples"], ddp["world_size"]) == (360, 2)
    log = (tmp_path / "ddp" / "train.log").read_text()
    assert log.count("test: acc@1") == 1 and "epoch" not in log
    assert not (tmp_path / "ddp" / "checkpoints").exists()


def test_test_only_evaluates_a_torchvision_weights_file(tmp_path):
    from models.zoo import torchvision_classifier

    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision_classifier("resnet18", num_classes=10).state_dict(), weights)
    metrics = _train(
        tmp_path / "run",
        "trainer.test_only=true",
        "model=torchvision",
        "model.arch=resnet18",
        f"model.weights={weights}",
        "dataset=synthetic",
        "dataset.val_size=16",
        "trainer.batch_size=8",
    )
    assert (metrics["weights"], metrics["val_samples"], metrics["model"]) == (str(weights), 16, "torchvision")


def test_an_unknown_torchvision_name_is_one_line_with_the_closest(run_dir):
    result = run_train(run_dir, *CPU, "model=torchvision", "model.arch=efficientnet_b9", "dataset=synthetic")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "model.arch=efficientnet_b9" in result.stderr and "efficientnet_b" in result.stderr


def test_per_image_augmentations_train_on_cifar_files(tmp_path):  # ra and augmix: test_recipes
    write_cifar(tmp_path / "cifar", per_batch=4, val=4)
    metrics = _train(
        tmp_path / "run",
        "dataset=cifar10",
        f"dataset.root={tmp_path / 'cifar'}",
        "dataset.download=false",
        "model=simple_cnn",
        "trainer.epochs=1",
        "trainer.batch_size=4",
        "data.num_workers=0",
        "dataset.auto_augment=ta_wide",
        "dataset.random_erase=0.5",
    )
    assert metrics["steps"] == 5 and math.isfinite(metrics["train_loss"])


def test_an_image_folder_at_recipe_sizes_with_a_torchvision_model_and_its_own_class_count(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=2, size=48)
    metrics = _train(
        tmp_path / "run",
        "dataset=imagefolder",
        f"dataset.root={root}",
        "model=torchvision",
        "model.arch=resnet18",
        "dataset.train_crop=32",
        "dataset.val_resize=40",
        "dataset.val_crop=36",
        "trainer.epochs=1",
        "trainer.batch_size=2",
        "data.num_workers=0",
    )
    assert metrics["steps"] == 3 and metrics["val_acc5"] == 1.0  # 3 classes: always among the top 5
    assert _checkpoint(tmp_path / "run")["model"]["fc.weight"].shape == (3, 512)
