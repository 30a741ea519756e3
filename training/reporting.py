"""What the run tells people besides its loggers: the console and train.log, metrics.json. Rank 0 speaks."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distributed.context import DistContext

log = logging.getLogger("train")

_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def configure_logging(ctx: DistContext, run_dir: Path) -> None:
    """Rank 0 speaks at INFO to the console and train.log; other ranks only warn, with their rank.

    Hydra sets up logging in the process it starts; spawned ranks begin with none.
    """
    root = logging.getLogger()
    if ctx.is_main:
        if not root.handlers:
            root.setLevel(logging.INFO)
            for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(run_dir / "train.log")):
                handler.setFormatter(logging.Formatter(_FORMAT))
                root.addHandler(handler)
        return
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[rank {ctx.rank}]{_FORMAT}"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


def log_run_dir(ctx: DistContext, run_dir: Path, ended: bool = False) -> None:
    """Rank 0 says where the run writes as it starts, and again as it ends, however it ends."""
    if ctx.is_main:
        log.info("run dir: %s%s", run_dir, " (the run has ended)" if ended else "")


def write_hparams(run_dir: Path, hparams: Mapping[str, Any]) -> None:
    """The run's record (config.hparams: every option it used, flat) and its model summary, as one
    JSON object, written as it starts: what bench.report compares runs by. The first file a run
    writes: its dir is made here where Hydra has not made it (train() called as a function)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "hparams.json").write_text(json.dumps(hparams) + "\n")


def write_metrics(run_dir: Path, metrics: Mapping[str, Any]) -> None:
    """The run's final figures as one JSON object on one line: sweep reports read one file per run."""
    (run_dir / "metrics.json").write_text(json.dumps(metrics) + "\n")
