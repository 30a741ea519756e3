"""hparams_search=...: an Optuna study in a database that a killed search continues."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import sqlite3
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

from config.setup import CONF_DIR, compose, register
from errors import Preempted
from hydra_plugins.optuna_study_sweeper import _study
from hydra_plugins.optuna_study_sweeper.optuna_study_sweeper import ExitIsFailure
from tests import train_server
from tests.test_resume_preempt import Run
from training.validation import final_figures

SAMPLER = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 0})
SPACE = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "batch": CategoricalDistribution([16, 32, 64])}
COMMAND = {"overrides": ["trainer.epochs=1"], "search_space": {k: repr(d) for k, d in SPACE.items()}}


class FakeLauncher:
    """Hydra's launcher as the sweeper sees it: each job returns lr x 10 (or raises)."""

    def __init__(
        self,
        sweep_dir: Path,
        fail: bool = False,
        interrupt: int | None = None,
        value: float | None = None,
        lost: int | None = None,
        together: int = 1,
    ) -> None:
        """interrupt: Ctrl-C in job N; lost: job N dies unseen (the launcher
        raises, as submitit does for a SLURM job killed for memory); together: jobs 0 to N - 1 must all
        be in flight at once before any returns."""
        self.sweep_dir, self.fail, self.interrupt, self.value, self.lost = sweep_dir, fail, interrupt, value, lost
        self.together = threading.Barrier(together, timeout=30) if together > 1 else None
        self.calls: list[tuple[list[list[str]], int]] = []

    def __call__(self, batch: list[list[str]], first: int) -> list[JobReturn]:
        self.calls.append((batch, first))
        if self.together is not None and first < self.together.parties:
            self.together.wait()
        if first == self.interrupt:
            raise KeyboardInterrupt
        if first == self.lost:
            raise RuntimeError(f"Job {first} (task: 0) with path .submitit/{first}_0 has state OUT_OF_MEMORY")
        return [self._job(overrides, first + i) for i, overrides in enumerate(batch)]

    def _job(self, overrides: list[str], num: int) -> JobReturn:
        lr = float(dict(o.split("=", 1) for o in overrides)["lr"])
        hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(self.sweep_dir / str(num))}}})
        if self.fail:
            return JobReturn(
                overrides=overrides,
                hydra_cfg=hydra_cfg,
                status=JobStatus.FAILED,
                _return_value=RuntimeError("diverged"),
            )
        value = lr * 10 if self.value is None else self.value
        return JobReturn(overrides=overrides, hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED, _return_value=value)


# The tests ask for trials by hand, as another sweeper would; Optuna warns that heartbeats expect optimize().
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def _open(tmp_path: Path, command: dict = COMMAND, heartbeat_interval: int = 10, grace_period: int | None = None):
    return _study.open_study(
        "s", f"sqlite:///{tmp_path / 'optuna.db'}", "maximize", SAMPLER, command, heartbeat_interval, grace_period
    )


def _states(study: optuna.Study) -> list[str]:
    return [t.state.name for t in study.get_trials(deepcopy=False)]


def test_search_space_reads_hydras_sweep_syntax():
    space, fixed = _study.search_space(
        [
            "optimizer.lr=tag(log, interval(1e-4, 1e-1))",
            "optimizer.weight_decay=interval(0.0, 0.1)",
            "trainer.batch_size=choice(16, 32, 64)",
            "model=simple_cnn,mnist_net",
            "trainer.epochs=range(1, 10, 3)",
            "trainer.seed=interval(0, 9)",
            "trainer.limit_train_batches=5",
            "+hparams_search=digits",
            "optimizer.weight_decay=0.01",  # later on the command line: fixed, out of the space
            "trainer.max_steps=tag(log, int, interval(16, 128))",
            "trainer.log_every_n_steps=range(10, 0, -2)",
        ]
    )
    assert space == {
        "optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "trainer.batch_size": CategoricalDistribution([16, 32, 64]),
        "model": CategoricalDistribution(["simple_cnn", "mnist_net"]),
        "trainer.epochs": IntDistribution(1, 7, step=3),  # Hydra's range excludes its stop: 1, 4, 7
        "trainer.seed": FloatDistribution(0.0, 9.0),  # Hydra's interval is a float interval
        "trainer.max_steps": IntDistribution(16, 128, log=True),  # unless tagged int
        "trainer.log_every_n_steps": IntDistribution(2, 10, step=2),  # 10, 8, ..., 2
    }
    assert fixed == ["trainer.limit_train_batches=5", "+hparams_search=digits", "optimizer.weight_decay=0.01"]


