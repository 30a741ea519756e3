"""Watch a hyperparameter search live: optuna-dashboard on the study it writes.

python -m bench.dashboard multirun/search/digits [--port 8080] [--host 127.0.0.1] [optuna-dashboard's options]

The target is a search's dir (its optuna.db or optuna.journal), a study's file, or any storage URL
(the search's hydra.sweeper.storage, journal:/// included). Then http://127.0.0.1:8080 shows each
trial as it completes, the history, the parameters' importance and slices. The same as `optuna-dashboard sqlite:///<dir>/optuna.db`,
with the path checked first: Optuna would make an empty database of a mistyped one, and show no
study. Needs optuna-dashboard (requirements-extras.txt).
"""

from __future__ import annotations

import argparse
import errno
import sys
from importlib.metadata import entry_points
from pathlib import Path

from hydra_plugins.optuna_study_sweeper._storage import journal_path

SQLITE = "sqlite:///"  # then the database's path: relative, or /absolute (four slashes)


def storage_url(target: str) -> str:
    """The study's storage as optuna-dashboard takes it: a URL as given, a journal as its file's
    path; a search's dir as its optuna.db, else its optuna.journal; a file as SQLite or a journal."""
    journal = journal_path(target)
    # sqlite:/// as the search logs its storage: checked as a path is, or Optuna makes an empty
    # database of a mistyped one, and optuna-dashboard ends in a traceback on it.
    database = Path(target.removeprefix(SQLITE)) if target.startswith(SQLITE) else None
    if journal is None and database is None and "://" in target:
        return target
    path = journal or database or Path(target)
    if path.is_dir():
        path = next(
            (path / name for name in ("optuna.db", "optuna.journal") if (path / name).is_file()), path / "optuna.db"
        )
    if not path.is_file():
        raise SystemExit(
            f"bench.dashboard: {path}: no such study database; give a search's dir "
            "(multirun/search/<name>), its optuna.db or optuna.journal, or a storage URL"
        )
    with path.open("rb") as f:
        sqlite = f.read(16) == b"SQLite format 3\x00"
    return f"sqlite:///{path.resolve()}" if sqlite else str(path.resolve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="a search's dir, its optuna.db, or a storage URL")
    args, options = parser.parse_known_args()
    url = storage_url(args.target)
    scripts = entry_points(group="console_scripts", name="optuna-dashboard")
    if not scripts:
        raise SystemExit("bench.dashboard needs optuna-dashboard: pip install -r requirements-extras.txt")
    sys.argv = ["optuna-dashboard", url, *options]
    try:
        scripts["optuna-dashboard"].load()()  # optuna-dashboard's own command, in this process
    except OSError as e:  # its server's bind: a traceback from wsgiref
        if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise SystemExit(
            f"bench.dashboard: cannot serve there ({e.strerror}: another dashboard?); give another --port, or --host"
        ) from None


if __name__ == "__main__":
    main()
