"""trainer.precision: the dtype autocast computes in, and whether gradients need loss scaling."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

AUTOCAST_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass(frozen=True)
class Precision:
    """Resolved once per run: the step asks it for a context, never looks at the string again."""

    dtype: torch.dtype | None  # None: fp32, no autocast at all
    device_type: str

    @classmethod
    def of(cls, precision: str, device: torch.device) -> Precision:
        return cls(AUTOCAST_DTYPES[precision], device.type)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for forward and loss. Weights and optimizer stay fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        A disabled scaler passes step() straight to the optimizer."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)
