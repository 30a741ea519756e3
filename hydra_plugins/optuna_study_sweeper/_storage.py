"""Where a study lives (hydra.sweeper.storage), and the storage every sweeper and trial of it opens.

- `sqlite:///PATH`: one file, no set-up; one writer at a time (BENCHMARKS.md, "Searches that scale").
- `journal:///PATH`: Optuna's journal, an append-only file that many processes on a shared filesystem
  write through a lock file, with no server.
- any other SQLAlchemy URL, e.g. `postgresql+psycopg://USER@HOST:PORT/DB`: a database server. Its
  password stays out of the URL, which Hydra writes to .hydra/ and the log (on the command line,
  config.overrides.check_overrides refuses it): libpq reads it from PGPASSWORD, PGPASSFILE or ~/.pgpass.

Each opens with heartbeats, so that a trial whose sweeper was killed is found and run again.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.exc import IntegrityError, ProgrammingError

from config.redact import redact
from errors import first_line
from hydra_plugins.optuna_study_sweeper import _optuna_private

JOURNAL = "journal:///"


class StorageError(Exception):
    """A storage URL that cannot be used as given; the message names the fix."""


def _database(url: str, heartbeat_interval: int | None, grace_period: int | None) -> BaseStorage:
    """Optuna's RDB storage. Sweepers that open an empty PostgreSQL database at once each create its
    tables, and CREATE TABLE IF NOT EXISTS is not atomic there: the losers fail on a duplicate key of
    pg_type (or DuplicateTable). The tables then exist, and a second try finds them."""
    for attempt in range(1, _CREATE_TRIES + 1):
        try:
            return _optuna_private.HeartbeatStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
            )
        except (IntegrityError, ProgrammingError):
            if attempt == _CREATE_TRIES:
                raise
            time.sleep(0.5 * attempt)


_CREATE_TRIES = 3


def journal_path(url: str) -> Path | None:
    """The file a journal:/// URL names (relative unless it starts with /, as sqlite:/// reads); None for others."""
    return Path(url.removeprefix(JOURNAL)) if url.startswith(JOURNAL) else None


def open_storage(url: str | None, heartbeat_interval: int | None, grace_period: int | None) -> BaseStorage | None:
    """The storage `url` names, beating for its running trials (none: a trial's own process); None: a study
    in memory."""
    if url is None:
        return None
    path = journal_path(url)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeats: experimental since Optuna 2.9
            if path is not None:
                return _optuna_private.JournalHeartbeatStorage(
                    JournalFileBackend(str(path)),
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
                )
            return _database(url, heartbeat_interval, grace_period)
    except Exception as e:  # SQLAlchemy's errors, a missing database driver, a refused login, Optuna's own checks
        raise StorageError(
            f"hydra.sweeper.storage={redact(url)}: {type(e).__name__}: {redact(first_line(e))}"
        ) from None
