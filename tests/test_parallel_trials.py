"""hydra.sweeper.n_jobs=N on one machine: N trials at once, each in a process of its own on its own
share of the CPUs and GPUs (the share logic as a unit; the processes forked for real, on CPU)."""

from __future__ import annotations

import multiprocessing
import os
import re
import shlex
import signal

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from errors import Preempted
from hydra_plugins.optuna_study_sweeper import _processes, _study
from hydra_plugins.optuna_study_sweeper._processes import Share
from tests import train_server
from tests.test_hparams_search import SPACE, FakeLauncher, _open, _states
from tests.test_resume_preempt import Run

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def test_each_trial_in_flight_gets_a_share_of_its_own():
    gpus = [str(i) for i in range(8)]
    assert _processes.shares(4, range(8), gpus) == [
        Share((0, 1), ("0", "1")),
        Share((2, 3), ("2", "3")),
        Share((4, 5), ("4", "5")),
        Share((6, 7), ("6", "7")),
    ]
    # CPUs that do not divide evenly: the first shares one more. GPUs: as many for every trial, the
    # rest idle (a search's trials ask for the same devices).
    assert _processes.shares(2, [0, 1, 2], ["0", "1", "2"]) == [Share((0, 1), ("0",)), Share((2,), ("1",))]
    # Fewer than trials: they take turns, each trial one.
    assert _processes.shares(3, [0, 1], ["a", "b"]) == [Share((0,), ("a",)), Share((1,), ("b",)), Share((0,), ("a",))]
    assert _processes.shares(2, [3, 1], []) == [Share((1,), None), Share((3,), None)]  # no GPU: none hidden


def test_the_gpus_are_those_cuda_visible_devices_names_else_those_the_driver_counts():
    assert _processes.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-6f1a,GPU-88c2"}, 8) == ["GPU-6f1a", "GPU-88c2"]
    assert _processes.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 8) == []
    assert _processes.visible_gpus({}, 2) == ["0", "1"]


def _job(value: float, num: int, tmp_path) -> list[JobReturn]:
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / str(num))}}})
    return [JobReturn(overrides=[], hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED, _return_value=value)]


def test_trials_run_at_once_each_in_a_process_of_its_own_on_its_share(tmp_path):
    study, storage = _open(tmp_path)
    context = multiprocessing.get_context("fork")
    together, seen = context.Barrier(2, timeout=60), context.SimpleQueue()
    made = [Share((cpu,), (f"gpu{i}",)) for i, cpu in enumerate(sorted(os.sched_getaffinity(0))[:1] * 2)]

    def launch(batch, first):
        together.wait()  # both trials' processes are up before either ends
        seen.put((os.getpid(), tuple(os.sched_getaffinity(0)), os.environ["CUDA_VISIBLE_DEVICES"]))
        return _job(0.5, first, tmp_path)

    processes = _processes.TrialProcesses(launch, made)
    _study.run(study, SPACE, [], processes, tmp_path, n_trials=2, n_jobs=2, heartbeat=storage, parallel=True)
    assert _states(study) == ["COMPLETE", "COMPLETE"]
    ran = [seen.get() for _ in range(2)]
    assert os.getpid() not in {pid for pid, _, _ in ran} and len({pid for pid, _, _ in ran}) == 2
    assert sorted((cpus, gpus) for _, cpus, gpus in ran) == [(made[0].cpus, "gpu0"), (made[1].cpus, "gpu1")]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ or os.environ["CUDA_VISIBLE_DEVICES"] not in ("gpu0", "gpu1")


