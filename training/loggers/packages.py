"""The loggers that need a package training does not (requirements-extras.txt): checked before
launch, imported only by the backend that uses it (wandb's and mlflow's imports would slow every start-up)."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from config.schema import LoggerConfig
from errors import ConfigError

PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}  # logger option -> the module it imports


def check_installed(cfg: LoggerConfig) -> None:
    """Each chosen logger's package is importable (found, not imported)."""
    for option, module in PACKAGES.items():
        if getattr(cfg, option) is not None and importlib.util.find_spec(module) is None:
            raise _missing(option, module)


def import_for(option: str) -> ModuleType:
    module = PACKAGES[option]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(option, module) from None


def _missing(option: str, module: str) -> ConfigError:
    return ConfigError(
        f"logger={option} needs {module}, which is not installed: "
        "pip install -r requirements-extras.txt (or leave it out of logger=)"
    )
