"""A folder of JPEGs: how fast each input path delivers images, on the CPU and (with CUDA) to a
ResNet-50 against in-memory tensors.

python -m bench.imagefolder [--quick] [--images N] [--rounds R] [--gpu-images N]

It writes JPEGs of ImageNet's typical size whose content compresses like photos (1/f noise, soft
gradients and hard-edged shapes: ~100-150 KB at quality 90; some portrait, some grey), then:

1. Loader alone, each batch taken as far as the training loop takes it (to_device: on the CPU,
   the normalisation), per core (num_workers=0, one thread; images per CPU-second of this process,
   which neighbours' load disturbs far less than the wall clock) and on all cores (num_workers =
   cores; images per wall second): today's path (torchvision's ImageFolder: PIL decode,
   RandomResizedCrop, flip, ToTensor and Normalize in the workers, as train.py did before
   data.decode), the same ending in uint8 (normalised once, by to_device), train.py's
   data.decode=cpu (libjpeg-turbo through torchvision.io, torch's uint8 cut, PIL's draft() for
   large crops), and data.decode=gpu's workers alone (bytes and headers; the device decodes). Per
   core also validation (Resize + CenterCrop) and data.decode=gpu decoded by the CPU (a
   rehearsal). Systems interleave within each round; ratios to today's are per round, then the
   median. Target: data.decode=cpu with data.num_workers=2 >= 1.5x today's.
2. data.prepare's copies at FFCV's settings (500 px, and 400 px, quality 90): decode images/s per
   core against the originals.
3. The device's cut (data/crops.py) on CPU tensors, and on CUDA: one interpolate per image
   against one roi_align per image and one roi_align over the batch padded to its largest image.
4. With CUDA: data.decode=gpu's decode + cut + normalise alone (images/s), and train.py's
   ResNet-50 (batch 256, bf16, channels_last) on dataset=imagefolder with data.decode=gpu and
   data.decode=cpu against dataset=synthetic (data.loader=device) in the same config.
   Target: imagefolder / synthetic >= 0.9.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.common import median, spread, table, train, verdict

CPU_TARGET, GPU_TARGET = 1.5, 0.9
CLASSES, QUALITY = 10, 90
# ImageNet's photos are mostly Flickr's 500-px "medium" size: 500x375 and 500x333, a quarter portrait.
SIZES = [(500, 375), (500, 333), (500, 400), (400, 300), (640, 480), (350, 500)]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
GPU_RUN = [
    "model=resnet50",
    "trainer.batch_size=256",
    "trainer.precision=bf16-mixed",
    "trainer.channels_last=true",
    "trainer.accelerator=gpu",
    "logger=none",
    "optimizer=sgd",
    "scheduler=none",
]


def photo(rng: np.random.Generator, height: int, width: int, grey: bool) -> np.ndarray:
    """H x W (x 3) uint8 with a photo's spectrum: octaves of smooth noise, a gradient, hard edges, grain."""
    channels = 1 if grey else 3
    image = np.zeros((channels, height, width), np.float32)
    amplitude = 90.0
    for octave in range(1, 8):
        coarse = rng.normal(0, 1, (1, channels, max(2, height >> (8 - octave)), max(2, width >> (8 - octave))))
        smooth = F.interpolate(torch.from_numpy(coarse.astype(np.float32)), size=(height, width), mode="bicubic")
        image += amplitude * smooth[0].numpy()
        amplitude *= 0.86
    rows, columns = np.mgrid[0:height, 0:width]
    image += (rng.uniform(-60, 60) * rows / height + rng.uniform(-60, 60) * columns / width)[None]
    for _ in range(rng.integers(3, 9)):
        y, x, r = rng.integers(0, height), rng.integers(0, width), rng.integers(10, min(height, width) // 3)
        disc = rng.random() < 0.5
        shape = (
            (rows - y) ** 2 + (columns - x) ** 2 < r * r if disc else (abs(rows - y) < r) & (abs(columns - x) < 1.5 * r)
        )
        image[:, shape] += rng.uniform(-70, 70, (channels, 1))
    image += 128 + rng.normal(0, 8, image.shape)
    pixels = np.clip(image, 0, 255).astype(np.uint8)
    return pixels[0] if grey else pixels.transpose(1, 2, 0)


def _write_one(path: Path, seed: int, shrink: int = 1) -> int:
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = (side // shrink for side in SIZES[rng.integers(len(SIZES))])
    if rng.random() < 0.2:
        width, height = height, width
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo(rng, height, width, grey=rng.random() < 0.05)).save(path, quality=QUALITY)
    return path.stat().st_size


def write_folder(root: Path, train: int, val: int, shrink: int = 1) -> float:
    """root/{train,val}/class<k>/<i>.jpg, each side divided by `shrink` (--quick); returns the mean size in KB."""
    paths = [
        root / split / f"class{i % CLASSES}" / f"{i}.jpg"
        for split, n in (("train", train), ("val", val))
        for i in range(n)
    ]
    jobs = (paths, range(len(paths)), [shrink] * len(paths))
    if shrink > 1:  # --quick: a few small files, not worth the processes
        return statistics.mean(map(_write_one, *jobs)) / 1e3
    with ProcessPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        return statistics.mean(pool.map(_write_one, *jobs, chunksize=16)) / 1e3


# --- the loaders --------------------------------------------------------------------------------


def today(root: Path, split: str, batch: int, workers: int, crop: int = 224):
    """The path before data.decode: torchvision's ImageFolder, PIL, float32 out of the workers."""
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    steps = (
        [T.RandomResizedCrop(crop), T.RandomHorizontalFlip()]
        if split == "train"
        else [T.Resize(256), T.CenterCrop(224)]
    )
    transform = T.Compose([*steps, T.ToTensor(), T.Normalize(MEAN, STD)])
    return _loader(ImageFolder(str(root / split), transform=transform), batch, workers), _moved


def uint8(root: Path, split: str, batch: int, workers: int, crop: int = 224):
    """Today's transforms ending in uint8, normalised once by to_device."""
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    transform = T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.PILToTensor()])
    return _loader(ImageFolder(str(root / split), transform=transform), batch, workers), _normalised()


