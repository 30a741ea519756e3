"""Dataset files in torchvision's layout under `dataset.root`, fetched once.

In a run, rank 0 downloads what is missing while the others wait; on clusters whose compute nodes
have no internet, fetch ahead of time on a login node:

    python -m data.download dataset=cifar10 [paths.data_dir=/shared/datasets]
"""
from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

from config.schema import DatasetConfig
from distributed.collectives import on_main_first
from distributed.context import DistContext
from errors import ConfigError

# Rank 0 may spend minutes on a download; the others must outwait it, not launcher.timeout_s.
_DOWNLOAD_TIMEOUT = timedelta(minutes=30)


def dataset_root(cfg: DatasetConfig) -> Path:
    if cfg.root is None:
        raise ConfigError(f"dataset.root=null: dataset={cfg.name} needs a folder for its files (paths.data_dir)")
    return Path(cfg.root)


def missing(module: ModuleType, cfg: DatasetConfig) -> list[Path]:
    return [path for path in module.files(dataset_root(cfg)) if not path.is_file()]


def prep_command(cfg: DatasetConfig) -> str:
    return f"python -m data.download dataset={cfg.name} dataset.root={dataset_root(cfg)}"


def require(module: ModuleType, cfg: DatasetConfig) -> None:
    """Files missing and not to be downloaded: a one-line error naming the root and the fix."""
    absent = missing(module, cfg)
    if absent and not cfg.download:
        raise ConfigError(
            f"dataset.download=false and {dataset_root(cfg)} lacks {absent[0].relative_to(dataset_root(cfg))}"
            f"{f' and {len(absent) - 1} more' if len(absent) > 1 else ''}; fetch it where there is internet "
            f"with `{prep_command(cfg)}` (or set dataset.root to where torchvision already put {cfg.name})"
        )


def fetch(module: ModuleType, cfg: DatasetConfig) -> None:
    """Download what is missing with torchvision's code; failures become one line."""
    if not missing(module, cfg):
        return
    root = dataset_root(cfg)
    try:
        module.download(root)
    except (OSError, RuntimeError) as e:  # URLError is an OSError; torchvision raises RuntimeError
        reason = " ".join(str(e).split()) or type(e).__name__  # torchvision lists each mirror on its own line
        raise ConfigError(
            f"could not download {cfg.name} into {root} ({reason}); run `{prep_command(cfg)}` on a machine "
            "with internet, or copy the files there"
        ) from None
    if missing(module, cfg):
        raise ConfigError(f"downloaded {cfg.name} into {root} but {missing(module, cfg)[0]} is still missing")


def prepare(module: ModuleType, cfg: DatasetConfig, ctx: DistContext) -> None:
    """Download once: rank 0 fetches while the other ranks wait, then all learn whether it worked."""
    if not hasattr(module, "files"):
        return

    def fetch_on_main() -> None:
        require(module, cfg)
        fetch(module, cfg)

    on_main_first(fetch_on_main, ctx, _DOWNLOAD_TIMEOUT, needed=lambda: bool(missing(module, cfg)))
    absent = missing(module, cfg)
    if absent:  # this rank's node does not share rank 0's filesystem
        raise ConfigError(
            f"rank {ctx.rank} does not see {absent[0]}, which rank 0 has; put dataset.root on a filesystem "
            f"every node shares, or run `{prep_command(cfg)}` on each node"
        )


USAGE = """usage: python -m data.download dataset=mnist|cifar10 [dataset.root=DIR | paths.data_dir=DIR] [...]

Fetches the dataset's files into torchvision's layout under dataset.root (paths.data_dir unless
set) and reads them back whole, so that a run where there is no internet finds them. Takes the
overrides train.py takes."""


def main(argv: list[str]) -> int:
    """Compose the config as train.py would, fetch the dataset, read it back to prove it whole."""
    if "-h" in argv or "--help" in argv:
        print(USAGE)
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
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from config.setup import load

    for arg in argv:
        if arg.startswith("-"):
            raise ConfigError(f"{arg}: not an option; give overrides (key=value) only, see python -m data.download --help")
        if arg.startswith("dataset="):  # before Hydra, whose error would list every dataset, not those with files
            _module(arg.removeprefix("dataset="))
    try:
        return load(*argv).dataset
    except (HydraException, OmegaConfBaseException) as e:
        cause = str(e.__cause__ or "").partition("\n")[0]  # omegaconf's reason (its next lines: the keys again)
        raise ConfigError(f"{_first_paragraph(e)}{f' ({cause})' if cause else ''}; see python -m data.download --help") from None


def _module(name: str) -> ModuleType:
    """The dataset's module, if it has files to download."""
    from data import _MODULES, dataset_module

    downloadable = [choice for choice in _MODULES if hasattr(dataset_module(choice), "files")]
    if name not in downloadable:
        raise ConfigError(f"dataset={name}: choose {' or '.join(downloadable)}, the datasets with files to download")
    return dataset_module(name)


def _first_paragraph(error: BaseException) -> str:
    return " ".join(str(error).split("\n\n")[0].split())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
