"""Shared helpers: compose configs like train.py does, and run train.py as a user would."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import train  # noqa: F401  registers the structured-config schema, as `python train.py` does

ROOT = Path(__file__).resolve().parents[1]


def compose_config(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_train(run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python train.py` in a subprocess, with its run dir at `run_dir`."""
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
