"""Images stay uint8 until the device; data.decode=gpu's crops are torchvision's, drawn from
(seed, epoch, rank, position) whatever the workers or a resume; odd files decode on the CPU; and
data.prepare's copy is what the GPU path decodes whole. The GPU path runs here on CPU tensors
(its GPU run: tests/test_cuda.py)."""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms import functional as TF

from config.schema import AutoAugment, Config, DataConfig, DatasetConfig, Decode
from data import Loaders, build_loaders, check, decode, imagefolder
from data.crops import center_boxes, flip, random_resized_boxes, resized_crops
from data.file_batches import EncodedBatch, cpu_only
from distributed.context import make_context
from errors import ConfigError
from tests.configs import typed_config
from tests.dataset_files import class_images, write_cifar, write_image_folder, write_mac_leftovers, write_odd_images

CPU = torch.device("cpu")


def _ctx(rank: int = 0, world_size: int = 1):
    return make_context(rank, rank, world_size, world_size, "cpu", use_process_group=False)


def _features(boxes: torch.Tensor, height: int, width: int) -> dict[str, torch.Tensor]:
    """What RandomResizedCrop draws: the area's share, the aspect, and where in the free room."""
    top, left, h, w = boxes.double().T
    return {
        "scale": h * w / (height * width),
        "log aspect": (w / h).log(),
        "top": top / (height - h + 1),
        "left": left / (width - w + 1),
    }


@pytest.mark.parametrize("height, width", [(375, 500), (600, 60), (60, 600)])  # the last two mostly fall back
def test_the_devices_crop_boxes_follow_torchvisions_random_resized_crop(height, width):
    n = 1500
    torch.manual_seed(0)
    image = torch.empty(1, height, width)
    reference = torch.tensor([RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)])
    ours = random_resized_boxes(torch.tensor([[height, width]] * n), torch.Generator().manual_seed(0))
    assert ((ours[:, :2] >= 0) & (ours[:, 2:] > 0) & (ours[:, :2] + ours[:, 2:] <= torch.tensor([height, width]))).all()
    theirs, mine = _features(reference, height, width), _features(ours, height, width)
    for name in theirs:  # seeded: the same statistics every run
        assert _ks_distance(theirs[name], mine[name]) < _ks_critical(len(reference), len(ours), alpha=1e-3), name


def _ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs,
    taken at every value either sample holds (ties included, as scipy's ks_2samp takes them)."""
    a, b = a.sort().values, b.sort().values
    at = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, at, right=True) / len(a)
    cdf_b = torch.searchsorted(b, at, right=True) / len(b)
    return (cdf_a - cdf_b).abs().max().item()


def _ks_critical(n: int, m: int, alpha: float) -> float:
    """The distance two samples of one distribution exceed with probability `alpha` (the
    asymptotic Kolmogorov distribution; conservative where values tie, as a crop's sizes do)."""
    return math.sqrt(-math.log(alpha / 2) / 2 * (n + m) / (n * m))


