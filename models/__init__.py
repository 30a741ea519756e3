"""Networks as plain nn.Modules. Nothing here knows about processes or devices."""
from __future__ import annotations

from typing import Any

from torch import nn


def build(cfg: Any) -> nn.Module:
    """Instantiate the `_target_` of a model config (channels/classes/size come from the dataset)."""
    from hydra.utils import instantiate

    return instantiate(cfg)
