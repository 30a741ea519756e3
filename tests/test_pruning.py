"""hydra.sweeper.pruner: the trial's callback called as the Trainer calls on_validation_end (every
epoch, the epoch's figures), and the sweeper recording a trial whose run was pruned as PRUNED."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

import preflight
from config.setup import compose
from config.typed import typed
from errors import ConfigError
from hydra_plugins.optuna_study_sweeper import _pruning, _study
from hydra_plugins.optuna_study_sweeper._pruning import OptunaPruning
from tests import train_server
from tests.runs import FORK_RANKS
from tests.test_hparams_search import COMMAND, SAMPLER, _states
from training.validation import produced

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
SPACE = {"lr": FloatDistribution(1e-4, 1e-1, log=True)}
EPOCHS = 6


def test_the_figure_reported_each_epoch_is_the_one_the_metric_ends_as():
    assert _pruning.epoch_figure("best_val_acc") == "val/best_acc"
    assert _pruning.epoch_figure("val_loss") == "val/loss"
    assert _pruning.epoch_figure("val_ema_acc5") == "val_ema/acc5"
    assert _pruning.epoch_figure("wall_s") is None and _pruning.epoch_figure("train_samples_per_s") is None


@pytest.fixture
def tmp_path(memory_dir: Path, request) -> Path:
    """In memory: a pruned trial's storage commits (and syncs to disk) at every report."""
    path = memory_dir / request.node.name
    path.mkdir()
    return path


def test_each_metrics_figure_is_one_validation_makes_and_the_pre_flight_checks_the_runs_makes_it():
    metrics = ("best_val_acc", "best_val_acc5", "val_acc", "val_acc5", "val_loss", "val_ce", "val_ema_acc")
    assert all(_pruning.epoch_figure(metric) in produced(True, []) for metric in metrics)
    without_ema = typed(compose("hparams_search=digits", "optimized_metric=val_ema_acc"))
    callback = OptunaPruning("sqlite:///x.db", "s", 0, "median", "val_ema_acc")
    with pytest.raises(ConfigError, match=r"^callbacks.optuna_pruning.monitor=val_ema/acc: this run produces no such"):
        preflight._check_monitors(without_ema, {"optuna_pruning": callback})


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def _study_with_finished_trials(tmp_path: Path, curves: list[list[float]]) -> optuna.Study:
    study, _ = _study.open_study("s", _url(tmp_path), "maximize", SAMPLER, COMMAND, 10, None)
    for curve in curves:
        study.add_trial(
            optuna.create_trial(
                params={"lr": 0.01},
                distributions=SPACE,
                value=curve[-1],
                intermediate_values=dict(enumerate(curve)),
            )
        )
    return study


def test_rank_zero_reports_each_epoch_and_is_told_to_stop_below_the_median(tmp_path):
    study = _study_with_finished_trials(tmp_path, [[0.5, 0.7, 0.8]] * 5)  # median's 5 startup trials
    good, bad = study.ask(SPACE), study.ask(SPACE)
    callbacks = {
        trial.number: OptunaPruning(_url(tmp_path), "s", trial.number, "median", "best_val_acc")
        for trial in (good, bad)
    }
    assert callbacks[good.number].on_validation_end(0, 10, {"val/best_acc": 0.6, "val/loss": 1.0}) is None
    reason = callbacks[bad.number].on_validation_end(0, 10, {"val/best_acc": 0.3, "val/loss": 2.0})
    assert reason == "pruned by Optuna's median pruner at epoch 1: val/best_acc 0.3"
    assert callbacks[good.number].on_validation_end(1, 20, {"val/best_acc": 0.75}) is None
    trials = study.get_trials()
    assert trials[good.number].intermediate_values == {0: 0.6, 1: 0.75}
    assert trials[bad.number].intermediate_values == {0: 0.3}
    assert trials[bad.number].user_attrs == {"pruned": reason} and "pruned" not in trials[good.number].user_attrs


@pytest.mark.parametrize("pruner", ["hyperband", "successive_halving"])
def test_the_rung_pruners_stop_worse_trials_at_a_rung_and_never_the_best(tmp_path, pruner):
    """Optuna's rung pruners keep a trial whose figure at a rung of epochs is among the best third
    (hyperband, in its trial's bracket) or quarter (successive halving) of those that reached it.
    The rungs are recorded in the study, so each trial's own process judges alike."""
    study = _study_with_finished_trials(tmp_path, [])
    stopped_at = {}
    for value in (0.5, 0.6, 0.7, 0.4, 0.8, 0.3, 0.05, 0.95, 0.96):
        trial = study.ask(SPACE)
        callback = OptunaPruning(_url(tmp_path), "s", trial.number, pruner, "val_acc")
        epoch = next((e for e in range(EPOCHS) if callback.on_validation_end(e, e, {"val/acc": value})), None)
        study.tell(trial, value) if epoch is None else study.tell(trial, state=TrialState.PRUNED)
        stopped_at[value] = epoch
    assert stopped_at[0.05] is not None and stopped_at[0.3] is not None
    assert stopped_at[0.95] is None and stopped_at[0.96] is None and stopped_at[0.8] is None


