"""Under CI=true the SLURM tests fail when the local cluster cannot start; elsewhere they skip."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# A test module that uses test_slurm.py's cluster fixture, with local_cluster.sh swapped for a stub
# that fails as the real one does where slurm cannot be installed (exit 3).
USES_CLUSTER = """
from pathlib import Path

import tests.test_slurm
from tests.test_slurm import slurm_env  # noqa: F401

tests.test_slurm.CLUSTER = Path({stub!r})


def test_needs_the_cluster(slurm_env):
    pass
"""


@pytest.mark.parametrize("ci, outcome, code", [(None, "1 skipped", 0), ("true", "1 error", 1)])
def test_a_cluster_that_cannot_start_skips_only_outside_ci(tmp_path, ci, outcome, code):
    stub = tmp_path / "local_cluster.sh"
    stub.write_text("echo 'slurm is not installed and installing it needs root' >&2\nexit 3\n")
    test = tmp_path / "test_uses_cluster.py"
    test.write_text(USES_CLUSTER.format(stub=str(stub)))
    env = {key: value for key, value in os.environ.items() if key != "CI"} | ({"CI": ci} if ci else {})
    cmd = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pytest.ini"), "-o", "addopts=", "-p", "no:xdist",
           "-p", "no:cacheprovider", "-rA", str(test)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == code and outcome in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cannot install slurm here: slurm is not installed" in done.stdout
