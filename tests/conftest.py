"""Shared helpers: compose configs like train.py does, and run train.py as a user would."""
from __future__ import annotations

import os
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
from distributed import sharded_state
from tests import train_server

# trainer.compile=true runs (and any test's subprocesses, which inherit this) reuse inductor's compiled
# kernels and FX graphs from earlier suite runs (in the git-ignored .cache/) instead of rebuilding them.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "torchinductor"))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
# Two xdist workers share the cores: a train.py (or a test) taking every core as an intra-op thread
# oversubscribes them, and spinning OpenMP threads then run a step up to ~10x slower (measured on a
# loaded 2-core machine: simple_cnn 1,656 samples/s with 1 thread, 137 with 2). One thread each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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


# What run_train adds to a run's overrides, unless cold: the CPU ranks it starts are forked from it,
# with nothing left to import (a spawned rank imports torch afresh: 6.0 s of CPU for a tiny 2-rank
# DDP run against 0.8 s; BENCHMARKS.md, the test suite). The kill, preemption and rank-failure runs of test_resume_preempt.py keep
# the default, spawn: what it leaves behind (multiprocessing's resource tracker) is among what they
# check. The FSDP kills and the hung ranks fork theirs: what they test comes once the ranks train.
# test_launchers.py holds spawned and forkserver ranks to forked ones.
FORK_RANKS = "launcher.start_method=fork"


def run_train(run_dir: Path, *overrides: str, timeout: float = 240, cold: bool = False) -> subprocess.CompletedProcess:
    """`python train.py` in its own process, with its run dir at `run_dir`: forked from the preloaded
    server (tests/train_server.py), or with `cold`, a fresh interpreter that imports everything."""
    args = [f"hydra.run.dir={run_dir}", "trainer.progress_bar=false"]
    if cold:
        cmd = [sys.executable, "train.py", *args, *overrides]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return train_server.run([FORK_RANKS, *args, *overrides], timeout=timeout)


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


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest ||a - b|| / ||b|| over the float tensors of two state dicts with the same keys;
    their integer ones (BatchNorm's num_batches_tracked) must be equal."""
    assert a.keys() == b.keys()
    counts = [k for k in b if not b[k].is_floating_point()]
    assert all(torch.equal(a[k], b[k]) for k in counts), counts
    return max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in b if k not in counts)


def _reference(tmp_path_factory, strategy: str) -> Path:
    run_dir = tmp_path_factory.mktemp(f"reference_{strategy}") / "run"
    result = run_train(run_dir, "debug=ddp_cpu", f"strategy={strategy}")
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory) -> Path:
    """2 ranks of the tiny DDP job that the launcher tests run under torchrun and SLURM, started by
    the spawn launcher (torch.multiprocessing) as run_train starts them: forked. test_launchers.py
    holds spawned and forkserver ranks to the same weights."""
    return _reference(tmp_path_factory, "ddp")


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory) -> Path:
    """The same job under FSDP."""
    return _reference(tmp_path_factory, "fsdp")


# pytest-xdist hands whole files to the workers in collection order (--no-loadscope-reorder): the
# longest first, so that none of them starts last and runs alone while the other workers are done.
# The SLURM and hung-rank files mostly wait, and overlap with the others' CPU work. Seconds per file:
# BENCHMARKS.md (the test suite).
LONGEST_FIRST = ["test_slurm_requeue.py", "test_slurm.py", "test_bench.py", "test_launchers.py", "test_fsdp.py",
                 "test_resume_preempt.py", "test_strategies.py", "test_hung_rank.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: the rest keep their order
