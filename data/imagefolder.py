"""ImageNet-style folders: root/train/<class>/<image> and root/val/<class>/<image>, read from disk."""
from __future__ import annotations

from pathlib import Path

from PIL import Image

from config.schema import DatasetConfig
from data.transforms import imagenet_transform
from errors import ConfigError

SPLITS = ("train", "val")
PER_IMAGE_TRANSFORMS = True  # PIL images through torchvision transforms (dataset.auto_augment, ...)


def count_classes(cfg: DatasetConfig) -> int:
    """dataset.num_classes=null: as torchvision's ImageFolder, one class per folder of train/."""
    return len(_classes(_root(cfg) / "train"))


def check(cfg: DatasetConfig) -> None:
    """The folders exist, hold the same classes, and as many as the model is built for."""
    classes = {split: _classes(_root(cfg) / split) for split in SPLITS}
    if classes["train"] != classes["val"]:
        raise ConfigError(f"dataset.root={cfg.root}: train/ and val/ must hold the same class folders")
    if len(classes["train"]) != cfg.num_classes:
        raise ConfigError(
            f"dataset.num_classes={cfg.num_classes} but {cfg.root}/train holds {len(classes['train'])} class "
            f"folders; set dataset.num_classes={len(classes['train'])}"
        )


def load(cfg: DatasetConfig):
    from torchvision.datasets import ImageFolder

    check(cfg)
    root = Path(cfg.root)
    return tuple(
        ImageFolder(str(root / split), transform=imagenet_transform(cfg, train=split == "train"), loader=_open)
        for split in SPLITS
    )


def _root(cfg: DatasetConfig) -> Path:
    if cfg.root is None:
        raise ConfigError("dataset.root=null: give the folder that holds train/ and val/ (dataset.root=/data/imagenet)")
    return Path(cfg.root)


def _classes(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise ConfigError(f"dataset.root={folder.parent}: no {folder.name}/ folder; it must hold train/<class>/ and val/<class>/")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"dataset.root={folder.parent}: {folder} holds no class folders")
    return classes


def _open(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except OSError as e:  # PIL's UnidentifiedImageError is an OSError too
        raise ConfigError(f"{path}: unreadable image ({e}); delete or replace it") from None
