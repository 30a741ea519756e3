"""hydra.sweeper.storage: a study many sweepers and trials share. SQLite (the default), Optuna's
journal file, and a PostgreSQL server started from scripts/postgres.sh; a password never in the URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest

from config.setup import ROOT
from hydra_plugins.optuna_study_sweeper import _storage, _study
from tests import train_server
from tests.fake_apt import fake_apt_get
from tests.test_hparams_search import COMMAND, SAMPLER, SPACE, FakeLauncher

POSTGRES = ROOT / "scripts" / "postgres.sh"

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def _states(study: optuna.Study) -> list[str]:
    return [t.state.name for t in study.get_trials(deepcopy=False)]


def test_a_storage_that_fails_to_open_says_so_in_one_line_that_hides_its_password():
    # A password on the command line is refused before Hydra writes it (config.overrides, test_config.py);
    # one from a config file still reaches no message.
    with pytest.raises(_storage.StorageError) as failed:
        _storage.open_storage("postgresql+psycopg://optuna:s3cret@127.0.0.1:1/optuna", None, None)
    said = str(failed.value)
    assert said.startswith("hydra.sweeper.storage=postgresql+psycopg://optuna:***@127.0.0.1:1/optuna: Operational")
    assert "s3cret" not in said and "\n" not in said


def _journal(tmp_path: Path, heartbeat_interval: int = 1, grace_period: int | None = 1):
    return _study.open_study(
        "s", f"journal:///{tmp_path / 'optuna.journal'}", "maximize", SAMPLER, COMMAND, heartbeat_interval, grace_period
    )


def test_a_journal_study_runs_again_the_trials_a_killed_sweeper_left(tmp_path):
    # A grace of 2 s: the alive trial must stay fresh while the journal is replayed, however loaded the
    # machine; the other two are stale after it.
    study, storage = _journal(tmp_path, grace_period=2)
    beaten = study.ask(SPACE)
    storage.record_heartbeat(beaten._trial_id)  # its sweeper beat for it, then died
    never = study.ask(SPACE)  # killed before its first heartbeat
    time.sleep(2.1)
    alive = study.ask(SPACE)  # another sweeper's, beating
    storage.record_heartbeat(alive._trial_id)
    study, storage = _journal(tmp_path, grace_period=2)  # the same command again
    _study._fail_stale(study)
    assert _states(study) == ["FAIL", "FAIL", "RUNNING", "WAITING", "WAITING"]
    retries = study.get_trials()[3:]
    assert [(r.params, r.system_attrs["failed_trial"]) for r in retries] == [
        (beaten.params, beaten.number),
        (never.params, never.number),
    ]
    study.tell(alive, 0.5)
    _study.run(study, SPACE, [], FakeLauncher(tmp_path), tmp_path, n_trials=3, n_jobs=1, heartbeat=storage, poll_s=0.1)
    assert _states(study) == ["FAIL", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]  # the retries: not stale at once
    assert [t.params for t in study.get_trials()[3:]] == [beaten.params, never.params]


def test_a_missing_journal_directory_is_one_line(tmp_path):
    with pytest.raises(
        _study.SearchError,
        match=r"^hydra.sweeper.storage=journal:///.*/none/j.journal: FileNotFoundError: .* No such file or directory: ",
    ):
        _study.open_study("s", f"journal:///{tmp_path}/none/j.journal", "maximize", SAMPLER, COMMAND, 10, None)


FAKE_APT_GET = fake_apt_get(
    """  mkdir -p "$POSTGRES_LIB/15/bin"
  for command in initdb pg_ctl createdb; do printf '#!/bin/sh\\n' > "$POSTGRES_LIB/15/bin/$command"; done
  chmod +x "$POSTGRES_LIB"/15/bin/*
"""
)


def test_two_servers_installing_at_once_on_a_machine_without_postgresql_both_succeed_with_one_install(tmp_path):
    """A fresh CI machine: test modules that each bring a server up at once. A PATH and a program
    directory without postgresql, and an apt-get that refuses a second caller as dpkg does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "realpath",
        "dirname",
        "mkdir",
        "flock",
        "sleep",
        "chmod",
        "printf",
        "ls",
        "sort",
        "tail",
        "id",
    ):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "FAKE": str(tmp_path),
        "POSTGRES_LIB": str(tmp_path / "lib"),
        "POSTGRES_INSTALL_LOCK": str(tmp_path / "install.lock"),
    }
    installs = [
        subprocess.Popen(["bash", str(POSTGRES), "install"], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errors = [install.communicate(timeout=60)[1] for install in installs]
    assert [install.returncode for install in installs] == [0, 0], errors
    assert (tmp_path / "calls").read_text().split() == ["update", "install"]  # the second found it installed


@pytest.fixture(scope="module")
def postgres():
    """A server from scripts/postgres.sh in a dir the postgres user can reach (pytest's tmp_path is
    private to root): its PGPASSFILE and storage URL."""
    where = Path(tempfile.mkdtemp(prefix="study-postgres-"))
    where.chmod(0o755)
    up = subprocess.run([str(POSTGRES), "up", str(where)], capture_output=True, text=True, timeout=300)
    try:
        if up.returncode == 3:  # not root, or no postgresql and no apt-get that can install it
            reason = f"cannot start PostgreSQL here: {up.stderr.strip().splitlines()[-1]}"
            if os.environ.get("CI") == "true":  # CI must run these tests, not report them skipped
                pytest.fail(reason)
            pytest.skip(reason)
        assert up.returncode == 0, up.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        assert exports.keys() == {"PGPASSFILE", "STUDY_STORAGE"}, up.stdout
        yield exports
    finally:
        subprocess.run([str(POSTGRES), "down", str(where)], timeout=60)
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.slow
# Two sweepers as threads of one process: warnings.catch_warnings, with which each hides Optuna's
# note that heartbeats are experimental, changes the process's filters, so one thread's ends the other's.
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_two_sweepers_share_one_study_on_postgresql(postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", postgres["PGPASSFILE"])  # the URL holds no password: libpq reads it here
    url, name = postgres["STUDY_STORAGE"], f"shared-{time.time_ns()}"
    sampler = {**SAMPLER, "seed": None}
    done = []
    # Each sweeper's first trial waits for the other's to be asked: without it, the sweeper that
    # opened the study first could run all 4 fake trials before the other had started.
    met = threading.Barrier(2, timeout=60)

    def sweeper():
        study, storage = _study.open_study(name, url, "maximize", sampler, COMMAND, 1, None)
        launch = FakeLauncher(tmp_path)

        def first_waits(batch: list[list[str]], first: int):
            if not launch.calls:
                met.wait()
            return launch(batch, first)

        _study.run(study, SPACE, [], first_waits, tmp_path, n_trials=4, n_jobs=1, heartbeat=storage, poll_s=0.1)
        done.append(len(launch.calls))

    sweepers = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in sweepers:
        thread.start()
    for thread in sweepers:
        thread.join(120)
    study = optuna.load_study(study_name=name, storage=url)
    assert len(done) == 2 and sum(done) == len(study.trials) and all(done)  # both took part
    assert (
        study.trials[0].state.name == "COMPLETE"
        and len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) >= 4
    )
    assert len({t.user_attrs["job"] for t in study.trials}) == len(study.trials)  # a job dir each


@pytest.mark.slow
def test_a_search_on_postgresql_through_train_py_keeps_the_password_out_of_its_files(postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", postgres["PGPASSFILE"])
    password = Path(postgres["PGPASSFILE"]).read_text().strip().rsplit(":", 1)[1]
    sweep = tmp_path / "search"
    done = train_server.run(
        [
            "hparams_search=digits",
            f"hydra.sweep.dir={sweep}",
            f"hydra.sweeper.storage={postgres['STUDY_STORAGE']}",
            f"hydra.sweeper.study_name=digits-{time.time_ns()}",
            "hydra.sweeper.n_trials=1",
            "debug=fdr",
            "trainer.progress_bar=false",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = [p for p in sweep.glob("optimization_results.yaml")]
    assert "complete: 1" in result.read_text()
    files = [p for p in sweep.rglob("*") if p.is_file()]
    assert any(p.name == "hydra.yaml" for p in files)  # the job's .hydra/, which holds the URL
    assert not [p for p in files if password.encode() in p.read_bytes()]
    assert password not in done.stdout + done.stderr


@pytest.mark.slow
def test_bench_study_storage_counts_each_storages_failed_and_slow_operations(tmp_path):
    # `python -m bench.study_storage`, forked from the train server, which has imported Optuna.
    done = train_server.run(
        [f"sqlite:///{tmp_path}/s.db", f"journal:///{tmp_path}/j.journal", "--writers", "2", "--epochs", "2"],
        timeout=120,
        module="bench.study_storage",
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith(("| sqlite", "| journal"))]
    assert [(row[0], row[1], row[2]) for row in rows] == [("| sqlite", "2", "0"), ("| journal", "2", "0")]


def test_a_storage_password_in_a_config_file_is_refused_before_the_search_writes_anything(tmp_path):
    """The command line's is refused sooner (config.overrides); one that a config file sets would
    reach multirun.yaml and the log (config.callbacks.SecretCheck)."""
    conf = tmp_path / "conf" / "hparams_search"
    conf.mkdir(parents=True)
    (conf / "leaky.yaml").write_text(
        "# @package _global_\ndefaults:\n  - digits\nhydra:\n  sweeper:\n    storage: postgresql://u:s3cret@h/db\n"
    )
    sweep = tmp_path / "search"
    done = train_server.run(
        ["--config-dir", str(tmp_path / "conf"), "hparams_search=leaky", f"hydra.sweep.dir={sweep}"]
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith(
        "error: hydra.sweeper.storage=postgresql://u:***@h/db: a password or key in a config file is written to "
        "the run's records; give it through the environment instead (PGPASSWORD or ~/.pgpass"
    )
    assert "s3cret" not in done.stdout + done.stderr
    assert not sweep.exists() or not [p for p in sweep.rglob("*") if p.is_file()]