def ours(root: Path, split: str, batch: int, workers: int, decode: str, crop: int = 224):
    """train.py's loader, as data.build_loaders makes it."""
    from config.setup import load
    from data import Loaders, build_loaders
    from distributed.context import make_context

    cfg = load(
        "dataset=imagefolder",
        f"dataset.root={root}",
        f"dataset.num_classes={CLASSES}",
        f"data.num_workers={workers}",
        f"data.decode={decode}",
        f"dataset.train_crop={crop}",
    )
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    loaders = build_loaders(cfg.dataset, cfg.data, ctx, batch, seed=0)
    loader = loaders.train if split == "train" else loaders.val
    return loader, lambda x, y: Loaders.to_device(loader, x, y, ctx.device)


def bytes_only(root: Path, split: str, batch: int, workers: int, crop: int = 224):
    """data.decode=gpu's workers alone: what they hand the training process, undecoded."""
    loader, _ = ours(root, split, batch, workers, "gpu", crop)
    return loader, lambda x, y: (x, y)


def _loader(dataset, batch: int, workers: int):
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None,
    )


def _moved(x: torch.Tensor, y: torch.Tensor):
    return x.to("cpu"), y  # the training loop's .to(device) before data.decode: a no-op on the CPU


def _normalised():
    from config.schema import DatasetConfig
    from data.transforms import ToDevice

    cfg = DatasetConfig(name="imagefolder", channels=3, image_size=224, mean=MEAN, std=STD)
    return ToDevice(cfg, 255, torch.device("cpu"))


def rate(made) -> float:
    """Images/s of a pass over the loader, each batch finished as the loop would, after a warm-up
    (the workers' start; the files are in the page cache since they were written): per CPU-second
    of this process without workers, per wall second with them."""
    loader, finish = made
    for x, y in itertools.islice(loader, 2 * loader.num_workers + 1):
        finish(x, y)
    clock = time.process_time if loader.num_workers == 0 else time.perf_counter
    images, start = 0, clock()
    for x, y in loader:
        finish(x, y)
        images += len(y)
    return images / (clock() - start)


def cpu_rounds(root: Path, rounds: int, batch: int, crop: int) -> list[list[object]]:
    cores = len(os.sched_getaffinity(0))
    systems: dict[str, Callable[[], float]] = {}
    for workers, where in ((0, "per core"), (cores, f"{cores} workers")):
        systems[f"today, {where}"] = lambda w=workers: rate(today(root, "train", batch, w, crop))
        systems[f"uint8, {where}"] = lambda w=workers: rate(uint8(root, "train", batch, w, crop))
        systems[f"data.decode=cpu, {where}"] = lambda w=workers: rate(ours(root, "train", batch, w, "cpu", crop))
        systems[f"data.decode=gpu workers (bytes), {where}"] = lambda w=workers: rate(
            bytes_only(root, "train", batch, w, crop)
        )
    systems["data.decode=gpu decoded by the CPU, per core"] = lambda: rate(ours(root, "train", batch, 0, "gpu", crop))
    systems["validation today, per core"] = lambda: rate(today(root, "val", batch, 0))
    systems["validation data.decode=cpu, per core"] = lambda: rate(ours(root, "val", batch, 0, "cpu"))
    figures = interleaved(systems, rounds)
    rows = []
    for name, values in figures.items():
        where = name.split(", ")[-1]
        base = "validation today, per core" if name.startswith("validation") else f"today, {where}"
        if base not in figures:
            base = "today, per core"
        ratios = [a / b for a, b in zip(values, figures[base])]
        target = ""
        if name == f"data.decode=cpu, {cores} workers":
            target = f"≥ {CPU_TARGET}×: {verdict(median(ratios), CPU_TARGET)}"
        rows.append([name, median(values), median(ratios), spread(ratios), target])
    return rows