def _smooth_images(sizes: list[tuple[int, int]], seed: int = 0) -> list[torch.Tensor]:
    """uint8 photos in miniature: smooth colour fields, so resampling methods agree closely."""
    generator = torch.Generator().manual_seed(seed)
    images = []
    for h, w in sizes:
        coarse = torch.rand(1, 3, h // 25 + 2, w // 25 + 2, generator=generator) * 255
        images.append(
            torch.nn.functional.interpolate(coarse, size=(h, w), mode="bicubic").clamp(0, 255).round().byte()[0]
        )
    return images


def test_the_devices_cut_is_torchvisions_resized_crop_and_resize_then_center_crop():
    sizes = [(75, 100), (100, 66), (90, 90), (40, 120)]
    images = _smooth_images(sizes)
    boxes = random_resized_boxes(torch.tensor(sizes), torch.Generator().manual_seed(1))
    ours = resized_crops(images, boxes, 32)
    for image, box, crop in zip(images, boxes.tolist(), ours):
        torch.testing.assert_close(crop, TF.resized_crop(image.float()[None], *box, [32, 32], antialias=True)[0])
    validation = resized_crops(images, center_boxes(torch.tensor(sizes), 40, 32), 32)
    for image, crop in zip(images, validation):
        reference = TF.center_crop(TF.resize(image.float()[None], 40, antialias=True), 32)[0]
        assert (crop - reference).abs().mean() < 5.0  # of 255: one step, its box in whole pixels (<= 1/2 px off)
    flips = torch.tensor([True, False, True, False])
    flipped = flip(ours, flips)
    assert torch.equal(flipped[flips], ours[flips].flip(3)) and torch.equal(flipped[~flips], ours[~flips])


@pytest.fixture(scope="module")
def jpeg_root(tmp_path_factory):
    return write_image_folder(tmp_path_factory.mktemp("jpegs"), classes=2, per_class=6, size=48, suffix=".jpg")


@functools.cache
def _composed(root: str) -> Config:
    return typed_config(
        "dataset=imagefolder",
        f"dataset.root={root}",
        "dataset.num_classes=2",
        "dataset.image_size=32",
        "dataset.resize=40",
    )


def _folder(root, decode: str = "auto", workers: int = 0, **dataset) -> tuple[DatasetConfig, DataConfig]:
    """An image folder's (dataset, data) config at 32 px, composed once per folder (Hydra's compose
    is most of a small test's time), with `dataset` keys changed."""
    cfg = _composed(str(root))
    return replace(cfg.dataset, **dataset), replace(cfg.data, decode=Decode(decode), num_workers=workers)


def test_device_crops_follow_seed_epoch_rank_and_position_not_the_workers_or_a_resume(jpeg_root):
    def boxes(loaders, epoch):
        loaders.train_sampler.set_epoch(epoch)
        return [batch.boxes for batch, _ in loaders.train]

    def fresh(rank=0, seed=0, workers=0):
        return build_loaders(*_folder(jpeg_root, "gpu", workers), _ctx(rank, 2), global_batch=4, seed=seed)

    unbroken = fresh(workers=1)
    boxes(unbroken, 0)
    epoch_1 = boxes(unbroken, 1)  # persistent workers, one epoch in
    assert not torch.equal(epoch_1[0], epoch_1[1])  # images of one size: only the batch's position tells them apart
    for resumed in (fresh(), fresh(workers=1)):  # a run resumed at epoch 1, with or without workers
        assert all(torch.equal(a, b) for a, b in zip(boxes(resumed, 1), epoch_1, strict=True))
    assert not torch.equal(boxes(fresh(), 2)[0], epoch_1[0])
    assert not torch.equal(boxes(fresh(rank=1), 1)[0], epoch_1[0])
    assert not torch.equal(boxes(fresh(seed=1), 1)[0], epoch_1[0])


def _finished(loader) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [Loaders.to_device(loader, x, y, CPU) for x, y in loader]
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def test_odd_files_decode_on_the_cpu_counted_and_logged_once_and_validate_as_the_cpu_path_does(tmp_path, caplog):
    root = write_image_folder(tmp_path, classes=2, per_class=2, size=48, suffix=".jpg")
    write_odd_images(root / "val" / "class1")
    passes = {}
    for path in ("cpu", "gpu"):
        loaders = build_loaders(*_folder(root, path), _ctx(), global_batch=4, seed=0)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="train"):
            passes[path] = [_finished(loaders.val) for _ in range(2)]  # the second logs nothing more
        notes = [r.message for r in caplog.records if "decoded on the CPU" in r.message]
        assert len(notes) == (path == "gpu"), notes
    counted = loaders.val.to_device.cpu_decoded
    assert counted == Counter({"grey JPEG": 2, "CMYK JPEG": 2, "progressive JPEG": 2, "PNG file": 2})  # 2 passes
    (cpu, cpu_labels), _ = passes["cpu"]
    (gpu, gpu_labels), (again, _) = passes["gpu"]
    assert torch.equal(cpu_labels, gpu_labels) and torch.equal(gpu, again) and gpu.shape == (8, 3, 32, 32)
    assert (cpu - gpu).abs().mean(dim=(1, 2, 3)).max() < 0.01  # normalised; the CPU's cuts are rounded to uint8


def test_both_decode_paths_train_on_the_same_crops_and_the_cpu_path_on_the_recipes_augmentations(jpeg_root):
    def first_batch(decode, **dataset):
        loaders = build_loaders(*_folder(jpeg_root, decode, **dataset), _ctx(), global_batch=6, seed=0)
        loaders.train_sampler.set_epoch(3)
        return Loaders.to_device(loaders.train, *next(iter(loaders.train)), CPU)[0]

    cpu, gpu = first_batch("cpu"), first_batch("gpu")
    assert (cpu - gpu).abs().mean() < 0.01  # the same boxes and flips; float against uint8 cuts
    recipe = dict(auto_augment=AutoAugment.ta_wide, random_erase=1.0)
    augmented = first_batch("cpu", **recipe)
    assert (augmented - cpu).abs().mean() > 0.1
    assert torch.equal(augmented, first_batch("cpu", **recipe))


