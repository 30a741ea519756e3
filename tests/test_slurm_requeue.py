"""A real SLURM requeue: SIGUSR1 reaches a DDP job's ranks, rank 0 saves last.pt and requeues the
job, and SLURM's second run of slurm/train.sbatch continues in the same run dir to the weights of an
uninterrupted run."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import pytest

from config.setup import ROOT
from tests.runs import free_port, run_train, same_weights
from tests.test_slurm import _run, slurm_env  # noqa: F401  slurm_env: a cluster for this module alone

pytestmark = pytest.mark.slow

# Checkpoints every 2 steps: the first one says training is under way. 16 steps an epoch, 0.2 s
# each in SlowNet, leave ~3 s for the signal to land before the epoch ends.
TRAIN = ["trainer.accelerator=cpu", "trainer.epochs=2", "trainer.limit_train_batches=16", "trainer.limit_val_batches=2",
         "trainer.log_every_n_steps=2", "trainer.checkpoint_every_n_steps=2", "trainer.progress_bar=false"]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _job(job: str, env: dict[str, str]) -> dict[str, str]:
    shown = _run(["scontrol", "show", "job", "-o", job], env, ROOT).stdout
    return {key: re.search(rf"\b{key}=(\S*)", shown)[1] for key in ("JobState", "Restarts", "ExitCode")}


def _wait(what: str, ready: Callable[[], bool], out: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s:\n{out.read_text()[-3000:]}"
        time.sleep(0.25)  # each poll runs scontrol, and slurmctld answers it: 4 a second is enough


def test_sigusr1_requeues_the_job_and_the_second_run_finishes_it_exactly(slurm_env, tmp_path):
    reference = tmp_path / "whole"
    whole = run_train(reference, "strategy=ddp", "trainer.devices=2", *TRAIN)
    assert whole.returncode == 0, whole.stderr[-3000:]

    out, run_dirs = tmp_path / "slurm.out", tmp_path / "outputs"
    submit = ["sbatch", "--parsable", f"--output={out}", "--ntasks-per-node=2", "--cpus-per-task=1", "--gres=gpu:0",
              str(ROOT / "slurm" / "train.sbatch"), *TRAIN, "model._target_=tests.faults.SlowNet",
              # Each cluster numbers its jobs from 1, and the default port comes from the job id:
              # test_slurm.py's cluster may be running a job on the same port.
              f"launcher.master_port={free_port()}",
              f"hydra.run.dir='{run_dirs}/${{run_name:${{launcher.name}},clock}}'"]
    submitted = _run(submit, slurm_env, ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    run_dir = run_dirs / f"slurm-{job}.0"

    def training() -> bool:
        assert _job(job, slurm_env)["JobState"] not in ENDED, out.read_text()[-3000:]
        return (run_dir / "checkpoints" / "last.pt").exists()

    _wait("checkpoint", training, out)
    # To the job's steps (every rank), not its batch shell: what `#SBATCH --signal=USR1@90` does.
    assert _run(["scancel", "--signal=USR1", job], slurm_env, ROOT).returncode == 0
    _wait("requeue", lambda: _job(job, slurm_env)["JobState"] == "PENDING" and _job(job, slurm_env)["Restarts"] == "1", out)
    # The first attempt's step and batch script may still be ending ("waiting up to 32 seconds for job
    # step to finish"): start the second only once the node, which runs nothing else, is idle.
    _wait("node idle", lambda: _run(["sinfo", "-h", "-o", "%T"], slurm_env, ROOT).stdout.split() == ["idle"], out)
    # SLURM keeps a requeued job pending for ~2 minutes (Reason=BeginTime); an admin may start it
    # sooner, though not within the second the first run's credential was revoked in: slurmd refuses
    # that start ("Killing non-startable batch job: Job credential revoked", exit 1:0, run time 0).
    assert _run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"], slurm_env, ROOT).returncode == 0
    _wait("end", lambda: _job(job, slurm_env)["JobState"] in ENDED, out)

    shown = _run(["scontrol", "show", "job", job], slurm_env, ROOT).stdout
    assert _job(job, slurm_env) == {"JobState": "COMPLETED", "Restarts": "1", "ExitCode": "0:0"}, (
        f"{out.read_text()[-3000:]}\n{shown}")
    assert re.search(rf"JOB {job} ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE", out.read_text())  # while it ran
    assert [p.name for p in run_dirs.iterdir()] == [run_dir.name]  # the requeued run found the first one's dir
    starts = re.findall(r"from epoch (\d+)(?: batch (\d+) \((.*)\))?$", (run_dir / "train.log").read_text(), re.MULTILINE)
    assert len(starts) == 2 and starts[0] == ("1", "", ""), starts
    _, batch, resumed_from = starts[1]
    assert int(batch) > 1 and resumed_from == str(run_dir / "checkpoints" / "last.pt"), starts  # mid-epoch
    assert same_weights(run_dir, reference)