def interleaved(systems: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each system once per round, the order turned each round: neighbours' load falls on all alike."""
    figures: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(systems[name]())
    return figures


# --- data.prepare -------------------------------------------------------------------------------


def prepare_rows(root: Path, rounds: int, workers: int) -> list[list[object]]:
    from data import prepare

    copies = {"original": root}
    for side in (500, 400):  # FFCV's ResNet-50 and ResNet-18 copies
        name = f"data.prepare --max-side {side} --quality 90"
        copies[name] = root.parent / f"shrunk{side}"
        prepare.main(
            [str(root), str(copies[name]), "--max-side", str(side), "--quality", "90", "--workers", str(workers)]
        )
    files = {name: sorted((path / "train").rglob("*.jpg")) for name, path in copies.items()}
    figures = interleaved({name: lambda f=f: decode_rate(f) for name, f in files.items()}, rounds)
    rows = []
    for name, values in figures.items():
        kb = statistics.mean(p.stat().st_size for p in files[name]) / 1e3
        ratios = [a / b for a, b in zip(values, figures["original"])]
        rows.append([name, kb, median(values), median(ratios), spread(ratios)])
    return rows


def decode_rate(files: list[Path]) -> float:
    """Images per CPU-second, PIL decoding each file whole."""
    from PIL import Image

    start = time.process_time()
    for path in files:
        with Image.open(path) as image:
            image.convert("RGB")
    return len(files) / (time.process_time() - start)


# --- the device's cut ---------------------------------------------------------------------------


def cut_rows(root: Path, device: torch.device, rounds: int) -> list[list[object]]:
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.ops import roi_align

    from data.crops import cut, random_resized_boxes, resized_crops

    files = sorted((root / "train").rglob("*.jpg"))[:128]
    data = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in files]
    images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    boxes = random_resized_boxes(torch.tensor([list(i.shape[1:]) for i in images]), torch.Generator().manual_seed(0))

    def each_roi_align():
        rois = [
            torch.tensor([[left, t, left + w, t + h]], dtype=torch.float, device=device)
            for t, left, h, w in boxes.tolist()
        ]
        return torch.cat(
            [roi_align(image[None].float(), [roi], 224, 1.0, -1, True) for image, roi in zip(images, rois)]
        )

    def padded_roi_align():
        height, width = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
        padded = torch.zeros(len(images), 3, height, width, device=device)
        for k, image in enumerate(images):
            padded[k, :, : image.shape[1], : image.shape[2]] = image
        rois = torch.tensor(
            [[k, left, t, left + w, t + h] for k, (t, left, h, w) in enumerate(boxes.tolist())],
            dtype=torch.float,
            device=device,
        )
        return roi_align(padded, rois, 224, 1.0, -1, True)

    ways = {
        "one float interpolate per image (data.decode=gpu's)": lambda: resized_crops(images, boxes, 224),
        "one roi_align per image": each_roi_align,
        "one roi_align, batch padded": padded_roi_align,
    }
    if device.type == "cpu":
        ways["one uint8 interpolate per image (data.decode=cpu's)"] = lambda: [
            cut(image, box, 224) for image, box in zip(images, boxes.tolist())
        ]
    figures = interleaved({name: lambda way=way: timed(way, len(images), device) for name, way in ways.items()}, rounds)
    first = next(iter(figures))
    return [
        [name, device.type, median(v), median([a / b for a, b in zip(v, figures[first])])]
        for name, v in figures.items()
    ]


