"""Classify image files with a trained run: python predict.py <run dir or checkpoint> <images> ... [options].

<images>: files, folders (their image files, at any depth) or globs ('photos/**/*.jpg'). Each image is
cut as the run's validation cut its images (its saved config's dataset.val_resize, val_crop or
image_size, channels), decoded in DataLoader workers, and normalised on the device (mean, std), a
batch at a time. The top-k classes, by name, with their probabilities go to a CSV (one row per
image), and to the screen when there are few images. The forward computes in the run's
trainer.precision, as its validation did, unless --precision says otherwise.

Exit status: 0, every image classified; 1, some could not be read (each named in one line on
stderr; the others classified and written); 2, nothing to classify (a run or an image argument
that is not one), or an --out it cannot write, in one line.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from config.paths import make_folder
from data.image_paths import ImagePaths, collate, image_paths
from data.transforms import ToDevice
from errors import ConfigError
from trained import Trained, load, source_parser
from training.precision import AUTOCAST_DTYPES, Precision

SHOWN = 20  # images printed to the screen, at most; more go to the CSV only


def parser() -> argparse.ArgumentParser:
    parse = source_parser("python predict.py", __doc__)
    parse.add_argument("images", nargs="+", help="image files, folders of them, or globs")
    parse.add_argument("--top-k", type=int, default=5, help="classes per image (default 5)")
    parse.add_argument("--out", type=Path, default=Path("predictions.csv"), help="the CSV (default predictions.csv)")
    parse.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default 64)")
    parse.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="DataLoader workers decoding the images (default: none for one batch, else up to 8)",
    )
    parse.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda where there is one)")
    parse.add_argument(
        "--precision",
        choices=list(AUTOCAST_DTYPES),
        default=None,
        help="what the forward computes in; default: the run's trainer.precision, as its validation computed",
    )
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        for key in ("top_k", "batch_size"):
            if getattr(args, key) < 1:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(args, key)}: use 1 or more")
        if args.num_workers is not None and args.num_workers < 0:
            raise ConfigError(f"--num-workers={args.num_workers}: use 0 (decode here) or more")
        _check_out(args.out)
        device = _device(args.device)
        trained = load(args.source, args.weights)
        args.precision = args.precision or trained.trainer.get("precision", "32")  # the figures validation computed
        paths = image_paths(args.images)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, unread = predict(trained, paths, device, args)
    write_csv(args.out, rows, min(args.top_k, len(trained.class_names)))
    if len(rows) <= SHOWN:
        for path, top in rows:
            print(f"{path}: " + ", ".join(f"{name} {p:.1%}" for _, name, p in top))
    source = f"{trained.path} ({trained.weights} weights, precision {args.precision})"
    print(f"{len(rows)} of {len(paths)} image(s) classified by {source}: {args.out}")
    return 1 if unread else 0


def _check_out(path: Path) -> None:
    """Where the CSV goes, checked before any image is read."""
    if path.is_dir():
        raise ConfigError(f"--out={path}: is a folder; give the CSV's file name, e.g. --out={path / 'predictions.csv'}")
    make_folder(path.parent, f"--out={path}")


def _device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device={name}: not a device; use cpu, cuda or cuda:<index>") from None
    if device.type == "cpu":
        return device
    # torch names more devices (mps, xpu, meta, cuda:7) than a machine has; one it lacks failed
    # only once the run was loaded, in a traceback.
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if here is None or here.type != device.type:
        other = f" or --device {here.type}" if here is not None else ""
        raise ConfigError(f"--device={name}: this machine has no {device.type} device; use --device cpu{other}")
    count = torch.accelerator.device_count()
    if (device.index or 0) >= count:
        kind, last = device.type, f" to {device.type}:{count - 1}" if count > 1 else ""
        raise ConfigError(f"--device={name}: this machine has {count} {kind} device(s); use {kind}:0{last}")
    return device


def predict(
    trained: Trained, paths: list[str], device: torch.device, args: argparse.Namespace
) -> tuple[list[tuple[str, list[tuple[int, str, float]]]], int]:
    """[(path, [(label, name, probability), ...])] for each image that could be read, in the order
    given, and how many could not (each said on stderr)."""
    model = trained.model.to(device)
    precision = Precision.of(args.precision, device)
    finish = ToDevice(trained.dataset, 255, device)  # the run's normalisation, on the device
    workers = args.num_workers
    if workers is None:
        workers = 0 if len(paths) <= args.batch_size else min(8, len(os.sched_getaffinity(0)))
    loader = DataLoader(
        ImagePaths(paths, trained.dataset),
        batch_size=args.batch_size,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
    )
    k = min(args.top_k, len(trained.class_names))
    rows, unread = [], 0
    with torch.inference_mode():
        for images, positions, errors in loader:
            for error in errors:
                print(f"skipped {error}", file=sys.stderr)
            unread += len(errors)
            if not positions:
                continue
            x, _ = finish(images, torch.empty(0))
            with precision.autocast():
                outputs = model(x)
            probabilities = outputs.float().softmax(dim=1)  # of logits, or of a log_softmax output alike
            top = probabilities.topk(k, dim=1)
            for position, values, labels in zip(positions, top.values.tolist(), top.indices.tolist()):
                named = [(label, trained.class_names[label], p) for label, p in zip(labels, values)]
                rows.append((paths[position], named))
    return rows, unread


def write_csv(path: Path, rows: list[tuple[str, list[tuple[int, str, float]]]], k: int) -> None:
    """One row per image: path, then class_1, label_1, probability_1 ... up to k."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", *(f"{what}_{i}" for i in range(1, k + 1) for what in ("class", "label", "probability"))])
        for image, top in rows:
            out.writerow([image, *(value for label, name, p in top for value in (name, label, f"{p:.6f}"))])


if __name__ == "__main__":
    sys.exit(main())