def test_other_ranks_leave_the_study_to_rank_zero(tmp_path):
    study = _study_with_finished_trials(tmp_path, [[0.5]] * 5)
    trial = study.ask(SPACE)
    callback = OptunaPruning(_url(tmp_path), "s", trial.number, "median", "best_val_acc")
    callback.setup(SimpleNamespace(ctx=SimpleNamespace(is_main=False)))  # the Trainer's RunInfo, rank 1's
    assert callback.on_validation_end(0, 1, {"val/best_acc": 0.0}) is None  # rank 0's answer stops every rank
    assert study.get_trials()[trial.number].intermediate_values == {}


def test_a_study_out_of_reach_lets_the_trial_go_on_and_one_that_ended_it_stops_it(tmp_path, caplog):
    lost = OptunaPruning("sqlite:////no/such/dir/optuna.db", "s", 0, "median", "best_val_acc")
    with caplog.at_level(logging.WARNING, logger="train"):
        assert lost.on_validation_end(0, 1, {"val/best_acc": 0.0}) is None
    assert "could not report to study s: hydra.sweeper.storage=sqlite:////no/such/dir/optuna.db" in caplog.text
    study = _study_with_finished_trials(tmp_path, [])
    trial = study.ask(SPACE)
    study.tell(trial, state=TrialState.FAIL)  # a sweeper found it stale (its own sweeper was killed)
    ended = OptunaPruning(_url(tmp_path), "s", trial.number, "median", "best_val_acc")
    assert ended.on_validation_end(0, 1, {"val/best_acc": 0.5}) == (
        "trial 0 of study s was ended by its search (its sweeper missed heartbeats)"
    )


def test_a_pruner_or_a_metric_a_trial_cannot_use_is_refused():
    with pytest.raises(ValueError, match="no pruner bogus: choose none, median, successive_halving, hyperband"):
        OptunaPruning("sqlite:///x.db", "s", 0, "bogus", "best_val_acc")
    with pytest.raises(ValueError, match="wall_s has no figure each epoch"):
        OptunaPruning("sqlite:///x.db", "s", 0, "median", "wall_s")


@pytest.mark.parametrize(
    "pruner, storage, metric, error",
    [
        ("bogus", "sqlite:///x.db", "best_val_acc", "hydra.sweeper.pruner=bogus: choose none, median,"),
        ("median", None, "best_val_acc", "hydra.sweeper.pruner=median needs a study its trials can reach"),
        ("hyperband", "sqlite:///x.db", "wall_s", "hydra.sweeper.pruner=hyperband: optimized_metric=wall_s has no"),
    ],
)
def test_a_pruner_the_search_cannot_use_is_one_line(pruner, storage, metric, error):
    with pytest.raises(_study.SearchError) as refused:
        _study.check_pruner(pruner, storage, metric)
    assert str(refused.value).startswith(error) and "\n" not in str(refused.value)
    _study.check_pruner("none", None, "wall_s")


def _curve(lr: float, epoch: int) -> float:
    """A trial's best accuracy so far: higher for an lr nearer 0.01, rising with the epochs."""
    return (1 - abs(math.log10(lr) + 2) / 3) * (1 - 0.5 ** (epoch + 1))


class TrainerLauncher:
    """Each job trains as train.py's Trainer would, with the pruning callback the sweeper adds to its
    config: EPOCHS epochs, each ending with on_validation_end; a reason stops it at that epoch's end,
    and the run ends normally, returning best_val_acc."""

    def __init__(self, url: str, pruner: str = "median") -> None:
        self.url, self.pruner, self.epochs_run = url, pruner, []

    def __call__(self, batch: list[list[str]], first: int) -> list[JobReturn]:
        (overrides,) = batch
        assert _study.PRUNING_OVERRIDE in overrides
        lr = float(dict(o.split("=", 1) for o in overrides if not o.startswith("+"))["lr"])
        callback = OptunaPruning(self.url, "s", first, self.pruner, "best_val_acc")
        for epoch in range(EPOCHS):
            figure = _curve(lr, epoch)
            if callback.on_validation_end(epoch, epoch, {"val/best_acc": figure, "val/loss": 1 - figure}):
                break
        self.epochs_run.append(epoch + 1)
        hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": f"/runs/{first}"}}})
        return [JobReturn(overrides=overrides, hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED, _return_value=figure)]