def test_a_trial_whose_process_dies_fails_alone_and_ctrl_c_in_one_queues_it_again(tmp_path, caplog):
    study, storage = _open(tmp_path)
    finish = FakeLauncher(tmp_path)

    def launch(batch, first):
        if first == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's way
        return finish(batch, first)

    made = _processes.shares(2, sorted(os.sched_getaffinity(0)), [])
    _study.run(
        study,
        SPACE,
        [],
        _processes.TrialProcesses(launch, made),
        tmp_path,
        n_trials=2,
        n_jobs=2,
        heartbeat=storage,
        max_failure_rate=0.5,
        parallel=True,
    )
    assert _states(study) == ["COMPLETE", "FAIL", "COMPLETE"]
    assert re.search(r"trial 1 failed: RuntimeError: the trial's process \(pid \d+\) killed by SIGKILL", caplog.text)

    def interrupted(batch, first):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _study.run(
            study,
            SPACE,
            [],
            _processes.TrialProcesses(interrupted, made),
            tmp_path,
            n_trials=3,
            n_jobs=2,
            heartbeat=storage,
            parallel=True,
        )
    assert _states(study)[3:] == ["FAIL", "WAITING"]  # queued again, as a Ctrl-C'd trial in this process is


@pytest.mark.slow
def test_n_jobs_runs_train_pys_trials_at_once(tmp_path):
    sweep, meet = tmp_path / "search", tmp_path / "meet"
    meet.mkdir()
    done = train_server.run(
        [
            "hparams_search=digits",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "debug=fdr",
            "trainer.progress_bar=false",
            # Each trial waits at its start for the other: one after another, the first fails alone.
            "+callbacks.together._target_=tests.faults.Together",
            f"+callbacks.together.meet_dir={meet}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 trials at once, each in a process of its own: CPUs " in done.stdout
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert _states(study) == ["COMPLETE", "COMPLETE"]
    assert len(list(meet.iterdir())) == 2  # a process each


def test_a_process_that_cannot_send_its_outcome_says_so(tmp_path):
    def launch(batch, first):
        return [lambda: None]  # not picklable

    with pytest.raises(RuntimeError, match="outcome could not be sent back: "):
        _processes.TrialProcesses(launch, [Share(tuple(sorted(os.sched_getaffinity(0))), None)])([[]], 0)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGUSR1])
def test_a_signal_to_trials_at_once_saves_them_and_ends_the_search_in_one_line_that_continues_it(tmp_path, signum):
    """The terminal's SIGINT (or SLURM's USR1, to a job step's processes) to the search and its trials'
    processes: each trial saves last.pt, the search exits 128 + the signal saying once how to continue
    it, and that command ends the search from there."""
    sweep, hold = tmp_path / "search", tmp_path / "hold"
    args = ["hparams_search=digits", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2"]
    # Each trial waits in its second epoch (5 training and 2 validation forwards an epoch) until the
    # signal has landed: one that started first cannot end while the other is still starting.
    hold.touch()
    args += ["debug=limit", "model._target_=tests.faults.SlowNet", "+model.delay_s=0", f"+model.hold={hold}"]
    args += ["+model.hold_from=10"]
    search = Run(sweep, *args)  # a session of its own, as a terminal's job
    try:
        search.wait_for(lambda: len(list(sweep.glob("*/checkpoints/last.pt"))) == 2)  # both past their first epoch
        os.killpg(search.proc.pid, signum)
    finally:
        hold.unlink()  # else trials left by a failure would wait forever
    assert search.finish() == 128 + signum, search.output()
    output = search.output()
    assert "Traceback" not in output and search.leftovers() == [], output
    (command,) = re.findall(rf"{re.escape(str(Preempted(signum)))}: last\.pt is saved; resume with: (.*)", output)
    assert len(list(sweep.glob("*/metrics.json"))) == 0  # stopped while they trained

    again = train_server.run(shlex.split(command)[2:])  # less `python train.py`
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert _states(study) == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    for retry in ("2_*", "3_*"):
        (log,) = sweep.glob(f"{retry}/train.log")
        assert re.search(r"from epoch [23] batch \d+ \(.*/checkpoints/last\.pt\)$", log.read_text(), re.MULTILINE)
