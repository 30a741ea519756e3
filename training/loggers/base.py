"""The Logger seam: what a backend implements to receive the run's figures (training/loggers/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np


class Logger(Protocol):
    """One backend (TensorBoard, CSV, W&B, MLflow). Made on rank 0 only, from the run's
    RunConfig; every method is called on rank 0 only, from the training process."""

    # Whether log_image shows anything: the sample grid is drawn only if a chosen backend takes
    # images (a class attribute: every rank decides from the config, without making the backends).
    takes_images: ClassVar[bool]

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Figures at an optimizer step: every `trainer.log_every_n_steps` (train/*, lr) and each
        epoch's end (val/*, throughput/*, time/*, memory/*, and what callbacks add)."""

    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None:
        """An image, uint8, H x W x 3 (the sample grid, each epoch, mostly unchanged from the last)."""

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
        """Once, at the end: the run's options (RunConfig.hparams) and its final metrics (metrics.json's)."""

    def close(self) -> None:
        """Flush and release; called once, after training, also when it failed."""