def test_a_crop_much_larger_than_its_output_decodes_at_a_dct_scale(tmp_path, monkeypatch):
    from PIL import JpegImagePlugin

    from data.file_batches import decode_here, read

    path = tmp_path / "big.jpg"
    Image.fromarray(_smooth_images([(400, 520)])[0].permute(1, 2, 0).numpy()).save(path, quality=95)
    encoded = read(str(path))
    full = TF.resized_crop(TF.pil_to_tensor(Image.open(path)), 10, 20, 380, 480, [64, 64], antialias=True)
    drafts = []
    draft = JpegImagePlugin.JpegImageFile.draft
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", lambda self, *a: drafts.append(a[1]) or draft(self, *a))
    scaled = decode_here(encoded, [10, 20, 380, 480], 64)  # 380 px high: 4x its output
    assert drafts == [(130, 100)]  # decoded at 1/4
    assert (scaled.float() - full.float()).abs().mean() < 2.0  # of 255
    assert decode_here(encoded, [10, 20, 100, 100], 64).shape == (3, 64, 64) and len(drafts) == 1  # < 2x: whole


@pytest.mark.parametrize("path, workers", [("cpu", 0), ("gpu", 1)])
def test_a_truncated_jpeg_stops_either_path_in_one_line_naming_it(tmp_path, path, workers):
    root = write_image_folder(tmp_path, classes=2, per_class=1, size=48, suffix=".jpg")
    truncated = root / "val" / "class1" / "1.jpg"
    truncated.write_bytes(truncated.read_bytes()[:-300])  # the header whole, the scan cut short
    loaders = build_loaders(*_folder(root, path, workers), _ctx(), global_batch=4, seed=0)
    with pytest.raises(ConfigError) as error:
        _finished(loaders.val)
    message = str(error.value)
    del error  # with it, the loader's worker: tests/test_data_loaders.py says why they are not kept
    assert message.startswith(f"{truncated}: unreadable image (") and "\n" not in message


def test_what_the_gpu_path_leaves_to_the_cpu(tmp_path):
    odd = write_odd_images(tmp_path)
    Image.new("RGB", (8, 8)).save(tmp_path / "baseline.jpg")
    reasons = {}
    for name, path in {**odd, "baseline": tmp_path / "baseline.jpg"}.items():
        data = path.read_bytes()
        with Image.open(path) as image:
            reasons[name] = cpu_only(image, data)
            reasons["cut short"] = cpu_only(image, data[:-2]) if name == "baseline" else reasons.get("cut short")
    assert reasons == {
        "grey": "grey JPEG",
        "cmyk": "CMYK JPEG",
        "progressive": "progressive JPEG",
        "png": "PNG file",
        "baseline": None,
        "cut short": "JPEG without its end marker",
    }


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> tuple[DatasetConfig, DataConfig]:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, per_batch=8, val=8)
    cfg = typed_config("dataset=cifar10", f"dataset.root={root}", "data.num_workers=0")
    return cfg.dataset, cfg.data


@pytest.mark.parametrize("path", ["host_batches", "per_image", "per_image_resized", "files_cpu", "files_gpu"])
def test_batches_stay_uint8_until_the_device_and_are_normalised_there_once(cifar, jpeg_root, path):
    dataset, data = {
        "host_batches": cifar,  # in memory: batches cut on the host
        "per_image": (replace(cifar[0], auto_augment=AutoAugment.ta_wide), cifar[1]),  # small images: PIL
        "per_image_resized": (replace(cifar[0], resize=40), cifar[1]),  # ImageNet-style: PIL
        "files_cpu": _folder(jpeg_root, "cpu"),  # image files: cut in the workers
        "files_gpu": _folder(jpeg_root, "gpu"),  # or bytes, decoded by the device
    }[path]
    loader = build_loaders(dataset, data, _ctx(), global_batch=4, seed=0).val
    x, y = next(iter(loader))
    stored = x.images if isinstance(x, EncodedBatch) else [x]
    assert all(image.dtype == torch.uint8 for image in stored)
    finished, labels = Loaders.to_device(loader, x, y, CPU)
    assert finished.dtype == torch.float32 and torch.equal(labels, y)
    if not isinstance(x, EncodedBatch):  # torchvision's ToTensor + Normalize, done here once
        mean, std = torch.tensor(dataset.mean).view(1, -1, 1, 1), torch.tensor(dataset.std).view(1, -1, 1, 1)
        torch.testing.assert_close(finished, (x.float() / 255 - mean) / std)


