"""Write a smaller copy of an image folder, FFCV's ImageNet trick: every image re-encoded as a
baseline colour JPEG with its longest side at most --max-side pixels, at JPEG --quality.

    python -m data.prepare SRC DST [--max-side 500] [--quality 90] [--workers N]

DST keeps SRC's layout (train/<class>/..., val/<class>/..., empty folders too): train with dataset.root=DST. A JPEG
keeps its name; any other image gets .jpg added to its name. Smaller files decode faster on either
data.decode path, and a copy of baseline colour JPEGs alone is one the GPU path decodes whole (no
file falls back to the CPU). Validate on a copy made the same way as the training one. What it
gains and what it costs in accuracy: BENCHMARKS.md (image folders).
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

from errors import ConfigError

JPEG_SUFFIXES = (".jpg", ".jpeg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="the image folder to copy")
    parser.add_argument(
        "destination", type=Path, help="where the copy goes (created; files already there are replaced)"
    )
    parser.add_argument(
        "--max-side", type=int, default=500, help="longest side in pixels (default 500, FFCV's ResNet-50 copy)"
    )
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality, 1-95 (default 90, FFCV's)")
    parser.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes (default: this machine's CPUs; 1: this one)",
    )
    args = parser.parse_args(argv)
    try:
        sources = _images(args.source, args.destination, args.max_side, args.quality)
        targets = [_target(args.source, args.destination, path) for path in sources]
        _copy_folders(args.source, args.destination)
        jobs = (sources, targets, [args.max_side] * len(sources), [args.quality] * len(sources))
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                sizes = list(pool.map(shrink, *jobs, chunksize=64))
        else:
            sizes = list(map(shrink, *jobs))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    before, after = sum(size for size, _ in sizes), sum(size for _, size in sizes)
    print(f"{len(sources)} images, {before / 1e6:,.1f} MB -> {after / 1e6:,.1f} MB in {args.destination}")
    return 0


def _images(source: Path, destination: Path, max_side: int, quality: int) -> list[Path]:
    """Every image a run would find under `source` (data.image_paths.is_image), once the arguments make sense."""
    from data.image_paths import image_files_under

    if not source.is_dir():
        raise ConfigError(f"{source}: no such folder; give the image folder to copy (it holds train/ and val/)")
    if destination.resolve() == source.resolve() or source.resolve() in destination.resolve().parents:
        raise ConfigError(f"{destination}: inside {source}; write the copy elsewhere")
    if max_side < 1:
        raise ConfigError(f"--max-side={max_side}: give the longest side in pixels, e.g. 500")
    if not 1 <= quality <= 95:
        raise ConfigError(f"--quality={quality}: use 1-95 (PIL's advice: above 95 grows files and gains nothing)")
    return image_files_under(source)


def _copy_folders(source: Path, destination: Path) -> None:
    """Every folder of `source` but hidden ones, empty ones too: an empty class folder (a class a
    validation subset lacks, which data.imagefolder allows) must stay, since the sorted class
    folders give the labels."""
    from data.image_paths import hidden

    for top, folders, _ in os.walk(source, followlinks=True):  # as data.image_paths.image_files_under walks
        folders[:] = [name for name in folders if not hidden(name)]  # they hold no image, nor a class
        (destination / Path(top).relative_to(source)).mkdir(parents=True, exist_ok=True)


def _target(source: Path, destination: Path, path: Path) -> Path:
    relative = path.relative_to(source)
    return destination / (
        relative if path.suffix.lower() in JPEG_SUFFIXES else relative.with_name(relative.name + ".jpg")
    )


def shrink(source: Path, target: Path, max_side: int, quality: int) -> tuple[int, int]:
    """`source` as a baseline RGB JPEG of longest side <= max_side at `target`; (bytes before, after)."""
    try:
        with Image.open(source) as image:
            image.thumbnail((max_side, max_side))  # keeps the aspect; decodes a large JPEG at a DCT scale first
            rgb = image.convert("RGB")
    except OSError as e:  # PIL's UnidentifiedImageError is an OSError too
        raise ConfigError(f"{source}: unreadable image ({e}); delete or replace it") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    rgb.save(target, "JPEG", quality=quality)
    return source.stat().st_size, target.stat().st_size


if __name__ == "__main__":
    sys.exit(main())
