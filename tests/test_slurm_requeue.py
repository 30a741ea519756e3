"""Requeues on the two-node rig (slurm/rig.sh, brought up by test_slurm.py's fixture, a rig for this
module alone): the template's job sent USR1 over and over, and a submitit job sent USR2. Each is
requeued by rank 0 and continues from its last.pt, to the weights of an unbroken run."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from config.setup import ROOT
from tests import test_slurm
from tests.runs import run_train, same_weights
from tests.test_slurm import ASK_SLURM_S, ENDED, LOOK_S, SLOW, TINY, _wait

rig = test_slurm.rig  # a rig of this module's own (the fixture is module-scoped)

pytestmark = pytest.mark.slow

# The requeue loop's length: the suite runs 2; `RIG_REQUEUES=10 pytest tests/test_slurm_requeue.py -k
# requeues_a_two_node` is the rehearsal BENCHMARKS.md records. Each requeued run trains a few steps
# before the next signal lands, or, when SLURM loses the signal and it is sent again 10 s later
# (_signal_until_the_ranks_stop), three epochs: the run is long enough for that at every requeue
# (it once stopped 2 steps from its end, and the next run ended before its signal came).
REQUEUES = int(os.environ.get("RIG_REQUEUES", "2"))
LONG = [*SLOW, f"trainer.epochs={3 * REQUEUES + 2}"]


def _signal_until_the_ranks_stop(rig, job: str, name: str, log: Path, stops: int) -> None:
    """`scancel --signal=<name>` to the job's steps until rank 0 has logged its `stops`-th stop in
    `log`. In a loaded suite SLURM twice took the signal (slurmctld logged the RPC, a second into
    the run) and no rank acted on it, as when the ranks took it as a check's all-reduce returned and
    the reduced flags overwrote it (fixed since; tests/test_resume_preempt.py holds train.py to it).
    The ranks act on one within a step or two (0.2 s each), so 10 s of silence means it was lost
    some other way, and it is sent again: this file tests the requeue, not the delivery."""
    for _ in range(3):
        assert rig.on("a", ["scancel", f"--signal={name}", job]).returncode == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if log.read_text().count(f"SIG{name}: every rank stops") >= stops:
                return
            time.sleep(LOOK_S)
    raise AssertionError(f"no rank saw SIG{name} in 3 tries:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def slow_whole(tmp_path_factory) -> Path:
    """The LONG run whole by the spawn launcher, 2 ranks: what every preempted and resumed run of
    SlowNet ends as (the same math, without its sleep)."""
    run_dir = tmp_path_factory.mktemp("slow_whole") / "run"
    result = run_train(run_dir, *LONG, "trainer.devices=2")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_sigusr1_requeues_a_two_node_job_each_time_and_it_resumes_exactly(rig, slow_whole):
    """`#SBATCH --signal=USR1@90` over and over: each time rank 0 saves and requeues the job before
    any rank leaves with a bad exit (which would make srun kill rank 0 first), and each requeued run
    continues from the last one's last.pt, to the weights of an unbroken run."""
    runs, out = rig.runs / "requeue", rig.shared / "requeue.out"
    submit = [
        "sbatch",
        "--parsable",
        f"--output={rig.runs}/requeue.out",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--gres=gpu:0",
        str(ROOT / "slurm" / "train.sbatch"),
        *LONG,
        *TINY[1:],
        "model._target_=tests.faults.SlowNet",
        "trainer.preempt_grace_s=1",  # a stop within ~2 steps
        f"hydra.run.dir='{runs}/${{run_name:${{launcher.name}},clock}}'",
    ]
    submitted = rig.on("a", submit)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    run_dir = rig.shared / "requeue" / f"slurm-{job}.0"
    last = run_dir / "checkpoints" / "last.pt"
    steps = []
    for restarts in range(1, REQUEUES + 1):

        def progressed() -> bool:
            assert rig.job(job)["JobState"] not in ENDED, out.read_text()[-3000:]
            try:  # a checkpoint of this run's own, past the one it resumed from
                return last.exists() and torch.load(last, weights_only=True)["step"] > max(steps, default=0)
            except (RuntimeError, EOFError):  # being replaced as it was read
                return False

        _wait("checkpoint", progressed, out, every=ASK_SLURM_S)
        # To the job's steps (every rank), not its batch shell: what `#SBATCH --signal=USR1@90` does.
        _signal_until_the_ranks_stop(rig, job, "USR1", out, stops=restarts)
        _wait(f"requeue {restarts}", lambda restarts=restarts: rig.requeued(job, restarts), out, every=ASK_SLURM_S)
        steps.append(torch.load(last, weights_only=True)["step"])
        # The attempt's steps may still be ending: start the next only once the nodes are idle.
        _wait("nodes idle", rig.idle, out, every=ASK_SLURM_S)
        # SLURM holds a requeued job ~2 minutes (BeginTime); an admin may start it sooner, though not
        # within the second the last run's credential was revoked in (slurmd refuses that start).
        assert rig.on("a", ["scontrol", "update", f"JobId={job}", "StartTime=now+2"]).returncode == 0
    _wait("end", lambda: rig.job(job)["JobState"] in ENDED, out, timeout=240, every=ASK_SLURM_S)
    assert rig.job(job) == {"JobState": "COMPLETED", "Restarts": str(REQUEUES), "ExitCode": "0:0"}, out.read_text()[
        -3000:
    ]
    assert len(re.findall(rf"JOB {job} ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE", out.read_text())) == REQUEUES
    assert [p.name for p in (rig.shared / "requeue").iterdir()] == [run_dir.name]  # every run found the first one's dir
    starts = re.findall(
        r"from epoch (\d+)(?: batch (\d+) \((.*)\))?$", (run_dir / "train.log").read_text(), re.MULTILINE
    )
    assert len(starts) == REQUEUES + 1 and starts[0] == ("1", "", ""), starts
    assert all(
        resumed == str(rig.runs / "requeue" / run_dir.name / "checkpoints" / "last.pt") for *_, resumed in starts[1:]
    )
    assert same_weights(run_dir, slow_whole)


