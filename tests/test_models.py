"""Every conf/model option trains on every in-memory dataset, or is refused it before launch: channels,
classes and size come from the dataset config."""

from __future__ import annotations

import json
import logging
import math
import warnings

import pytest
import torch
import torchvision
import yaml

import models.resnet
import models.vit_tiny
from config.setup import CONF_DIR
from data import DATASETS as DATASET_MODULES
from data import InMemory, OnDisk, dataset_module, serving
from distributed.context import make_context
from errors import ConfigError
from models.resnet import resnet
from models.weights import check_fits
from models.zoo import torchvision_classifier
from preflight import check_and_plan
from tests.configs import job_config, typed_config
from tests.dataset_files import WRITERS
from training import run as run_job


def _models() -> list:
    """Every conf/model option. Those that torchvision builds (they name a model.arch) take seconds
    each on 2 cores: slow."""
    options = []
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        slow = "arch" in yaml.safe_load(path.read_text())
        options.append(pytest.param(path.stem, marks=pytest.mark.slow) if slow else path.stem)
    return options


MODELS = _models()
DATASETS = [name for name in serving(InMemory) if not isinstance(dataset_module(name), OnDisk)]  # no files to write
TINY = ["debug=fdr", "trainer.batch_size=4", "dataset.train_size=16", "dataset.val_size=8"]


def _tiny(dataset: str) -> list[str]:
    # digits has a fixed size; synthetic is shrunk to a few samples
    return [o for o in TINY if dataset == "synthetic" or not o.startswith("dataset.")]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_model_trains_on_every_dataset_or_is_refused_it_before_launch(model, dataset, tmp_path):
    overrides = [f"model={model}", f"dataset={dataset}", *_tiny(dataset)]
    job = job_config(tmp_path, *overrides)
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    torch.manual_seed(job.trainer.seed)
    before = job.model().state_dict()
    try:
        trained = run_job.train(ctx, job)
    except Exception:  # images the model is not for (torchvision's classifiers take 3 channels): the
        with pytest.raises(ConfigError) as refused:  # pre-flight says so in one line instead
            check_and_plan(typed_config(*overrides))
        assert "\n" not in str(refused.value)
        return
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert math.isfinite(metrics["train_loss"]) and metrics["steps"] == 3
    changed = [k for k, v in trained.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert changed, "three optimizer steps changed no parameter"
    x = torch.zeros(3, job.dataset.channels, job.dataset.image_size, job.dataset.image_size)
    assert trained.eval()(x).shape == (3, job.dataset.num_classes)


@pytest.mark.parametrize("dataset", sorted(DATASET_MODULES))
def test_every_registered_dataset_trains_on_files_in_its_real_format(dataset, tmp_path):
    """Not refused, trained: the files a dataset reads are written small, as it finds them on disk
    (tests/dataset_files.py's WRITERS; the in-memory ones have none), and the run takes 3 steps."""
    module = dataset_module(dataset)
    assert isinstance(module, InMemory) and not isinstance(module, OnDisk) or dataset in WRITERS, (
        f"dataset={dataset} reads files: give tests/dataset_files.py a writer of them (WRITERS)"
    )
    pointed = WRITERS[dataset](tmp_path / "data") if dataset in WRITERS else []
    model = "simple_cnn" if dataset == "imagefolder" else "mnist_net"
    job = job_config(tmp_path / "run", f"dataset={dataset}", f"model={model}", *_tiny(dataset), *pointed)
    (tmp_path / "run").mkdir()
    run_job.train(make_context(0, 0, 1, 1, "cpu", use_process_group=False), job)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == dataset and metrics["steps"] == 3 and math.isfinite(metrics["train_loss"])


def _one_line_error(match: str, build, *args) -> None:
    with pytest.raises(ConfigError, match=match) as raised:
        build(*args)
    assert "\n" not in str(raised.value)


def test_resnet_arch_and_stem_are_checked_before_launch():
    _one_line_error(
        r"model.arch=resnet81: .*closest: resnet18", models.resnet.check, "resnet81", 3, 10, "imagenet", None
    )
    _one_line_error(
        r"model.arch=vit_b_16: .*model=torchvision", models.resnet.check, "vit_b_16", 3, 10, "imagenet", None
    )
    _one_line_error(
        r"model.stem=cifr: .*give imagenet .* or cifar", models.resnet.check, "resnet18", 3, 10, "cifr", None
    )
    # the pre-flight hands the check every key of conf/model/resnet18.yaml
    with pytest.raises(ConfigError, match="model.stem=cifr"):
        check_and_plan(typed_config("model=resnet18", "dataset=synthetic", "model.stem=cifr"))


def test_the_tiny_vits_patches_and_heads_are_checked_before_launch():
    def planned(*overrides: str) -> None:
        check_and_plan(typed_config("model=vit_tiny", *overrides))

    _one_line_error(r"^model.patch_size=3 must tile dataset.image_size=8", planned, "model.patch_size=3")
    _one_line_error(r"^model.heads=5 must split model.dim=64", planned, "model.heads=5")
    # A key the config leaves out reaches the check as the builder's default: TinyViT's patch_size=4.
    without = ("~model.patch_size", "dataset=synthetic", "dataset.image_size=10")
    _one_line_error(r"^model.patch_size=4 must tile dataset.image_size=10", planned, *without)


def test_the_cifar_stem_keeps_32_px_images_whole_into_the_first_stage():
    # No stride-2 conv, no max-pool: layer1 sees the full 32x32, not the ImageNet stem's 8x8.
    model = resnet("resnet18", 3, 10, stem="cifar").eval()
    shapes = []
    model.layer1.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    model(torch.zeros(1, 3, 32, 32))
    assert shapes == [(1, 64, 32, 32)]


def test_simple_cnn_at_32_px_is_lenets_unpadded_layout():
    # 32 -> conv5 28 -> pool 14 -> conv5 10 -> pool 5: 16 x 5 x 5 features, as the seed's CIFAR-10 net.
    from models.simple_cnn import SimpleCNN

    assert SimpleCNN(3, 10, 32).classifier[0].in_features == 400


def test_resnet_weights_trained_for_the_dataset_load_whole(tmp_path):
    # trainer.test_only=true model.weights=<a trained 10-class, 1-channel cifar-stem state_dict>
    trained = resnet("resnet18", 1, 10, "cifar")
    torch.save(trained.state_dict(), tmp_path / "trained.pth")
    loaded = resnet("resnet18", 1, 10, "cifar", weights=str(tmp_path / "trained.pth")).state_dict()
    assert all(torch.equal(tensor, loaded[key]) for key, tensor in trained.state_dict().items())


def test_resnet_fine_tunes_from_torchvisions_file_with_a_fresh_head_and_says_so(tmp_path, caplog):
    imagenet = torchvision.models.resnet18()  # the format of torchvision's resnet18-f37072fd.pth
    torch.save(imagenet.state_dict(), tmp_path / "resnet18.pth")
    with caplog.at_level(logging.WARNING, logger="train"):
        model = resnet("resnet18", 3, 10, weights=str(tmp_path / "resnet18.pth"))
    tuned, source = model.state_dict(), imagenet.state_dict()
    assert [key for key in source if not torch.equal(source[key], tuned[key])] == ["fc.weight", "fc.bias"]
    assert tuned["fc.weight"].shape == (10, 512)
    assert "fc.weight, fc.bias kept fresh" in caplog.text


def test_the_pre_flights_check_of_a_weights_file_refuses_as_the_build_does_and_stays_quiet(tmp_path, caplog):
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "resnet34.pth")
    with caplog.at_level(logging.WARNING, logger="train"):
        check_fits(resnet("resnet18", 3, 10), str(tmp_path / "resnet18.pth"))
    assert caplog.text == ""  # the build says what stays fresh, once
    with pytest.raises(ConfigError, match="is not a state_dict of this architecture"):
        check_fits(resnet("resnet18", 3, 10), str(tmp_path / "resnet34.pth"))


