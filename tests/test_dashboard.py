"""python -m bench.dashboard: optuna-dashboard on the study a search writes, read over its HTTP API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution

from bench import dashboard
from bench.dashboard import storage_url
from config.setup import ROOT
from hydra_plugins.optuna_study_sweeper import _study

SPACE = {"optimizer.lr": FloatDistribution(1e-3, 0.5, log=True)}
SAMPLER = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 0})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, server: subprocess.Popen, deadline: float):
    """The JSON at `url`, once the server answers; its error if it ended first."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            assert server.poll() is None, server.stderr.read()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_the_dashboard_serves_a_searchs_trials_and_stops_by_its_pid(tmp_path):
    search = tmp_path / "search" / "digits"  # as hparams_search=digits lays it out: <sweep dir>/optuna.db
    search.mkdir(parents=True)
    study, _ = _study.open_study(
        "digits", f"sqlite:///{search / 'optuna.db'}", "maximize", SAMPLER, {"overrides": []}, 10, None
    )
    trial = study.ask(SPACE)
    study.tell(trial, 0.97)

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.dashboard", str(search), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        (summary,) = get(f"http://127.0.0.1:{port}/api/studies", server, deadline)["study_summaries"]
        assert summary["study_name"] == "digits"
        (served,) = get(f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}", server, deadline)["trials"]
        assert served["values"] == [0.97] and served["state"] == "Complete"
        assert {p["name"]: p["param_internal_value"] for p in served["params"]} == trial.params
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            assert server.wait(timeout=30) == -signal.SIGTERM, server.stderr.read()


@pytest.mark.timeout(60)  # served instead: the port's check is broken
def test_a_port_in_use_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    database = tmp_path / "optuna.db"
    _study.open_study("s", f"sqlite:///{database}", "maximize", SAMPLER, {"overrides": []}, 10, None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(sys, "argv", ["bench.dashboard", str(tmp_path), "--port", str(port)])
        with pytest.raises(SystemExit) as error:
            dashboard.main()
    assert str(error.value) == (
        "bench.dashboard: cannot serve there (Address already in use: another dashboard?); give another --port, "
        "or --host"
    )


def test_a_mistyped_search_is_one_line_and_no_empty_database(tmp_path):
    with pytest.raises(SystemExit) as error:
        storage_url(str(tmp_path / "search" / "digitz"))
    assert str(error.value) == (
        f"bench.dashboard: {tmp_path}/search/digitz: no such study database; give a "
        "search's dir (multirun/search/<name>), its optuna.db or optuna.journal, or a storage URL"
    )
    assert not (tmp_path / "search").exists()
    assert storage_url("postgresql://host/db") == "postgresql://host/db"


def test_a_mistyped_sqlite_url_is_one_line_and_no_empty_database(tmp_path, monkeypatch):
    """The URL a search logs its study in (hydra.sweeper.storage), one letter off: optuna-dashboard
    made an empty database of it and ended in a traceback."""
    mistyped = tmp_path / "optuna.bd"
    monkeypatch.setattr(sys, "argv", ["bench.dashboard", f"sqlite:///{mistyped}"])
    with pytest.raises(SystemExit) as error:
        dashboard.main()
    assert str(error.value).startswith(f"bench.dashboard: {mistyped}: no such study database; give a search's dir")
    assert not mistyped.exists()
    database = tmp_path / "optuna.db"
    _study.open_study("s", f"sqlite:///{database}", "maximize", SAMPLER, {"overrides": []}, 10, None)
    assert storage_url(f"sqlite:///{database}") == f"sqlite:///{database}"


def test_a_journal_is_given_to_the_dashboard_as_its_file(tmp_path):
    """optuna-dashboard reads a file that is not SQLite as Optuna's journal."""
    journal = tmp_path / "optuna.journal"
    _study.open_study("s", f"journal:///{journal}", "maximize", SAMPLER, {"overrides": []}, 10, None)
    assert storage_url(str(tmp_path)) == storage_url(f"journal:///{journal}") == str(journal)
    _study.open_study("s", f"sqlite:///{tmp_path / 'optuna.db'}", "maximize", SAMPLER, {"overrides": []}, 10, None)
    assert storage_url(str(tmp_path)) == f"sqlite:///{tmp_path / 'optuna.db'}"  # a dir with both: the default's
