from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np


class Logger(Protocol):
    """One backend (TensorBoard, CSV, W&B, MLflow). Made on rank 0 only, from the run's
    RunConfig; every method is called on rank 0 only, from the training process."""
    def log_scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None: ...   # uint8, H x W x 3
    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None: ...
        # once, at the end: the run's options (RunConfig.hparams) and its final metrics (metrics.json's)
    def close(self) -> None: ...