@pytest.mark.parametrize(
    "saved, match",
    [  # another arch, a train.py checkpoint, a pickled module
        (lambda: torchvision.models.resnet34().state_dict(), "not a state_dict of this architecture .*has layer1.2"),
        (
            lambda: {"model": resnet("resnet18", 3, 10).state_dict(), "epoch": 1},
            r"train.py checkpoint.*trainer.init_from=.*trainer.resume=",
        ),
        (lambda: torch.nn.Linear(2, 2), r"cannot read it \(UnpicklingError\); give a state_dict"),
    ],
    ids=["resnet34", "checkpoint", "pickled_module"],
)
def test_resnet_weights_that_do_not_fit_are_one_line_config_errors(saved, match, tmp_path):
    torch.save(saved(), tmp_path / "weights.pth")
    _one_line_error(match, models.resnet.check, "resnet18", 3, 10, "imagenet", str(tmp_path / "weights.pth"))


@pytest.mark.parametrize("arch, size", [("googlenet", 32), ("inception_v3", 75)])  # inception_v3's smallest
def test_googlenet_and_inception_train_on_their_logits_alone(arch, size):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # torchvision's warning about init_weights' default
        model = torchvision_classifier(arch, num_classes=10).train()
    logits = model(torch.zeros(2, 3, size, size))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 10)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1])).backward()


def test_googlenet_loads_torchvisions_file_with_its_auxiliary_heads_and_its_own(tmp_path):
    published = torchvision.models.googlenet(aux_logits=True, init_weights=True)  # as googlenet-1378be20.pth
    torch.save(published.state_dict(), tmp_path / "googlenet.pth")
    model = torchvision_classifier("googlenet", num_classes=10, weights=str(tmp_path / "googlenet.pth"))
    assert torch.equal(model.conv1.conv.weight, published.conv1.conv.weight)
    torch.save(model.state_dict(), tmp_path / "trained.pth")  # no auxiliary heads: loads whole
    again = torchvision_classifier("googlenet", num_classes=10, weights=str(tmp_path / "trained.pth"))
    assert torch.equal(again.fc.weight, model.fc.weight)
