"""The folders a run or a command is told to write to (hydra.run.dir, hydra.sweep.dir, dataset.root,
predict.py's and export.py's --out, bench.report's --png): made, and written to once, before any
work, or one line naming the key and why."""

from __future__ import annotations

import tempfile
from pathlib import Path

from errors import ConfigError


def make_folder(folder: Path | str, key: str, fix: str = "give a path you can write") -> None:
    """`folder` made if it is not there, and a file made in it and gone: a path that cannot take the
    output (a file on the way, a read-only disk, a permission) is a ConfigError naming `key`
    (`hydra.run.dir=...`, `--out=...`), and `fix`."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # os.access says yes to root on a read-only disk
            pass
    except (FileExistsError, NotADirectoryError):
        file = next(path for path in (folder, *folder.parents) if path.exists())  # the nearest that exists
        raise ConfigError(f"{key}: cannot write there ({file} is a file, not a folder); {fix}") from None
    except OSError as e:
        raise ConfigError(f"{key}: cannot write there ({e.strerror or e}); {fix}") from None
