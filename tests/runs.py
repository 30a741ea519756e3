"""Run train.py as a user would, and compare what runs leave behind."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from pathlib import Path

import torch

from config.schema import ResumePoint, TrainerConfig
from config.setup import ROOT
from models.mnist_net import MnistNet
from tests import train_server
from training.checkpoint import resume, sharded

# What run_train adds to a run's overrides, unless cold: the CPU ranks it starts are forked from it,
# with nothing left to import (a spawned rank imports torch afresh, most of a tiny 2-rank DDP
# run's CPU; BENCHMARKS.md, the test suite). The kill, preemption and rank-failure runs
# of test_resume_preempt.py keep the default, spawn: what it leaves behind (multiprocessing's
# resource tracker) is among what they check. The FSDP kills and the hung ranks fork theirs: what
# they test comes once the ranks train. test_launchers.py holds spawned and forkserver ranks to
# forked ones.
FORK_RANKS = "launcher.start_method=fork"


def run_train(run_dir: Path, *overrides: str, timeout: float = 240, cold: bool = False) -> subprocess.CompletedProcess:
    """`python train.py` in its own process, with its run dir at `run_dir`: forked from the preloaded
    server (tests/train_server.py), or with `cold`, a fresh interpreter that imports everything."""
    args = [f"hydra.run.dir={run_dir}", "trainer.progress_bar=false"]
    if cold:
        cmd = [sys.executable, "train.py", *args, *overrides]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return train_server.run([FORK_RANKS, *args, *overrides], timeout=timeout)


def reference(run_dir: Path, strategy: str) -> Path:
    """2 ranks of the tiny job that the launcher tests run under torchrun and SLURM, started by the
    spawn launcher (torch.multiprocessing) as run_train starts them: forked."""
    result = run_train(run_dir, "debug=ddp_cpu", f"strategy={strategy}")
    assert result.returncode == 0, result.stderr
    return run_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model in a run's last.pt: a file, or strategy=fsdp's sharded directory."""
    last = run_dir / "checkpoints" / "last.pt"
    return sharded.read_model_state(last) if last.is_dir() else torch.load(last, weights_only=True)["model"]


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


def wandb_records(run_file: Path):
    """The records of a .wandb file (LevelDB's log format: 32 KiB blocks of length-prefixed chunks
    after W&B's 7-byte header), as W&B's own protobuf type. wandb 0.31 ships no reader of its own."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, position, chunks = run_file.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if (left := 32768 - position % 32768) < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        chunks += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            yield Record.FromString(chunks)
            chunks = b""


def resume_point(path: Path) -> ResumePoint:
    """The ResumePoint the pre-flight would decide on for the checkpoint file `path`."""
    return ResumePoint(path, int(torch.load(path, weights_only=True, mmap=True)["step"]), path.stat().st_size)


# A password in an override, which no record of the run may show: digits never reads dataset.root.
PASSWORD = "s3cret-h41"
SECRET_ROOT = f"https://user:{PASSWORD}@example.org/data"


def decide_tiny(run_dir: Path | None, restores_here: bool = False, **settings) -> ResumePoint | None:
    """The pre-flight's resume decision for the digits' MnistNet with these trainer settings (no
    scheduler, no warmup, no model.weights)."""
    return resume.decide_resume(
        TrainerConfig(**settings),
        run_dir,
        model=lambda: MnistNet(1, 10, 8),
        scheduler={},
        warmup_epochs=0,
        weights=None,
        restores_here=restores_here,
        sweep_job=False,
    )