def test_a_study_is_topped_up_to_n_trials_in_batches_of_n_jobs(tmp_path):
    study, storage = _open(tmp_path)
    launch = FakeLauncher(tmp_path)
    _study.run(study, SPACE, ["trainer.epochs=1"], launch, tmp_path, n_trials=3, n_jobs=2, heartbeat=storage)
    # A launch per trial (one job's failure is its own), its job numbered by the trial.
    assert [(len(batch), first) for batch, first in launch.calls] == [(1, 0), (1, 1), (1, 2)]
    assert all(o[0] == "trainer.epochs=1" for batch, _ in launch.calls for o in batch)
    assert _states(study) == ["COMPLETE"] * 3
    assert [t.user_attrs["job"] for t in study.get_trials()] == ["0", "1", "2"]

    study, storage = _open(tmp_path)  # the same command again: nothing left to do
    _study.run(study, SPACE, ["trainer.epochs=1"], launch, tmp_path, n_trials=3, n_jobs=2, heartbeat=storage)
    assert len(launch.calls) == 3
    _study.run(study, SPACE, ["trainer.epochs=1"], launch, tmp_path, n_trials=4, n_jobs=2, heartbeat=storage)
    assert [first for _, first in launch.calls] == [0, 1, 2, 3] and _states(study) == ["COMPLETE"] * 4


def test_a_trial_left_running_by_a_killed_sweep_runs_again_with_its_parameters(tmp_path):
    study, storage = _open(tmp_path, heartbeat_interval=1, grace_period=1)
    killed = study.ask(SPACE)
    storage.record_heartbeat(killed._trial_id)  # its sweeper beat for it, then died
    time.sleep(2.1)
    launch = FakeLauncher(tmp_path)
    study, storage = _open(tmp_path, heartbeat_interval=1, grace_period=1)
    _study.run(study, SPACE, [], launch, tmp_path, n_trials=2, n_jobs=1, heartbeat=storage, poll_s=0.1)
    trials = study.get_trials()
    assert _states(study) == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].params == killed.params and trials[1].system_attrs["failed_trial"] == killed.number


def test_a_trial_whose_sweeper_died_before_its_first_heartbeat_runs_again(tmp_path):
    # A grace of 2 s: the young trial must stay fresh while the study is opened again, however loaded
    # the machine; the killed one is stale after it.
    study, storage = _open(tmp_path, heartbeat_interval=1, grace_period=2)
    killed = study.ask(SPACE)  # killed here: no heartbeat was ever recorded for it
    time.sleep(2.1)
    young = study.ask(SPACE)  # another sweeper's, asked a moment ago, its first beat still to come
    launch = FakeLauncher(tmp_path)
    study, storage = _open(tmp_path, heartbeat_interval=1, grace_period=2)
    _study._fail_stale(study)
    assert _states(study) == ["FAIL", "RUNNING", "WAITING"]
    retry = study.get_trials()[2]
    assert retry.params == killed.params and retry.system_attrs["failed_trial"] == killed.number
    study.tell(young, 0.5)
    _study.run(study, SPACE, [], launch, tmp_path, n_trials=2, n_jobs=1, heartbeat=storage, poll_s=0.1)
    assert _states(study) == ["FAIL", "COMPLETE", "COMPLETE"] and study.get_trials()[2].params == killed.params


def test_a_live_trial_of_another_sweeper_is_waited_for_not_repeated(tmp_path, caplog):
    study, storage = _open(tmp_path, heartbeat_interval=1, grace_period=60)
    other = study.ask(SPACE)
    storage.record_heartbeat(other._trial_id)  # alive throughout, however slow this machine
    threading.Timer(1.5, study.tell, (other, 0.5)).start()  # the other sweeper's job ends while we wait
    launch = FakeLauncher(tmp_path)
    with caplog.at_level(logging.INFO):
        _study.run(study, SPACE, [], launch, tmp_path, n_trials=1, n_jobs=2, heartbeat=storage, poll_s=0.1)
    assert launch.calls == [] and _states(study) == ["COMPLETE"]
    said = [r.getMessage() for r in caplog.records if "RUNNING elsewhere" in r.getMessage()]
    assert said == [
        "1 trial(s) RUNNING elsewhere: another sweeper's, or left by a killed one (rerun once it misses its heartbeats)"
    ]  # once, not at every poll


def test_a_trial_elsewhere_after_a_batch_is_said_again(tmp_path, caplog, monkeypatch):
    """Our batch ends, another sweeper's trial is running: the wait is said, as before any batch."""
    study, storage = _open(tmp_path, heartbeat_interval=1)
    elsewhere = []

    def other_sweeper_asks():  # after our first batch
        if not elsewhere:
            elsewhere.append(study.ask(SPACE))
            storage.record_heartbeat(elsewhere[0]._trial_id)

    monkeypatch.setattr(_study.time, "sleep", lambda _: study.tell(elsewhere[0], 0.5))  # it ends while we wait
    with caplog.at_level(logging.INFO):
        _study.run(
            study,
            SPACE,
            [],
            FakeLauncher(tmp_path),
            tmp_path,
            n_trials=2,
            n_jobs=1,
            heartbeat=storage,
            after_batch=other_sweeper_asks,
        )
    assert _states(study) == ["COMPLETE", "COMPLETE"]
    assert [r.getMessage()[:35] for r in caplog.records if "RUNNING elsewhere" in r.getMessage()] == [
        "1 trial(s) RUNNING elsewhere: anoth"
    ]