def test_decode_auto_picks_the_device_on_cuda_for_files_without_cpu_only_augmentations(jpeg_root):
    cuda = torch.device("cuda")  # only compared, never used
    assert decode.on_device(imagefolder, *_folder(jpeg_root), cuda)
    assert not decode.on_device(imagefolder, *_folder(jpeg_root), CPU)
    assert not decode.on_device(imagefolder, *_folder(jpeg_root, auto_augment=AutoAugment.ta_wide), cuda)
    assert decode.on_device(imagefolder, *_folder(jpeg_root, "gpu"), CPU)  # a CPU rehearsal of the GPU path


def test_in_memory_sets_refuse_data_decode_gpu(cifar):
    dataset, data = cifar
    with pytest.raises(ConfigError, match=r"^data.decode=gpu decodes image files, which dataset=cifar10 does not hold"):
        check(dataset, replace(data, decode=Decode.gpu))


def test_prepare_writes_a_smaller_copy_the_device_decodes_whole(tmp_path):
    from data import prepare

    source = write_image_folder(tmp_path / "source", classes=2, per_class=1, size=48, suffix=".jpg")
    big = Image.fromarray(class_images(np.array([1]), 3, 300, seed=3)[0].transpose(1, 2, 0)).resize((300, 200))
    big.save(source / "train" / "class1" / "big.jpg", quality=95)
    odd = write_odd_images(source / "val" / "class0")
    assert (
        prepare.main([str(source), str(tmp_path / "small"), "--max-side", "64", "--quality", "80", "--workers", "1"])
        == 0
    )
    written = sorted(p.relative_to(tmp_path / "small") for p in (tmp_path / "small").rglob("*") if p.is_file())
    originals = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert written == [p if p.suffix == ".jpg" else p.with_name(p.name + ".jpg") for p in originals]
    for path in (tmp_path / "small").rglob("*.jpg"):
        with Image.open(path) as image:
            assert max(image.size) <= 64 and cpu_only(image, path.read_bytes()) is None, path
    with Image.open(tmp_path / "small" / "train" / "class1" / "big.jpg") as image:
        assert image.size == (64, 43)  # the longest side to 64, the aspect kept
    assert (tmp_path / "small" / "val" / "class0" / odd["png"].name).with_suffix(".png.jpg").exists()


def test_prepare_copies_every_class_imagefolder_finds_symlinked_class_folders_included(tmp_path):
    # Path.rglob skipped symlinked folders: the copy lost those classes, and every later class's label moved.
    from torchvision.datasets import ImageFolder

    from data import prepare

    elsewhere = write_image_folder(tmp_path / "elsewhere", classes=3, per_class=2, size=24)
    source = tmp_path / "source"
    for split in ("train", "val"):
        (source / split).mkdir(parents=True)
        for k in range(3):
            if k == 1:  # the middle class, so that a class dropped would move the next one's label
                (source / split / "class1").symlink_to(elsewhere / split / "class1")
            else:
                (elsewhere / split / f"class{k}").rename(source / split / f"class{k}")
    assert prepare.main([str(source), str(tmp_path / "small"), "--workers", "1"]) == 0
    for split in ("train", "val"):
        copied, original = ImageFolder(str(tmp_path / "small" / split)), ImageFolder(str(source / split))
        assert copied.classes == original.classes == ["class0", "class1", "class2"]
        assert [label for _, label in copied.samples] == [label for _, label in original.samples]


def test_prepare_copies_the_images_of_a_folder_copied_from_a_mac_alone(tmp_path):
    # Its hidden AppleDouble ._0.jpg beside each image stopped the copy: "unreadable image".
    from data import prepare

    source = write_image_folder(tmp_path / "source", classes=2, per_class=1, size=24, suffix=".jpg")
    originals = sorted(p.relative_to(source) for p in source.rglob("*"))
    write_mac_leftovers(source)
    assert prepare.main([str(source), str(tmp_path / "small"), "--workers", "1"]) == 0
    assert sorted(p.relative_to(tmp_path / "small") for p in (tmp_path / "small").rglob("*")) == originals


def test_prepare_keeps_an_empty_validation_class_so_the_copy_trains_with_the_same_labels(tmp_path):
    # Only folders that held an image were made: train.py refused the copy ("only train/ has class1").
    from data import prepare

    source = write_image_folder(tmp_path / "source", classes=3, per_class=2, size=24)
    for image in (source / "val" / "class1").iterdir():
        image.unlink()
    assert prepare.main([str(source), str(tmp_path / "small"), "--workers", "1"]) == 0
    cfg = typed_config("dataset=imagefolder", f"dataset.root={tmp_path / 'small'}", "dataset.num_classes=3")
    check(cfg.dataset, cfg.data)
    _, val = imagefolder.image_files(cfg.dataset)
    assert sorted(label for _, label in val) == [0, 0, 2, 2]
