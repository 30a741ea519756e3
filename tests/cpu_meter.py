"""A pytest plugin for BENCHMARKS.md's figures of the suite: each test's wall and CPU seconds, the
CPU of everything the test started included (forked runs, torchrun's ranks, the rig's nodes and
daemons), the other load on the machine excluded. Run serially, as root, where cgroup v1's cpuacct
controller is mounted:

    CPU_METER_OUT=/tmp/cpu.tsv python -m pytest -p tests.cpu_meter -n 0 -o addopts=--timeout=600

It moves pytest into a cgroup of its own, whose children inherit it, and reads the cgroup's CPU
time around each test; a module fixture's cost falls to the test that first (or last) uses it.
Rows: node id, wall s, CPU s; the last, TOTAL, is the whole session's, collection included."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_GROUP = pytest.StashKey[Path]()
_START = pytest.StashKey[tuple[float, float]]()
_rows: list[tuple[str, float, float]] = []


def _cpu_s(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config: pytest.Config) -> None:
    if not CPUACCT.is_dir():
        raise pytest.UsageError(f"tests.cpu_meter: no {CPUACCT}: it needs cgroup v1's cpuacct controller")
    for earlier in CPUACCT.glob("pytest-cpu-meter-*"):  # the groups of sessions whose processes have all ended
        try:
            earlier.rmdir()
        except OSError:
            pass
    group = CPUACCT / f"pytest-cpu-meter-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    config.stash[_GROUP] = group
    config.stash[_START] = (time.perf_counter(), _cpu_s(group))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    group = item.config.stash[_GROUP]
    wall, cpu = time.perf_counter(), _cpu_s(group)
    yield
    _rows.append((item.nodeid, time.perf_counter() - wall, _cpu_s(group) - cpu))


def pytest_sessionfinish(session: pytest.Session) -> None:
    group = session.config.stash[_GROUP]
    wall, cpu = session.config.stash[_START]
    rows = [*_rows, ("TOTAL", time.perf_counter() - wall, _cpu_s(group) - cpu)]
    out = Path(os.environ.get("CPU_METER_OUT", "cpu_meter.tsv"))
    out.write_text("".join(f"{nodeid}\t{w:.2f}\t{c:.2f}\n" for nodeid, w, c in rows))