def test_a_warning_of_ask_other_than_optunas_heartbeat_one_reaches_the_user(tmp_path, monkeypatch):
    study, storage = _open(tmp_path)
    ask = study.ask

    def warning_ask(*args, **kwargs):
        warnings.warn("the sampler's own warning", stacklevel=2)
        return ask(*args, **kwargs)

    monkeypatch.setattr(study, "ask", warning_ask)
    with pytest.warns(UserWarning, match="the sampler's own warning"):
        _study.run(study, SPACE, [], FakeLauncher(tmp_path), tmp_path, n_trials=1, n_jobs=1, heartbeat=storage)


def test_a_resumed_study_does_not_propose_the_first_runs_parameters_again(tmp_path):
    study, storage = _open(tmp_path)
    _study.run(study, SPACE, [], FakeLauncher(tmp_path), tmp_path, n_trials=2, n_jobs=1, heartbeat=storage)
    study, storage = _open(tmp_path)  # same sampler seed: reseeded by the trials so far
    _study.run(study, SPACE, [], FakeLauncher(tmp_path), tmp_path, n_trials=4, n_jobs=1, heartbeat=storage)
    lrs = [t.params["lr"] for t in study.get_trials()]
    assert len(set(lrs)) == 4


def test_a_study_refuses_to_continue_with_another_search(tmp_path):
    _open(tmp_path)
    with pytest.raises(_study.SearchError, match="ran with trainer.epochs=1, this command has trainer.epochs=2"):
        _open(tmp_path, {**COMMAND, "overrides": ["trainer.epochs=2"]})


def test_direction_must_suit_the_metric():
    _study.check_direction("best_val_acc", "maximize")
    _study.check_direction("wall_s", "minimize")
    with pytest.raises(_study.SearchError, match="maximize it"):
        _study.check_direction("best_val_acc", "minimize")
    with pytest.raises(_study.SearchError, match="minimize it"):
        _study.check_direction("val_loss", "maximize")
    with pytest.raises(_study.SearchError, match="minimize it"):
        _study.check_direction("wall_s", "maximize")
    for direction in ("minimize", "maximize"):  # a figure whose name says neither way
        _study.check_direction("peak_memory_mb", direction)


def test_a_failed_trial_stops_the_search_and_an_interrupted_one_is_queued_again(tmp_path):
    study, storage = _open(tmp_path)
    with pytest.raises(_study.SearchError, match="RuntimeError: diverged"):
        _study.run(
            study, SPACE, [], FakeLauncher(tmp_path, fail=True), tmp_path, n_trials=2, n_jobs=1, heartbeat=storage
        )
    assert _states(study) == ["FAIL"]
    with pytest.raises(KeyboardInterrupt):
        _study.run(
            study, SPACE, [], FakeLauncher(tmp_path, interrupt=1), tmp_path, n_trials=2, n_jobs=1, heartbeat=storage
        )
    interrupted, queued = study.get_trials()[1:]
    assert (interrupted.state, queued.state) == (TrialState.FAIL, TrialState.WAITING)
    assert queued.params == interrupted.params and queued.system_attrs["failed_trial"] == interrupted.number


def test_trials_launched_together_run_at_once_and_a_lost_job_fails_its_trial_alone(tmp_path):
    study, storage = _open(tmp_path)
    launch = FakeLauncher(tmp_path, lost=1, together=3)  # the first 3 wait until all 3 are in flight
    _study.run(
        study, SPACE, [], launch, tmp_path, n_trials=3, n_jobs=3, heartbeat=storage, max_failure_rate=0.5, parallel=True
    )
    assert _states(study) == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # the lost one's place taken by a 4th
    assert sorted(first for _, first in launch.calls) == [0, 1, 2, 3]
    more = r"1 of 1 trial\(s\) launched together failed, more than hydra.sweeper.max_failure_rate=0.0 allows; "
    with pytest.raises(
        _study.SearchError, match=more + r"the first \(trial 4\) with RuntimeError: Job 4 .* OUT_OF_MEMORY"
    ):
        _study.run(study, SPACE, [], FakeLauncher(tmp_path, lost=4), tmp_path, n_trials=4, n_jobs=1, heartbeat=storage)


def test_ctrl_c_keeps_the_trials_that_ended_before_it(tmp_path):
    study, storage = _open(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _study.run(
            study, SPACE, [], FakeLauncher(tmp_path, interrupt=1), tmp_path, n_trials=2, n_jobs=2, heartbeat=storage
        )
    assert _states(study) == ["COMPLETE", "FAIL", "WAITING"]  # trial 1 queued again; trial 0's value kept


def test_ctrl_c_while_trials_run_elsewhere_ends_the_search_at_once(tmp_path, monkeypatch):
    # A parallel launcher's jobs (SLURM's) run on: the search stops waiting for them, keeps what ended.
    study, storage = _open(tmp_path)
    released, first_told = threading.Event(), threading.Event()
    pressed: list[float] = []
    launch = FakeLauncher(tmp_path)
    finish = launch.__call__

    def slow_second(batch, first):
        if first == 1:
            released.wait(30)
        return finish(batch, first)

    tell = _study._tell

    def told(study, trial, ret, sweep_dir):
        error = tell(study, trial, ret, sweep_dir)
        if trial.number == 0:
            first_told.set()
        return error

    monkeypatch.setattr(_study, "_tell", told)

    def ctrl_c(signum, frame):
        raise KeyboardInterrupt

    def press_ctrl_c():
        # Once trial 0 has ended, however slow this machine: the search then waits on trial 1 alone.
        if first_told.wait(30):
            time.sleep(0.5)
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR2)

    # A real signal, as Ctrl-C is: it wakes the main thread where it waits for the trials.
    previous = signal.signal(signal.SIGUSR2, ctrl_c)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _study.run(study, SPACE, [], slow_second, tmp_path, n_trials=2, n_jobs=2, heartbeat=storage, parallel=True)
        assert time.monotonic() - pressed[0] < 10  # not the 30 s trial 1 still runs
        assert _states(study) == ["COMPLETE", "FAIL", "WAITING"]
    finally:
        released.set()
        signal.signal(signal.SIGUSR2, previous)


