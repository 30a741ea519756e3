"""trainer.precision: the dtype autocast computes in, and whether gradients need loss scaling."""
from __future__ import annotations

import torch

AUTOCAST_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """Mixed precision for forward and loss; a no-op at 32. Weights and optimizer stay fp32."""
    dtype = AUTOCAST_DTYPES[precision]
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.

    A disabled scaler passes step() straight to the optimizer, so the loop has one code path.
    """
    return torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
