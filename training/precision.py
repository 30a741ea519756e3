"""trainer.precision: the dtype autocast computes in, and whether gradients need loss scaling."""
from __future__ import annotations

import contextlib

import torch

AUTOCAST_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision for forward and loss; nothing at 32. Weights and optimizer stay fp32."""
    dtype = AUTOCAST_DTYPES[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.

    A disabled scaler passes step() straight to the optimizer, so the loop has one code path.
    """
    return torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
