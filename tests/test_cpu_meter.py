"""tests/cpu_meter.py, the plugin BENCHMARKS.md's per-test CPU figures come from: a test's row
counts the CPU of the processes it started, and only the test's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.setup import ROOT
from tests.cpu_meter import CPUACCT

BUSY = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.5: pass')"


@pytest.mark.skipif(not CPUACCT.is_dir() or os.geteuid() != 0, reason="needs root and cgroup v1's cpuacct")
def test_a_tests_row_counts_its_childrens_cpu_and_no_one_elses(tmp_path: Path):
    (tmp_path / "test_x.py").write_text(
        "import subprocess, sys\n"
        f"def test_busy_child():\n    subprocess.run([sys.executable, '-c', {BUSY!r}], check=True)\n"
        "def test_idle():\n    import time; time.sleep(0.5)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "cpu.tsv"
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.cpu_meter", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    env = {**os.environ, "CPU_METER_OUT": str(out), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("\t")[0]: [float(x) for x in line.split("\t")[1:]] for line in out.read_text().splitlines()}
    assert rows["test_x.py::test_busy_child"][1] >= 0.5
    assert rows["test_x.py::test_idle"][0] >= 0.5 and rows["test_x.py::test_idle"][1] < 0.1
    assert rows["TOTAL"][1] >= 0.5
