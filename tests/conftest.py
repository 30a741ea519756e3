"""Fixtures and hooks only. pytest-xdist's controller imports this file before it starts any worker,
and runs no test: what the tests share that imports torch, Hydra or the project is in tests/configs.py
and tests/runs.py, imported where a test (or a fixture, as it runs) needs it."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# trainer.compile=true runs (and any test's subprocesses, which inherit this) reuse inductor's compiled
# kernels and FX graphs from earlier suite runs (in the git-ignored .cache/) instead of rebuilding them.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache/torchinductor"))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
# Two xdist workers share the cores: a train.py (or a test) taking every core as an intra-op thread
# oversubscribes them, and spinning OpenMP threads then run a step many times slower (BENCHMARKS.md,
# two 1-thread processes vs one 2-thread process). One thread each: set
# before any test module imports torch, which reads it then.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(scope="session")
def memory_dir(tmp_path_factory) -> Path:
    """This worker's dir in memory (/dev/shm, else a usual temp dir), for runs whose files are synced
    to disk many times: logger=mlflow's new SQLite store commits each of its schema migrations (see
    BENCHMARKS.md: the loggers' tests)."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path_factory.mktemp("memory")
        return
    path = Path(tempfile.mkdtemp(prefix="pytest-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory) -> Path:
    """The tiny 2-rank DDP job (tests/runs.py's reference), which test_launchers.py holds spawned,
    forkserver and torchrun's ranks to; test_slurm.py resumes a copy of its last.pt."""
    from tests.runs import reference

    return reference(tmp_path_factory.mktemp("reference_ddp") / "run", "ddp")


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory) -> Path:
    """The same job under FSDP."""
    from tests.runs import reference

    return reference(tmp_path_factory.mktemp("reference_fsdp") / "run", "fsdp")


# pytest-xdist hands whole files to the workers in collection order (--no-loadscope-reorder): the
# longest first, so that none of them starts last and runs alone while the other workers are done.
# The two-node rig's (test_slurm*.py) and the hung-rank files mostly wait, and overlap with the
# others' CPU work. Seconds per file: BENCHMARKS.md (the test suite).
LONGEST_FIRST = [
    "test_slurm_requeue.py",
    "test_slurm.py",
    "test_slurm_elastic.py",
    "test_bench.py",
    "test_launchers.py",
    "test_fsdp.py",
    "test_resume_preempt.py",
    "test_strategies.py",
    "test_hung_rank.py",
]


@pytest.hookimpl(wrapper=True)
def pytest_collection():
    """As train.py imports: the collector off while the test modules import torch, Hydra and the
    project, then what they made frozen out of every later full collection, each of which would
    walk it again (BENCHMARKS.md, the test suite)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: the rest keep their order
