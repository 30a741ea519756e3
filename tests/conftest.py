"""Shared helpers: compose configs like train.py does, and run train.py as a user would."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, open_dict

from config.check import run_config, swept_overrides, typed
from config.schema import Config, RunConfig
from config.setup import ROOT, compose


def compose_config(*overrides: str) -> DictConfig:
    """The config `python train.py *overrides` composes, as Hydra gives it to main()."""
    return compose(*overrides)


def typed_config(*overrides: str) -> Config:
    return typed(compose(*overrides))


def job_config(run_dir: Path, *overrides: str) -> RunConfig:
    """What train.py hands each worker for `python train.py *overrides`, run in `run_dir`."""
    cfg = compose(*overrides, hydra=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return run_config(cfg, typed(cfg), run_dir, choices, swept_overrides(overrides))


def run_train(run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python train.py` in a subprocess, with its run dir at `run_dir`."""
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_weights(run_dir: Path, other: Path) -> bool:
    """Both runs' last checkpoints hold bitwise-identical model weights."""
    a, b = (torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"] for d in (run_dir, other))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="session")
def spawn_reference(tmp_path_factory) -> Path:
    """2 spawn ranks of the tiny DDP job the launcher tests run under torchrun and SLURM."""
    run_dir = tmp_path_factory.mktemp("spawn") / "run"
    result = run_train(run_dir, "debug=ddp_cpu")
    assert result.returncode == 0, result.stderr
    return run_dir
