"""What the run tells people: console and train.log, TensorBoard, metrics.json. Rank 0 only."""
from __future__ import annotations

import json
import logging
import sys
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


class Reporter:
    """TensorBoard scalars and the final metrics.json; silent on every rank but 0."""

    def __init__(self, ctx: DistContext, run_dir: Path) -> None:
        self.enabled = ctx.is_main
        self.run_dir = run_dir
        self._writer = None
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter  # lazy: ~1 s of imports

            self._writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.enabled:
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, step)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        """One JSON object on one line: sweep reports read one file per run."""
        if self.enabled:
            (self.run_dir / "metrics.json").write_text(json.dumps(metrics) + "\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