def test_a_pruned_search_records_its_pruned_trials_as_such_and_counts_them_to_n_trials(tmp_path):
    study, storage = _study.open_study("s", _url(tmp_path), "maximize", SAMPLER, COMMAND, 10, None)
    launch = TrainerLauncher(_url(tmp_path))
    fixed = ["trainer.epochs=6", _study.PRUNING_OVERRIDE]
    _study.run(study, SPACE, fixed, launch, tmp_path, n_trials=12, n_jobs=1, heartbeat=storage)
    trials = study.get_trials()
    assert len(trials) == 12 and set(_states(study)) == {"COMPLETE", "PRUNED"}  # pruned ones count
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(pruned) >= 3 and sum(launch.epochs_run) < 12 * EPOCHS
    for trial in pruned:  # its value: the last figure reported; its reason kept
        assert trial.value == trial.intermediate_values[max(trial.intermediate_values)]
        assert trial.user_attrs["pruned"].startswith("pruned by Optuna's median pruner at epoch ")
    assert study.best_trial.state == TrialState.COMPLETE
    summary = _study.results(study, "best_val_acc", 12)
    assert (summary["complete"], summary["pruned"]) == (12 - len(pruned), len(pruned))
    assert {t["state"] for t in summary["trials"]} == {"COMPLETE", "PRUNED"}


def test_a_pruned_search_killed_mid_trial_goes_on_to_n_trials(tmp_path):
    """kill -9: the trial in flight (2 epochs reported, never told) is found stale, run again from
    its parameters, and the pruned trials of the first run count as finished."""
    url = _url(tmp_path)
    study, storage = _study.open_study("s", url, "maximize", SAMPLER, COMMAND, 1, 1)
    fixed = [_study.PRUNING_OVERRIDE]
    _study.run(study, SPACE, fixed, TrainerLauncher(url), tmp_path, n_trials=8, n_jobs=1, heartbeat=storage)
    first = _states(study)
    killed = study.ask(SPACE)
    callback = OptunaPruning(url, "s", killed.number, "median", "best_val_acc")
    for epoch in range(2):
        callback.on_validation_end(epoch, epoch, {"val/best_acc": 0.9})
    storage.record_heartbeat(killed._trial_id)
    time.sleep(2.1)  # its sweeper killed: no heartbeat for the grace period
    study, storage = _study.open_study("s", url, "maximize", SAMPLER, COMMAND, 1, 1)  # the same command again
    _study.run(study, SPACE, fixed, TrainerLauncher(url), tmp_path, n_trials=12, n_jobs=1, heartbeat=storage)
    states = _states(study)
    assert states[:8] == first and states[8] == "FAIL"
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == 12
    retry = study.get_trials()[9]
    assert retry.params == killed.params and retry.system_attrs["failed_trial"] == killed.number
    assert retry.intermediate_values[0] == pytest.approx(_curve(killed.params["lr"], 0))  # its own, from epoch 0


@pytest.mark.slow
def test_a_pruned_ddp_trial_stops_every_rank_at_the_epochs_end_and_its_run_says_so(tmp_path):
    """Through train.py: five trials already in the study at 0.99 each epoch (median's startup
    trials), then one of 2 DDP ranks whose first epoch is far below: rank 0 reports, the pruner says
    stop, both ranks stop after epoch 1 of 3, and the run ends as a finished one."""
    sweep = tmp_path / "search"
    sweep.mkdir()
    study = optuna.create_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}", direction="maximize")
    for _ in range(5):
        study.add_trial(optuna.create_trial(value=0.99, intermediate_values={0: 0.99, 1: 0.99, 2: 0.99}))
    done = train_server.run(
        [
            "hparams_search=digits",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.pruner=median",
            "debug=ddp_cpu",
            FORK_RANKS,
            "trainer.epochs=3",
            "trainer.progress_bar=false",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trial = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}").trials[5]
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [0]
    reason = trial.user_attrs["pruned"]
    assert reason.startswith("pruned by Optuna's median pruner at epoch 1: val/best_acc ")
    run = sweep / trial.user_attrs["job"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["stopped_early"], metrics["epochs"], metrics["world_size"]) == (reason, 1, 2)
    assert f"stopping early at step 3: {reason}; last.pt is saved" in (run / "train.log").read_text()
    assert (run / "checkpoints" / "last.pt").is_file()
    assert f"trial 5 {reason}" in done.stdout
