"""Hydra's callbacks (conf/config.yaml's hydra.callbacks): what Hydra does before main() runs, made
to fail in one line and to leave an earlier run's record as it was (a secret the config shows is
refused before Hydra writes the record); and a sweep (`-m`, or an
hparams_search) saying where it writes, as it starts and as it ends, with the command that compares
its jobs; on a SLURM cluster that keeps no accounting, watching its jobs with squeue."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from config.paths import make_folder
from config.redact import IN_THE_ENVIRONMENT, shown_secret
from errors import ConfigError, config_error_within

log = logging.getLogger(__name__)


class SecretCheck(Callback):
    """Hydra writes the composed config, as its files wrote it, to the run's record (.hydra/, a
    sweep's multirun.yaml) before main() runs: a password or key a config file holds would be kept
    there. The command line's are refused sooner (config.overrides)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_if_a_secret_shows(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_if_a_secret_shows(config)


def _exit_if_a_secret_shows(config: DictConfig) -> None:
    shown = shown_secret(OmegaConf.to_container(config, resolve=False))
    if shown is not None:
        print(
            f"error: {shown}: a password or key in a config file is written to the run's records; {IN_THE_ENVIRONMENT}",
            file=sys.stderr,
        )
        sys.exit(2)


class OutputDirCheck(Callback):
    """Hydra makes the run dir before main() runs; one it cannot make would end in a traceback.
    It also writes the run's record (.hydra/) before main() can refuse the run: what a run dir
    held is kept, for restore_run_record to put back."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            directory = config.hydra.run.dir
        except InterpolationResolutionError as e:  # run_name refuses a world whose ranks cannot share a dir
            cause = config_error_within(e)
            if cause is None:
                raise
            print(f"error: {cause}", file=sys.stderr)
            sys.exit(2)
        _exit_unless_writable("hydra.run.dir", directory)
        subdir = config.hydra.output_subdir  # None on the ranks that write no record
        record = Path(directory, subdir) if subdir is not None else None
        if record is not None and record.is_dir():
            _kept_record.update((path, path.read_bytes()) for path in record.iterdir() if path.is_file())

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_writable("hydra.sweep.dir", config.hydra.sweep.dir)


_kept_record: dict[Path, bytes] = {}  # the run dir's .hydra/ files as an earlier run left them


def restore_run_record() -> None:
    """A refused run leaves the record of the run its dir already held as it was: bench.report
    reads a run's overrides from it."""
    for path, contents in _kept_record.items():
        path.write_bytes(contents)


def _exit_unless_writable(key: str, directory: str) -> None:
    try:
        make_folder(directory, f"{key}={directory}", fix=f"choose a writable {key}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


class SlurmJobs(Callback):
    """A sweep's SLURM jobs, on a cluster that keeps no accounting, watched with squeue
    (config/slurm_jobs.py): with sacct's errors alone, a job that ended without a result hung it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.launcher.get("_target_") != SLURM_LAUNCHER:
            return
        from config.slurm_jobs import watch_with_squeue_where_no_accounting  # imports submitit

        if watch_with_squeue_where_no_accounting():
            log.info("This SLURM cluster keeps no accounting (sacct): the sweep asks squeue how its jobs ended")


def report_command(sweep_dir: str) -> str:
    return f"python -m bench.report {shlex.quote(sweep_dir)}"


class SweepDir(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        log.info("Sweep dir: %s (a dir per job); once it ends, compare them: %s", sweep_dir, report_command(sweep_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        log.info("Sweep done, in %s; compare its jobs: %s", sweep_dir, report_command(sweep_dir))
