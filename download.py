"""Fetch a dataset's files ahead of a run: python download.py dataset=cifar10 [paths.data_dir=DIR].

In a run, rank 0 downloads what is missing while the other ranks wait; on clusters whose compute
nodes have no internet, run this on a login node first. It composes the config as train.py does,
so it takes the same overrides.
"""

from __future__ import annotations

import sys

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from config.schema import DatasetConfig
from config.setup import load
from data import OnDisk, dataset_module, serving
from data.download import COMMAND, dataset_root, fetch
from errors import ConfigError


def usage() -> str:
    return f"""usage: {COMMAND} dataset={"|".join(serving(OnDisk))} [dataset.root=DIR | paths.data_dir=DIR] [...]

Fetches the dataset's files into torchvision's layout under dataset.root (paths.data_dir unless
set) and reads them back whole, so that a run where there is no internet finds them. Takes the
overrides train.py takes."""


def main(argv: list[str]) -> int:
    """Compose the config as train.py would, fetch the dataset, read it back to prove it whole."""
    if "-h" in argv or "--help" in argv:
        print(usage())
        return 0
    try:
        cfg = _compose(argv)
        module = _module(cfg.name)
        fetch(module, cfg)
        train_split, val_split = module.read(dataset_root(cfg))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{cfg.name}: {len(train_split)} training and {len(val_split)} validation images in {dataset_root(cfg)}")
    return 0


def _compose(argv: list[str]) -> DatasetConfig:
    """train.py's config, with Hydra's errors (a screenful each) as one line."""
    for arg in argv:
        if arg.startswith("-"):
            raise ConfigError(f"{arg}: not an option; give overrides (key=value) only, see {COMMAND} --help")
        if arg.startswith("dataset="):  # before Hydra, whose error would list every dataset, not those with files
            _module(arg.removeprefix("dataset="))
    try:
        return load(*argv).dataset
    except (HydraException, OmegaConfBaseException) as e:
        cause = str(e.__cause__ or "").partition("\n")[0]  # omegaconf's reason (its next lines: the keys again)
        raise ConfigError(f"{_first_paragraph(e)}{f' ({cause})' if cause else ''}; see {COMMAND} --help") from None


def _module(name: str) -> OnDisk:
    """The dataset's module, if it has files to download."""
    downloadable = serving(OnDisk)
    if name not in downloadable:
        raise ConfigError(
            f"dataset={name}: choose one of {', '.join(downloadable)}, the datasets with files to download"
        )
    return dataset_module(name)


def _first_paragraph(error: BaseException) -> str:
    return " ".join(str(error).split("\n\n")[0].split())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
