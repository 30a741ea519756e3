"""Shared helpers: compose configs like train.py does, and run train.py as a user would."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, open_dict

from config.check import run_config, typed
from config.schema import Config, RunConfig
from config.setup import ROOT, compose
from distributed import sharded_state


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
    return run_config(cfg, typed(cfg), run_dir, choices, [o.split("=", 1)[0] for o in overrides])


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


def last_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model in a run's last.pt: a file, or strategy=fsdp's sharded directory."""
    last = run_dir / "checkpoints" / "last.pt"
    return sharded_state.read_model_state(last) if last.is_dir() else torch.load(last, weights_only=True)["model"]


def same_weights(run_dir: Path, other: Path) -> bool:
    """Both runs' last checkpoints hold bitwise-identical model weights."""
    a, b = last_weights(run_dir), last_weights(other)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _spawn_reference(tmp_path_factory, strategy: str) -> Path:
    run_dir = tmp_path_factory.mktemp(f"spawn_{strategy}") / "run"
    result = run_train(
        run_dir, f"strategy={strategy}", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.epochs=1",
        "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
    )
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture(scope="session")
def spawn_reference(tmp_path_factory) -> Path:
    """2 spawn ranks of the tiny DDP job the launcher tests run under torchrun and SLURM."""
    return _spawn_reference(tmp_path_factory, "ddp")


@pytest.fixture(scope="session")
def fsdp_spawn_reference(tmp_path_factory) -> Path:
    """The same job under FSDP."""
    return _spawn_reference(tmp_path_factory, "fsdp")
