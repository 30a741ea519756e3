"""ImageNet-style folders: root/train/<class>/<image> and root/val/<class>/<image>, read from disk."""

from __future__ import annotations

import os
from pathlib import Path

from torchvision.datasets.folder import make_dataset

from config.schema import DatasetConfig
from data.image_paths import hidden, is_image
from errors import ConfigError

SPLITS = ("train", "val")
PER_IMAGE_TRANSFORMS = True  # decoded and cut per image (dataset.auto_augment, ... apply)


def count_classes(cfg: DatasetConfig) -> int:
    """dataset.num_classes=null: as torchvision's ImageFolder, one class per folder of train/."""
    return len(_classes(_root(cfg) / "train"))


def class_names(cfg: DatasetConfig) -> list[str]:
    """The class folders of train/, sorted: their labels are their positions, as in ImageFolder."""
    return _classes(_root(cfg) / "train")


def check(cfg: DatasetConfig) -> None:
    """The folders exist, hold the same classes, each with images to train on, and as many as the
    model is built for."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = {split: _classes(_root(cfg) / split) for split in SPLITS}
    if classes["train"] != classes["val"]:
        train, val = set(classes["train"]), set(classes["val"])
        only = "; ".join(
            f"only {split}/ has {', '.join(sorted(names)[:5])}{', ...' if len(names) > 5 else ''}"
            for split, names in (("train", train - val), ("val", val - train))
            if names
        )
        raise ConfigError(f"dataset.root={cfg.root}: train/ and val/ must hold the same class folders ({only})")
    images = f"no image ({' '.join(IMG_EXTENSIONS)}; a hidden file, '.' first, is none)"
    for name in classes["train"]:
        if not _holds_an_image(_root(cfg) / "train" / name):
            raise ConfigError(
                f"dataset.root={cfg.root}: train/{name}/ holds {images}, so class {name} would never be trained; "
                f"add its images, or remove {name}/ from both train/ and val/"
            )
    # An empty class folder in val/ is allowed (load passes allow_empty): validation subsets often
    # lack a class, and its folder must stay, since the sorted folders give the labels.
    if not any(_holds_an_image(_root(cfg) / "val" / name) for name in classes["val"]):
        raise ConfigError(
            f"dataset.root={cfg.root}: val/ holds {images} in any class folder; add the validation images"
        )
    if len(classes["train"]) != cfg.num_classes:
        raise ConfigError(
            f"dataset.num_classes={cfg.num_classes} but {cfg.root}/train holds {len(classes['train'])} class "
            f"folders; set dataset.num_classes={len(classes['train'])}"
        )


def image_files(cfg: DatasetConfig) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(path, class index) of every training and validation image, as torchvision's ImageFolder
    lists them, but for hidden files and folders (data.image_paths.is_image), which are not classes
    either (_classes); data/file_batches.py reads, decodes and cuts them."""
    check(cfg)
    return tuple(_samples(_root(cfg) / split, allow_empty=split == "val") for split in SPLITS)  # see check


def _samples(folder: Path, allow_empty: bool) -> list[tuple[str, int]]:
    labels = {name: label for label, name in enumerate(_classes(folder))}
    under = len(str(folder).rstrip(os.sep)) + 1  # make_dataset's paths start with the folder it walks
    return make_dataset(
        str(folder),
        labels,
        is_valid_file=lambda path: is_image(path[under:]),
        allow_empty=allow_empty,
    )


def _root(cfg: DatasetConfig) -> Path:
    if cfg.root is None:
        raise ConfigError("dataset.root=null: give the folder that holds train/ and val/ (dataset.root=/data/imagenet)")
    return Path(cfg.root)


def _classes(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise ConfigError(
            f"dataset.root={folder.parent}: no {folder.name}/ folder; it must hold train/<class>/ and val/<class>/"
        )
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not hidden(p.name))
    if not classes:
        raise ConfigError(f"dataset.root={folder.parent}: {folder} holds no class folders")
    return classes


def _holds_an_image(folder: Path) -> bool:
    """Whether image_files finds a sample here (at any depth, as it walks): stops at the first, so
    a class of thousands of images costs the first entries of a directory, not a walk."""
    subfolders = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir():
                if not hidden(entry.name):
                    subfolders.append(entry.path)
            elif is_image(entry.name):
                return True
    return any(_holds_an_image(Path(sub)) for sub in subfolders)