def timed(work: Callable[[], object], images: int, device: torch.device) -> float:
    """Images/s: per CPU-second on the CPU, per wall second (synchronised) on a GPU."""
    work()  # warm-up
    _sync(device)
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    start = clock()
    work()
    _sync(device)
    return images / (clock() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- with CUDA ----------------------------------------------------------------------------------


def gpu_decode_rate(root: Path, rounds: int) -> float:
    """data.decode=gpu's to_device alone: decode, cut, flip, normalise batches of 256 on the GPU."""
    from config.setup import load
    from data import build_loaders
    from distributed.context import make_context

    cfg = load("dataset=imagefolder", f"dataset.root={root}", f"dataset.num_classes={CLASSES}", "data.decode=gpu")
    ctx = make_context(0, 0, 1, 1, "gpu", use_process_group=False)
    loader = build_loaders(cfg.dataset, cfg.data, ctx, 256, seed=0).train
    batches = [batch for batch in loader]  # read once: only the device's work is timed
    figures = []
    for _ in range(rounds + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        images = sum(len(loader.to_device(x, y)[1]) for x, y in batches)
        torch.cuda.synchronize()
        figures.append(images / (time.perf_counter() - start))
    return median(figures[1:])  # the first builds nvJPEG's state


def gpu_training_rows(root: Path, images: int, epochs: int, rounds: int) -> list[list[object]]:
    folder = [
        "dataset=imagefolder",
        f"dataset.root={root}",
        f"dataset.num_classes={CLASSES}",
        f"trainer.epochs={epochs}",
    ]
    synthetic = [
        "dataset=synthetic",
        "dataset.image_size=224",
        f"dataset.num_classes={CLASSES}",
        f"dataset.train_size={images}",
        "dataset.val_size=256",
        "data.loader=device",
        f"trainer.epochs={epochs}",
    ]
    runs = {
        "dataset=synthetic, data.loader=device": synthetic,
        "dataset=imagefolder, data.decode=gpu": [*folder, "data.decode=gpu"],
        "dataset=imagefolder, data.decode=cpu": [*folder, "data.decode=cpu"],
    }
    figures = interleaved(
        {name: lambda o=o: train(*GPU_RUN, *o)["train_samples_per_s"] for name, o in runs.items()}, rounds
    )
    base = figures["dataset=synthetic, data.loader=device"]
    rows = []
    for name, values in figures.items():
        ratios = [a / b for a, b in zip(values, base)]
        target = (
            "" if name.startswith("dataset=synthetic") else f"≥ {GPU_TARGET}: {verdict(median(ratios), GPU_TARGET)}"
        )
        rows.append([name, median(values), median(ratios), spread(ratios), target])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("--images", type=int, default=384, help="training images for the CPU loaders")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--train-crop", type=int, default=224, help="the CPU loaders' training crop (dataset.train_crop)"
    )
    parser.add_argument(
        "--gpu-images", type=int, default=7_680, help="training images for the GPU runs (30 batches of 256)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    images, rounds, batch, shrink = (16, 1, 8, 4) if args.quick else (args.images, args.rounds, 32, 1)
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        kb = write_folder(root, images, max(images // 4, CLASSES), shrink)
        print(
            f"{images} training JPEGs, mean {kb:.0f} KB; {len(os.sched_getaffinity(0))} cores; "
            f"batch {batch}; {rounds} rounds; medians of rounds\n"
        )
        heading = f"loader alone, to the training loop (crop {args.train_crop})"
        print(
            table([heading, "images/s", "× today", "range", "target"], cpu_rounds(root, rounds, batch, args.train_crop))
        )
        print()
        print(
            table(
                ["decode alone (PIL), per core", "mean KB", "images/s", "× original", "range"],
                prepare_rows(root, rounds, 1 if args.quick else len(os.sched_getaffinity(0))),
            )
        )
        print()
        cuts = cut_rows(root, torch.device("cpu"), rounds) + (
            cut_rows(root, torch.device("cuda"), rounds) if cuda else []
        )
        print(table(["the device's cut to 224 (128 images)", "device", "images/s", "× interpolate"], cuts))
        if not cuda:
            print("\nno CUDA device: the GPU part (decode alone, ResNet-50 training) is skipped")
            return
        gpu_root = Path(tmp) / "gpu"
        gpu_images, epochs = (512, 2) if args.quick else (args.gpu_images, 3)
        write_folder(gpu_root, gpu_images, 1024)
        print(
            f"\n{torch.cuda.get_device_name(0)}: data.decode=gpu's decode + cut + normalise alone, batches of 256: "
            f"{gpu_decode_rate(gpu_root, rounds):,.0f} images/s\n"
        )
        print(
            table(
                [
                    f"ResNet-50 training, {gpu_images} images, {epochs} epochs",
                    "images/s",
                    "× synthetic",
                    "range",
                    "target",
                ],
                gpu_training_rows(gpu_root, gpu_images, epochs, 1 if args.quick else 2),
            )
        )


if __name__ == "__main__":
    main()