def test_a_search_whose_trials_all_fail_ends_even_when_failures_are_tolerated(tmp_path):
    study, storage = _open(tmp_path)
    with pytest.raises(_study.SearchError) as error:
        _study.run(
            study,
            SPACE,
            [],
            FakeLauncher(tmp_path, fail=True),
            tmp_path,
            n_trials=3,
            n_jobs=2,
            heartbeat=storage,
            max_failure_rate=1.0,
        )
    assert _states(study) == ["FAIL"] * 4  # two batches of two: 4 failures >= n_trials
    # Why it stopped, and the search's first failure (not the last batch's)
    assert re.match(
        r"4 trials of this search failed, as many as hydra.sweeper.n_trials=3 \(a failed trial counts for none\); "
        r"the first \(trial 0\) with RuntimeError: diverged",
        str(error.value),
    ), error.value


def test_a_trial_that_returns_nan_is_a_failure_the_search_counts(tmp_path):
    """Optuna fails a NaN itself; unseen, every failed trial was asked again, for ever."""
    study, storage = _open(tmp_path)
    with pytest.raises(_study.SearchError, match="ValueError: the job returned nan"):
        _study.run(
            study,
            SPACE,
            [],
            FakeLauncher(tmp_path, value=float("nan")),
            tmp_path,
            n_trials=2,
            n_jobs=1,
            heartbeat=storage,
            max_failure_rate=1.0,
        )
    assert _states(study) == ["FAIL"] * 2


def test_a_job_that_exits_with_an_error_fails_its_trial_and_a_preempted_one_ends_the_search():
    """train.py's sys.exit(1 or 2) would otherwise leave the whole search past max_failure_rate."""

    def job(code):
        return lambda cfg: sys.exit(code) if code is not None else 0.5

    assert ExitIsFailure(job(None))(None) == 0.5
    for code in (1, 2):
        with pytest.raises(RuntimeError, match=f"exited with status {code}"):
            ExitIsFailure(job(code))(None)
    with pytest.raises(SystemExit):
        ExitIsFailure(job(143))(None)  # SIGTERM: the search stops, and its rerun queues the trial again


def test_results_name_the_best_trial_and_list_every_trial(tmp_path):
    study, storage = _open(tmp_path)
    _study.run(study, SPACE, [], FakeLauncher(tmp_path), tmp_path, n_trials=3, n_jobs=3, heartbeat=storage)
    summary = _study.results(study, "best_val_acc", 3)
    best = max(study.get_trials(), key=lambda t: t.value)
    assert (summary["best_trial"], summary["best_value"]) == (best.number, best.value)
    assert summary["best_params"] == best.params
    assert [(t["number"], t["job"]) for t in summary["trials"]] == [(0, "0"), (1, "1"), (2, "2")]
    _study.write_results(tmp_path / _study.RESULTS, summary)
    assert yaml.safe_load((tmp_path / _study.RESULTS).read_text())["best_value"] == best.value