def test_a_preempted_submitit_job_requeues_and_resumes_exactly(rig, slow_whole):
    """hydra/launcher=submitit_slurm: submitit asks SLURM for USR2 before the time limit, and a
    preemption sends it too. The ranks save last.pt, rank 0 requeues the job, and submitit's second
    run of the same sweep job continues from it (trainer.resume=null is auto in a restarted job)."""
    sweep, out = rig.runs / "submitit", rig.shared / "submitit.out"
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.nodes=2",
        "hydra.launcher.cpus_per_task=2",
        f"hydra.sweep.dir={sweep}",
        *LONG,
        *TINY[1:],
        "model._target_=tests.faults.SlowNet",
    ]
    sweeping = rig.start("a", cmd, out)
    try:
        _wait("checkpoint", lambda: any((rig.shared / "submitit").glob("0_*/checkpoints/last.pt")), out)
        job = rig.on("a", ["squeue", "-h", "-o", "%i"]).stdout.split()[0]
        (log,) = (rig.shared / "submitit").glob("0_*/train.log")
        _signal_until_the_ranks_stop(rig, job, "USR2", log, stops=1)
        _wait("requeue", lambda: rig.requeued(job, 1), out, every=ASK_SLURM_S)
        _wait("nodes idle", rig.idle, out, every=ASK_SLURM_S)
        assert rig.on("a", ["scontrol", "update", f"JobId={job}", "StartTime=now+2"]).returncode == 0
        assert rig.ended(sweeping, out, timeout=240) == 0, out.read_text()[-3000:]
    finally:
        sweeping.kill()
    (run_dir,) = (rig.shared / "submitit").glob("0_*")  # named by its overrides
    starts = re.findall(
        r"from epoch (\d+)(?: batch (\d+) \((.*)\))?$", (run_dir / "train.log").read_text(), re.MULTILINE
    )
    assert len(starts) == 2 and starts[1][2] == str(sweep / run_dir.name / "checkpoints" / "last.pt"), starts
    assert "SIGUSR2: every rank stops after step" in (run_dir / "train.log").read_text()
    assert same_weights(run_dir, slow_whole)
