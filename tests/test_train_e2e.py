"""`python train.py` as people run it: the default job, DDP on CPU, resume."""

from __future__ import annotations

import json
import re
import socket

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.runs import run_train

pytestmark = pytest.mark.slow

SCALARS = {
    "train/loss",
    "train/acc",
    "train/loss_window",
    "train/acc_window",
    "val/loss",
    "val/acc",
    "val/acc5",
    "val/best_acc",
    "lr",
    "throughput/samples_per_s",
    "throughput/median_samples_per_s",
    "time/train_s",
    "time/data_s",
}  # the README's table


def _metrics(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())


def _weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_default_job_learns_digits(run_dir):
    result = run_train(run_dir, cold=True)  # the README's first command, from a cold interpreter
    assert result.returncode == 0, result.stderr
    metrics = _metrics(run_dir)
    assert metrics["val_acc"] >= 0.95, metrics
    assert (metrics["model"], metrics["dataset"], metrics["strategy"], metrics["world_size"]) == (
        "mnist_net",
        "digits",
        "single",
        1,
    )
    assert "epoch 15/15" in (run_dir / "train.log").read_text()
    said = [line.split("run dir: ")[1] for line in result.stdout.splitlines() if "[train][INFO] - run dir: " in line]
    assert said == [str(run_dir), f"{run_dir} (the run has ended)"]  # on the console, as it starts and ends
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert SCALARS <= set(events.Tags()["scalars"])
    assert events.Scalars("val/acc")[-1].value == pytest.approx(metrics["val_acc"])
    # The HParams tab's samples/s is metrics.json's (and so bench.report's).
    assert events.Scalars("throughput/median_samples_per_s")[-1].value == pytest.approx(metrics["train_samples_per_s"])
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert best["best"] == pytest.approx(metrics["best_val_acc"])


def test_debug_overfit_learns_its_three_batches_by_heart(run_dir):
    result = run_train(run_dir, "debug=overfit")
    assert result.returncode == 0, result.stderr
    metrics = _metrics(run_dir)
    assert (metrics["epochs"], metrics["steps"]) == (30, 90)  # the same 3 batches each epoch
    assert metrics["val_acc"] == 1.0 and metrics["val_loss"] < 0.05, metrics  # validated on those batches


def test_ddp_on_cpu_writes_from_rank_zero_only(tmp_path):
    outputs = tmp_path / "outputs"
    result = run_train(
        outputs / "${now:%H-%M-%S-%f}",  # each process that made its own dir would show here
        "strategy=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.epochs=2",
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = outputs.iterdir()
    metrics = _metrics(run_dir)
    assert (metrics["strategy"], metrics["world_size"]) == ("ddp", 2)
    assert metrics["val_acc"] > 0.5
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert len(list((run_dir / "tb").iterdir())) == 1
    assert not any(key.startswith("module.") for key in _weights(run_dir / "checkpoints" / "last.pt"))
    log = (run_dir / "train.log").read_text()
    assert log.count("epoch 2/2") == 1 and "[rank 1]" not in log
    # Each rank's CPUs, threads (OMP_NUM_THREADS=1 in the suite) and loader workers (none: digits is in memory)
    rank = r"cpu \(CPUs [\d,-]+, 1 threads, 0 loader workers\)"
    assert re.search(rf"ranks by host: {re.escape(socket.gethostname())}: 0 {rank}, 1 {rank}\n", log), log


def test_resume_continues_as_if_never_stopped(tmp_path):
    # 4 steps of batch 64 an epoch (of digits' 23), so max_steps=8 stops after epoch 2.
    whole, first, rest = tmp_path / "whole", tmp_path / "first", tmp_path / "rest"
    job = ("trainer.epochs=3", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2")
    assert run_train(whole, *job).returncode == 0
    assert run_train(first, *job, "trainer.max_steps=8").returncode == 0
    stopped = torch.load(first / "checkpoints" / "last.pt", weights_only=True)
    assert (stopped["epoch"], stopped["step"]) == (2, 8)
    result = run_train(rest, *job, f"trainer.resume={first / 'checkpoints' / 'last.pt'}")
    assert result.returncode == 0, result.stderr
    assert "from epoch 3" in (rest / "train.log").read_text()
    resumed = torch.load(rest / "checkpoints" / "last.pt", weights_only=True)
    uninterrupted = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    assert (resumed["epoch"], resumed["step"]) == (3, 12)
    for key, value in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][key], value), key
    assert resumed["scheduler"] == uninterrupted["scheduler"]
    assert _metrics(rest)["val_acc"] == _metrics(whole)["val_acc"]