@pytest.mark.parametrize("search", ["digits", "cifar10_resnet18"])
def test_search_configs_compose(search, monkeypatch):
    cfg = compose(f"hparams_search={search}", hydra=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaStudySweeper") and sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert (sweeper.metric, sweeper.direction) == ("best_val_acc", "maximize")
    assert sweeper.max_failure_rate == 1.0  # a diverged lr fails its trial, not the search
    assert cfg.hydra.sweep.dir == f"multirun/search/{search}"  # stable: the same command finds its study
    monkeypatch.setenv("SWEEP_DIR", "/scratch/sweeps")  # paths.sweep_dir moves searches as it moves sweeps
    assert compose(f"hparams_search={search}", hydra=True).hydra.sweep.dir == f"/scratch/sweeps/search/{search}"
    space, _ = _study.search_space([f"{k}={v}" for k, v in sweeper.params.items()])
    assert set(space) == {"optimizer.lr", "optimizer.weight_decay", "trainer.batch_size"}
    assert space["optimizer.lr"].log
    if search == "cifar10_resnet18":
        assert (cfg.model.arch, cfg.model.stem, cfg.dataset.name) == ("resnet18", "cifar", "cifar10")


def _complete(db: Path) -> int:
    try:
        with sqlite3.connect(db) as connection:
            return connection.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_a_retry_goes_on_from_its_last_tries_last_pt_unless_that_try_finished(tmp_path):
    study, _ = _study.open_study("s", None, "maximize", SAMPLER, COMMAND, 10, None)
    first = study.ask(SPACE)
    _study._abandon(study, [first], retry=True)  # Ctrl-C: queued again with its parameters
    retry = study.ask(SPACE)
    assert _study._continued(study, retry, tmp_path) == []  # nothing saved: from the start
    last = tmp_path / "0_optimizer.lr-0.01" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    last.touch()
    assert _study._continued(study, retry, tmp_path) == [f"trainer.resume='{last}'"]
    (last.parent.parent / "metrics.json").touch()  # it had finished: resumed, it would train nothing
    assert _study._continued(study, retry, tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("n_jobs, signum", [(1, signal.SIGINT), (2, signal.SIGTERM)])
def test_a_signal_while_no_trial_runs_ends_the_search_in_one_line_that_continues_it(tmp_path, n_jobs, signum):
    """Ctrl-C, or a preemption signal, to the search's whole group as the study asks for the second
    batch's trial (tests.faults.SignalingSampler): no trial to save, the search exits 128 + the signal
    in one line (was a KeyboardInterrupt's traceback, or a death by the signal, its trial left
    RUNNING), and that line's command finishes the search with the trial it had asked for. The SIGINT
    goes to a search started as a script's `... &` is, with SIGINT ignored: its trials take SIGINT
    all the same (trainer.preempt_signals), and so does the search between them."""
    sweep = tmp_path / "search"
    args = ["hparams_search=digits", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={n_jobs + 1}"]
    args += [f"hydra.sweeper.n_jobs={n_jobs}", "debug=limit", "trainer.epochs=1", "trainer.limit_train_batches=2"]
    args += ["hydra.sweeper.sampler._target_=tests.faults.SignalingSampler"]
    args += [f"+hydra.sweeper.sampler.at_trial={n_jobs}", f"+hydra.sweeper.sampler.signum={int(signum)}"]
    # A session of its own: the sampler signals its whole group.
    search = Run(sweep, *args, background=signum == signal.SIGINT)
    assert search.finish() == 128 + signum, search.output()
    output = search.output()
    assert "Traceback" not in output and search.leftovers() == [], output
    said = f"{Preempted(signum)} before the ranks saved last.pt; continue from the last save, if any, with: "
    (command,) = re.findall(re.escape(said) + "(.*)", output)

    again = train_server.run(shlex.split(command)[2:])  # less `python train.py`
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert _states(study) == ["COMPLETE"] * n_jobs + ["FAIL", "COMPLETE"]
    assert study.trials[-1].params == study.trials[-2].params  # the trial asked for, queued again


@pytest.mark.slow
def test_a_trial_cut_short_goes_on_from_its_last_pt_when_the_search_runs_again(tmp_path):
    """SIGTERM in trial 0's second step: the search stops, its trial saved. The same command again
    runs the trial again with its parameters, which trained from the start: it now goes on from the
    last.pt the stopped try left, as a run resumed by hand does."""
    sweep = tmp_path / "search"
    once = ["model._target_=tests.faults.SignalingNet", "+model.at_step=2", f"+model.once={tmp_path / 'sent'}"]
    args = ["hparams_search=digits", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=1", "debug=limit"]
    args += ["trainer.epochs=1", "trainer.progress_bar=false", *once]
    assert train_server.run(args).returncode == 143
    (stopped,) = sweep.glob("0_*/checkpoints/last.pt")
    again = train_server.run(args)
    assert again.returncode == 0, again.stderr[-3000:]
    (log,) = sweep.glob("1_*/train.log")
    assert re.search(rf"from epoch 1 batch 3 \({re.escape(str(stopped))}\)$", log.read_text(), re.MULTILINE)
    assert _complete(sweep / "optuna.db") == 1


@pytest.mark.slow
def test_a_killed_search_continues_to_exactly_n_trials(tmp_path, monkeypatch):
    """kill -9 of a search in its third trial (held at its first step's end, so that the kill never
    lands after it finished): the same command again keeps the two complete trials, fails the
    killed one (its heartbeat is stale), runs it again with its parameters, and ends at n_trials."""
    sweep, output, held = tmp_path / "search", tmp_path / "first.out", tmp_path / "held"
    held.mkdir()
    args = [
        "hparams_search=digits",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.heartbeat_interval=1",
        "hydra.sweeper.pruner=median",  # its trials report to the study as the kill comes
        "trainer.epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.progress_bar=false",
        "+callbacks.held._target_=tests.faults.Held",
        "+callbacks.held.from_run=3",
    ]
    monkeypatch.setenv("HELD_DIR", str(held))
    (held / "hold").touch()
    first = train_server.start(args, output)  # a session of its own: killpg ends the search and its trials
    deadline = time.monotonic() + 120
    while len(list((held / "arrived").glob("*"))) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert _complete(sweep / "optuna.db") == 2, output.read_text()[-3000:]

    (held / "hold").unlink()
    again = train_server.run(args)
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3 and complete[:2] == [t for t in trials[:2]]  # the first run's two, kept
    (killed,) = [t for t in trials if t.state == TrialState.FAIL]  # the one in flight at the kill
    (retry,) = [t for t in complete if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.params == killed.params  # it had drawn them all: it was training
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert (results["best_value"], results["best_params"]) == (study.best_value, study.best_params)
    assert "Best parameters: optimizer.lr=" in again.stdout
    assert all((sweep / t.user_attrs["job"] / "metrics.json").is_file() for t in complete)
    # TensorBoard: each run named by its job's dir, its sampled floats to 4 digits; in the HParams tab
    # the sampled keys differ, and are numbers (sorted, plotted as such).
    runs = EventMultiplexer().AddRunsFromDirectory(str(sweep))
    runs.Reload()
    sampled = [float(x) for run in runs.Runs() for x in re.findall(r"\.(?:lr|weight_decay)-([\d.e-]+)", run)]
    assert len(sampled) >= 6 and all(float(f"{x:.4g}") == x for x in sampled)
    for tags in runs.PluginRunToTagToContent("hparams").values():
        experiment = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/experiment"]).experiment
        assert {info.name: api_pb2.DataType.Name(info.type) for info in experiment.hparam_infos if info.differs} == {
            "optimizer.lr": "DATA_TYPE_FLOAT64",
            "optimizer.weight_decay": "DATA_TYPE_FLOAT64",
            "trainer.batch_size": "DATA_TYPE_FLOAT64",
        }


def test_train_py_returns_the_metric_optimized_metric_names_to_the_sweeper(tmp_path):
    sweep = tmp_path / "search"
    done = train_server.run(
        [
            "-m",
            "hparams_search=digits",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweeper.n_trials=1",
            "optimized_metric=val_loss",
            "hydra.sweeper.direction=minimize",
            "hydra.sweeper.pruner=median",  # each trial gets the pruning callback, and the same dir name
            "debug=fdr",
            "trainer.progress_bar=false",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}").get_trials()
    metrics = yaml.safe_load((sweep / trial.user_attrs["job"] / "metrics.json").read_text())
    assert trial.value == metrics["val_loss"] != metrics["best_val_acc"]
    # What a search may optimise, and checks a metric against before it opens its study: each number the run wrote.
    numbers = {k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numbers == set(final_figures(ema=False, callback_figures=()))
    # How a trial reports to its study is no hyperparameter: no report column of trial numbers, no storage URL.
    record = json.loads((sweep / trial.user_attrs["job"] / "hparams.json").read_text())
    assert not [key for key in record if key.startswith("callbacks.optuna_pruning")], record
    # The job's dir names its sampled floats to 4 significant digits; its .hydra/ keeps them whole.
    lr, decay, batch = (trial.params[k] for k in ("optimizer.lr", "optimizer.weight_decay", "trainer.batch_size"))
    assert (
        trial.user_attrs["job"]
        == f"0_optimizer.lr-{lr:.4g}+optimizer.weight_decay-{decay:.4g}+trainer.batch_size-{batch}"
    )
    overrides = yaml.safe_load((sweep / trial.user_attrs["job"] / ".hydra" / "overrides.yaml").read_text())
    assert f"optimizer.lr={lr!r}" in overrides and f"optimizer.weight_decay={decay!r}" in overrides
    assert _study.PRUNING_OVERRIDE in overrides
    # Where it wrote, and the report command, as a -m sweep says them (config/callbacks.py).
    report_command = f"python -m bench.report {sweep}"
    assert f"[HYDRA] Sweep dir: {sweep} (a dir per job); once it ends, compare them: {report_command}\n" in done.stdout
    assert done.stdout.endswith(f"[HYDRA] Sweep done, in {sweep}; compare its jobs: {report_command}\n")


def test_a_metric_no_trial_writes_is_one_line_before_the_study_opens(tmp_path):
    # It trained every trial in full, failed each for returning no value, and left a study that
    # refused the corrected command (its overrides held the misspelled metric).
    sweep = tmp_path / "search"
    args = ["-m", "hparams_search=digits", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=1", "debug=fdr"]
    refused = train_server.run([*args, "optimized_metric=val_accuracy"])
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith(
        "error: optimized_metric=val_accuracy: the trials' metrics.json holds no such figure; did you mean val_acc? "
        "optimise one of val_loss, val_ce, val_acc, val_acc5, "
    ), refused.stderr
    assert "Traceback" not in refused.stderr and not (sweep / "optuna.db").exists()
    with_ema = train_server.run(
        [*args, "hydra.sweeper.n_trials=0", "optimized_metric=val_ema_acc", "trainer.ema_decay=0.9"]
    )
    assert with_ema.returncode == 0, with_ema.stderr[-3000:]


def test_a_misspelled_key_of_the_search_space_is_one_line_before_the_study_opens(tmp_path):
    # A key of the search file's params that the config lacks failed every trial as Hydra composed
    # it (with Hydra's advice to add it with +), and left a study that refused the corrected search.
    sweep = tmp_path / "search"
    space = "+hydra.sweeper.params={optimizer.lrr:'interval(0.01,0.1)'}"  # as a file of one's own would hold it
    refused = train_server.run(
        ["-m", "hparams_search=digits", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=1", "debug=fdr", space]
    )
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
        "error: hydra.sweeper.params: optimizer.lrr: no such key; did you mean optimizer.lr? (python train.py --cfg "
        "job lists them all; +optimizer.lrr=... adds an argument of its class)"
    ), refused.stderr
    assert "Traceback" not in refused.stderr and not (sweep / "optuna.db").exists()


def test_an_interval_on_a_whole_number_key_is_one_line_before_the_study_opens(tmp_path):
    # interval(16, 128) drew 83.5 for trainer.batch_size: every trial failed as Hydra merged it, and
    # the study, holding that space, refused the corrected one.
    sweep = tmp_path / "search"
    space = "trainer.batch_size=interval(16,128)"  # the command line's replaces the search file's choice(...)
    refused = train_server.run(["hparams_search=digits", f"hydra.sweep.dir={sweep}", "debug=fdr", space])
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
        "error: trainer.batch_size takes whole numbers, and interval(...) draws floats; search it with "
        "tag(int, interval(16, 128)), or choice(...)"
    ), refused.stderr
    assert not (sweep / "optuna.db").exists()
    _study.check_whole_numbers(
        {"trainer.batch_size": IntDistribution(16, 128), "optimizer.lr": FloatDistribution(0, 1)}
    )
    with pytest.raises(_study.SearchError, match=r"with tag\(log, int, interval\(16, 128\)\)"):
        _study.check_whole_numbers({"trainer.batch_size": FloatDistribution(16, 128, log=True)})


def test_the_search_spaces_keys_are_those_of_the_options_the_command_line_picks():
    config = OmegaConf.create({"hydra": {"runtime": {"config_sources": []}, "searchpath": []}})
    _study.check_space_keys(["optimizer.weight_decay=interval(0,0.1)"], ["optimizer=adamw"], config)
    with pytest.raises(_study.SearchError, match=r"^hydra.sweeper.params: optimizer.weight_decay: no such key"):
        _study.check_space_keys(["optimizer.weight_decay=interval(0,0.1)"], ["optimizer=adadelta"], config)


def test_a_metric_a_callback_adds_as_training_ends_is_not_refused():
    # on_train_end may add a figure of its own to metrics.json, which no list of figures holds: a search
    # optimising it was refused before its study opened.
    adding = {"recorder": {"_target_": "tests.test_callbacks.Recorder"}}  # its on_train_end adds `mine`
    _study.check_metric(OmegaConf.create({"optimized_metric": "mine", "trainer": {}, "callbacks": adding}), {})
    with pytest.raises(_study.SearchError, match="^optimized_metric=mine: the trials' metrics.json holds no such"):
        _study.check_metric(OmegaConf.create({"optimized_metric": "mine", "trainer": {}, "callbacks": {}}), {})


def test_a_trials_value_goes_back_to_hydra_as_that_value():
    space, _ = _study.search_space(["a=choice('b,c','x y',plain,3,1.5e-5,true)"])
    parser = OverridesParser.create()
    for value in space["a"].choices:
        parsed = parser.parse_override(_study.override_of("a", value))
        assert not parsed.is_sweep_override() and parsed.value() == value  # 'b,c' was a sweep of b and c


def test_glob_searches_a_config_groups_options():
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        space, _ = _study.search_space(
            ["model=glob([simple_cnn,mnist_net,none_such])"], GlobalHydra.instance().config_loader()
        )
    assert space["model"].choices == ("mnist_net", "simple_cnn")


@pytest.mark.parametrize(
    "override, error",
    [
        ("a=shuffle(1,2,3)", "a=shuffle(1,2,3): a search draws its own order, drop shuffle(...)"),
        ("a=shuffle(range(1,4))", "a=shuffle(range(1,4)): a search draws its own order, drop shuffle(...)"),
        ("lr=tag(log,interval(0,1))", "lr=tag(log,interval(0,1)): `low > 0` must hold for `log=True`"),
        ("lr=interval(0.1,0.01)", "lr=interval(0.1,0.01): `low <= high` must hold"),
        ("a=range(3,3)", "a=range(3,3): the range is empty"),
    ],
)
def test_a_space_optuna_cannot_search_is_one_line_naming_the_override(override, error):
    with pytest.raises(_study.SearchError) as refused:
        _study.search_space([override])
    assert str(refused.value).startswith(error) and "\n" not in str(refused.value)


def test_a_runs_seed_differs_from_every_other_machines_run():
    # seed + earlier gave the run with seed 1 on an empty study and seed 0 after one trial the same seed.
    assert _study._reseeded(1, 0) == {} and _study._reseeded(None, 5) == {}
    seeds = {(seed, earlier): _study._reseeded(seed, earlier)["seed"] for seed in range(4) for earlier in range(1, 5)}
    assert len(set(seeds.values())) == len(seeds) and not set(seeds.values()) & set(range(4))


@pytest.mark.parametrize(
    "storage, sampler, error",
    [
        (
            "sqlite:////no/such/dir/optuna.db",
            SAMPLER,
            "hydra.sweeper.storage=sqlite:////no/such/dir/optuna.db: OperationalError",
        ),
        ("nosuchdb://host/db", SAMPLER, "hydra.sweeper.storage=nosuchdb://host/db: NoSuchModuleError"),
        (
            None,
            OmegaConf.create({"_target_": "optuna.samplers.RandomSampler", "constant_liar": True}),
            "hydra.sweeper.sampler: RandomSampler.__init__() got an unexpected keyword argument 'constant_liar'; drop",
        ),
    ],
)
def test_a_storage_or_sampler_that_cannot_be_made_is_one_line(storage, sampler, error):
    with pytest.raises(_study.SearchError) as refused:
        _study.open_study("s", storage, "maximize", sampler, COMMAND, 10, None)
    assert str(refused.value).startswith(error) and "\n" not in str(refused.value), refused.value


def test_the_storage_a_refusal_names_hides_its_password(tmp_path):
    """A URL given as ${oc.env:...}, a secret's way in, arrives resolved: its password was in the
    refusals (and in the log's "Study ... in <storage>" line, which names it through the same `where`)."""
    url = "postgresql+psycopg://optuna:s3cret@db/optuna"
    study, _ = _study.open_study("s", None, "maximize", SAMPLER, COMMAND, 10, None)  # records this search
    (tmp_path / "0_optimizer.lr-0.01").mkdir()
    refusals = []
    for refuse in (
        lambda: _study.check_new_study_has_its_own_dir(study, url, tmp_path),
        lambda: _study._check_same_search(study, url, "maximize", {**COMMAND, "overrides": ["trainer.epochs=2"]}),
    ):
        with pytest.raises(_study.SearchError) as refused:
            refuse()
        refusals.append(str(refused.value))
    assert all("optuna:***@db/optuna" in said and "s3cret" not in said for said in refusals), refusals


def test_a_new_study_refuses_a_dir_holding_another_searchs_jobs(tmp_path):
    study, _ = _study.open_study("s", None, "maximize", SAMPLER, COMMAND, 10, None)  # in memory: gone with its process
    (tmp_path / "optuna.db").touch()
    (tmp_path / "runs").mkdir()  # a job's dir is named by its number, then _ and its overrides if any
    _study.check_new_study_has_its_own_dir(study, None, tmp_path)
    (tmp_path / "0_optimizer.lr-0.01").mkdir()
    with pytest.raises(
        _study.SearchError,
        match=f"{tmp_path} holds another search's job dirs \\(0_optimizer.lr-0.01, "
        "...\\) and study s in memory has no trials",
    ):
        _study.check_new_study_has_its_own_dir(study, None, tmp_path)
    study.add_trial(optuna.create_trial(params={}, distributions={}, value=1.0))  # the study that ran them: goes on
    _study.check_new_study_has_its_own_dir(study, None, tmp_path)


@pytest.mark.parametrize(
    "key, value, line",
    [
        ("n_jobs", 0, "hydra.sweeper.n_jobs=0: use 1 or more trials at once"),
        ("n_trials", -1, "hydra.sweeper.n_trials=-1: use 0 or more trials"),
        ("max_failure_rate", 1.5, "hydra.sweeper.max_failure_rate=1.5: use a share of the trials, 0 to 1"),
    ],
)
def test_a_count_the_search_cannot_use_names_its_key(key, value, line):
    # One line for all three keys left the user to find which of them was wrong.
    options = dict(direction="maximize", metric="best_val_acc", n_jobs=1, n_trials=0, max_failure_rate=0.0)
    sweeper = SimpleNamespace(**options, heartbeat_interval=60, pruner="none", storage=None, config={})
    _study.check_options(sweeper)
    setattr(sweeper, key, value)
    with pytest.raises(_study.SearchError) as refused:
        _study.check_options(sweeper)
    assert str(refused.value) == line


def test_a_refused_search_leaves_the_record_of_the_one_in_its_dir(tmp_path):
    sweep = tmp_path / "search"
    args = [
        "-m",
        "hparams_search=digits",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweeper.n_trials=1",
        "debug=fdr",
        "trainer.progress_bar=false",
    ]
    done = train_server.run(args)
    assert done.returncode == 0, done.stderr[-3000:]
    record = (sweep / "multirun.yaml").read_text()
    for refused, error in [
        (["trainer.epochs=2"], "error: study digits in sqlite:///"),  # another search under the same name
        (["hydra.sweeper.storage=null"], f"error: {sweep} holds another search's job dirs (0_"),
        (["hydra.sweeper.n_jobs=0"], "error: hydra.sweeper.n_jobs=0: use 1 or more trials at once"),
        (["hydra.sweeper.pruner=bogus"], "error: hydra.sweeper.pruner=bogus: choose none, median, "),
    ]:
        again = train_server.run([*args, *refused])
        # The last line, one line: Optuna logs to stderr before it (a study created, or loaded).
        assert again.returncode == 2 and again.stderr.splitlines()[-1].startswith(error), again.stderr
        assert "Traceback" not in again.stderr and "HYDRA_FULL_ERROR" not in again.stderr, again.stderr
        assert (sweep / "multirun.yaml").read_text() == record
