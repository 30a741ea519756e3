"""hydra/sweeper=optuna_study as Hydra runs it (`-m`), in this process, with a task function of
our own: what a search does, seen only through Hydra's API, the study and its results file, so
that it holds however the plugin's modules are laid out inside."""

from __future__ import annotations

import ast
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest
import yaml
from hydra.test_utils.test_utils import SweepTaskFunction
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from config.setup import ROOT


def _search(sweep_dir: Path, n_trials: int, fail_every: int = 2) -> list[dict]:
    """One `-m` run in `sweep_dir` of a search over x in [0, 1] and z in 0.5, 1, 1.5, whose every
    `fail_every`th job raises; the config of each job it launched."""
    launched = []

    def task(cfg):
        launched.append({**cfg, "beats": _heartbeats(sweep_dir)})
        if len(launched) % fail_every == 0:
            raise RuntimeError(f"diverged at x={cfg.x}")
        return cfg.x

    sweep = SweepTaskFunction()
    sweep.calling_file, sweep.calling_module = __file__, None
    sweep.task_function, sweep.config_path, sweep.config_name = task, None, None
    sweep.temp_dir = str(sweep_dir)
    sweep.overrides = [
        "hydra/sweeper=optuna_study",
        "hydra.job.chdir=false",
        "hydra.sweeper.study_name=s",
        f"hydra.sweeper.n_trials={n_trials}",
        "hydra.sweeper.max_failure_rate=1.0",
        "+x=interval(0, 1)",
        "+z=range(0.5, 2.0, 0.5)",
    ]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        sweep.__enter__()  # not `with`: its exit deletes the sweep dir, which holds the study
    assert not [w for w in warned if "Heartbeat of storage" in str(w.message)]  # ask/tell beats by itself
    return launched


def _heartbeats(sweep_dir: Path) -> int:
    """The heartbeats the study's storage holds: one per trial its sweeper ran, as another sweeper sees them."""
    with sqlite3.connect(sweep_dir / "optuna.db") as connection:
        return connection.execute("SELECT count(*) FROM trial_heartbeats").fetchone()[0]


def test_a_search_counts_complete_trials_only_and_its_rerun_counts_the_studys(tmp_path):
    sweep_dir = tmp_path / "search"
    jobs = _search(sweep_dir, n_trials=2)
    assert len(jobs) == 3  # ok, failed, ok: a failed trial is not one of n_trials
    assert all(job["z"] in (0.5, 1.0, 1.5) for job in jobs)
    assert [job["beats"] for job in jobs] == [1, 2, 3]  # each running trial beats from its start
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert study.metric_names == ["value"]  # hydra.sweeper.metric, as optuna-dashboard labels its plots
    assert study.trials[0].distributions == {
        "+x": FloatDistribution(0.0, 1.0),
        "+z": FloatDistribution(0.5, 1.5, step=0.5),  # range's stop excluded
    }
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert (results["n_trials"], results["complete"], len(results["trials"])) == (2, 2, 3)
    assert _search(sweep_dir, n_trials=2) == []  # the same command again: the study is complete


def test_a_search_whose_every_trial_fails_stops_saying_why_and_naming_its_first(tmp_path, capsys):
    with pytest.raises(SystemExit):  # Hydra's, with the sweeper's error as one line
        _search(tmp_path / "search", n_trials=2, fail_every=1)
    first = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'search' / 'optuna.db'}").trials[0]
    said = (
        "2 trials of this search failed, as many as hydra.sweeper.n_trials=2 (a failed trial counts for none); the "
        f"first (trial 0) with RuntimeError: diverged at x={first.params['+x']}; its log: "
    )
    assert said in capsys.readouterr().err


def test_hydras_plugin_scan_at_every_start_imports_no_optuna():
    """Hydra imports every public module of hydra_plugins/ as any app starts, train.py's every run
    included: the sweeper's Optuna (and SQLAlchemy, and the callback's torch) must stay behind its
    private modules, imported when a search runs."""
    scan = "from hydra.core.plugins import Plugins; import sys; Plugins.instance(); print(sorted(sys.modules))"
    result = subprocess.run([sys.executable, "-c", scan], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    imported = {name.split(".")[0] for name in ast.literal_eval(result.stdout)}
    assert "hydra_plugins" in imported
    assert not imported & {"optuna", "sqlalchemy", "torch"}
