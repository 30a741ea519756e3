"""Preemption units: the signal is noted, not fatal; SLURM requeues only on a requeue signal."""
from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from distributed.context import DistContext, make_context
from errors import Preempted
from tests.configs import job_config
from training.preemption import PreemptionWatch, requeue_or_explain, resume_command
from training.run import train

CPU = DistContext(0, 0, 1, 1, torch.device("cpu"), None)


def test_a_signal_is_noted_and_acted_on_only_at_a_check_step():
    watch = PreemptionWatch(CPU, [signal.SIGUSR1], every_n_steps=5)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the watch
        assert not watch.should_stop(step=3)
        assert watch.should_stop(step=5)
        assert watch.preempted().exit_code == 128 + signal.SIGUSR1
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stand-in `scontrol` on PATH that records its arguments."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    return calls


def test_a_signal_after_the_last_check_still_stops_the_job_once_it_is_saved(tmp_path):
    """SIGTERM at step 20 of a 23-step run that checks every 50: the run ends whole, then stops as
    preempted instead of going quiet (a sweep would start its next job, SLURM would not requeue)."""
    job = job_config(tmp_path, "trainer.epochs=1", "logger=none", "trainer.progress_bar=false",
                     "model._target_=tests.faults.SignalingNet", "+model.at_step=20")
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match="SIGTERM"):
        train(make_context(0, 0, 1, 1, "cpu", use_process_group=False), job)
    assert (tmp_path / "metrics.json").is_file()
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    assert signal.getsignal(signal.SIGTERM) is handler  # train()'s own is gone again


def test_sigusr1_under_slurm_requeues_the_job(scontrol, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "python train.py trainer.resume=auto")
    assert scontrol.read_text() == "requeue 4242\n"
    assert "requeued SLURM job 4242" in caplog.text


def test_an_array_task_is_requeued_by_its_own_id(scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "cmd")
    assert scontrol.read_text() == "requeue 4000_3\n"


def test_sigterm_such_as_scancel_never_requeues(scontrol, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGTERM), [signal.SIGUSR1], "python train.py trainer.resume=auto")
    assert not scontrol.exists()
    assert "resume with: python train.py trainer.resume=auto" in caplog.text


def test_outside_slurm_it_says_how_to_resume(scontrol, caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "the command")
    assert not scontrol.exists() and "resume with: the command" in caplog.text


def test_the_resume_command_keeps_the_overrides_and_pins_the_run_dir():
    command = resume_command(["strategy=ddp", "trainer.resume=/old.pt", "hydra.run.dir=x", "model.name=a b"], "/runs/r")
    assert command == "python train.py strategy=ddp 'model.name=a b' hydra.run.dir=/runs/r trainer.resume=auto"
