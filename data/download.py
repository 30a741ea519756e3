"""Dataset files in torchvision's layout under `dataset.root`, fetched once: in a run, rank 0
downloads what is missing while the others wait; ahead of one, `python download.py` (the CLI at
the top of the repo, for compute nodes without internet)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

from config.paths import make_folder
from config.schema import DatasetConfig
from data import DatasetModule, OnDisk
from distributed.collectives import on_main_first
from distributed.context import DistContext
from errors import ConfigError

# Rank 0 may spend minutes on a download; the others must outwait it, not launcher.timeout_s.
_DOWNLOAD_TIMEOUT = timedelta(minutes=30)


def dataset_root(cfg: DatasetConfig) -> Path:
    if cfg.root is None:
        raise ConfigError(f"dataset.root=null: dataset={cfg.name} needs a folder for its files (paths.data_dir)")
    return Path(cfg.root)


def missing(module: OnDisk, cfg: DatasetConfig) -> list[Path]:
    return [path for path in module.files(dataset_root(cfg)) if not path.is_file()]


COMMAND = "python download.py"  # download.py's, which error messages name as the fix


def prep_command(cfg: DatasetConfig) -> str:
    return fetch_command(cfg.name, dataset_root(cfg))


def fetch_command(name: str, root: Path) -> str:
    return f"{COMMAND} dataset={name} dataset.root={root}"


def require(module: OnDisk, cfg: DatasetConfig) -> None:
    """Files missing and not to be downloaded, or lying next to the root given: a one-line error
    naming the root and the fix."""
    refuse_a_root_beside_the_files(module, cfg)
    absent = missing(module, cfg)
    if absent and not cfg.download:
        raise ConfigError(
            f"dataset.download=false and {dataset_root(cfg)} lacks {absent[0].relative_to(dataset_root(cfg))}"
            f"{f' and {len(absent) - 1} more' if len(absent) > 1 else ''}; fetch it where there is internet "
            f"with `{prep_command(cfg)}` (or set dataset.root to where torchvision already put {cfg.name})"
        )


def refuse_a_root_beside_the_files(module: OnDisk, cfg: DatasetConfig) -> None:
    """Files missing under dataset.root but all there under a folder next to it: one line naming
    that folder, where a download would nest a second copy inside (or beside) the first."""
    absent = missing(module, cfg)
    found = _found_near(module, dataset_root(cfg)) if absent else None
    if found is not None:
        raise ConfigError(
            f"dataset.root={dataset_root(cfg)} lacks {absent[0].relative_to(dataset_root(cfg))}, but {found} holds "
            f"{cfg.name}'s files in torchvision's layout; set dataset.root={found}"
        )


def _found_near(module: OnDisk, root: Path) -> Path | None:
    """The root under which every file lies, where the one given is inside the dataset's own
    folder (cifar-10-batches-py/, MNIST/, MNIST/raw/) or just above it (an archive unpacked into
    a folder of its own). Looked for only when files are missing, without a stat per entry."""
    inside = [up for up in list(root.absolute().parents)[:2] if _holds(module, up, within=root.absolute())]
    if inside or not root.is_dir():
        return next(iter(inside), None)
    with os.scandir(root) as entries:
        below = sorted(Path(entry.path) for entry in entries if entry.is_dir())
    return next((folder for folder in below if _holds(module, folder)), None)


def _holds(module: OnDisk, root: Path, within: Path | None = None) -> bool:
    """Every file is under `root` (and, given `within`, in that folder or below it)."""
    files = module.files(root)
    return all(path.is_file() for path in files) and (within is None or within in files[0].parents)


def fetch(module: OnDisk, cfg: DatasetConfig) -> None:
    """Download what is missing with torchvision's code; failures become one line."""
    if not missing(module, cfg):
        return
    refuse_a_root_beside_the_files(module, cfg)  # python download.py calls this alone
    root = dataset_root(cfg)
    # A root this machine cannot write: no other machine's internet would help.
    make_folder(root, f"dataset.root={root}", fix="give dataset.root (or paths.data_dir) a folder you can write")
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


def prepare(module: DatasetModule, cfg: DatasetConfig, ctx: DistContext) -> None:
    """Download once: rank 0 fetches while the other ranks wait, then all learn whether it worked."""
    if not isinstance(module, OnDisk):
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


if __name__ == "__main__":  # the download command's old name
    sys.exit(f"error: this command is now `{COMMAND} {' '.join(sys.argv[1:])}`")
