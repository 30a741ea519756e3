"""Under CI=true the rig's tests fail when the rig cannot start; elsewhere they skip."""

from __future__ import annotations

from config.setup import ROOT
from tests import train_server

# A test module that uses test_slurm.py's rig fixture, with slurm/rig.sh swapped for a stub that
# fails as the real one does where slurm cannot be installed (exit 3), and CI as given.
USES_CLUSTER = """
import os
from pathlib import Path

import pytest

import tests.test_slurm
from tests.test_slurm import rig  # noqa: F401

tests.test_slurm.RIG = Path({stub!r})


@pytest.fixture(scope="module", autouse=True)
def ci():
    before = os.environ.pop("CI", None)
    os.environ.update({env!r})
    yield
    os.environ.pop("CI", None)
    os.environ.update({{"CI": before}} if before is not None else {{}})


def test_needs_the_rig(rig):
    pass
"""


def test_a_cluster_that_cannot_start_skips_only_outside_ci(tmp_path):
    stub = tmp_path / "rig.sh"
    stub.write_text("echo 'the rig needs root (network and mount namespaces)' >&2\nexit 3\n")
    for name, env in (("test_outside_ci.py", {}), ("test_in_ci.py", {"CI": "true"})):  # one pytest for both
        (tmp_path / name).write_text(USES_CLUSTER.format(stub=str(stub), env=env))
    # `python -m pytest`, forked from the train server: the rig's module imports torch, which the
    # server has imported already, with Hydra, whose pytest plugin pytest then warns it cannot rewrite.
    args = ["-c", str(ROOT / "pytest.ini"), "-o", "addopts=", "-p", "no:xdist", "-p", "no:cacheprovider", "-rA"]
    args += ["-W", "ignore::pytest.PytestAssertRewriteWarning", str(tmp_path)]
    done = train_server.run(args, timeout=120, module="pytest")
    out = done.stdout
    assert done.returncode == 1 and "1 skipped, 1 error" in out, out[-3000:] + done.stderr[-3000:]
    assert "SKIPPED [1] " in out and "test_outside_ci.py" in out.split("SKIPPED [1] ")[1].splitlines()[0], out
    assert "ERROR test_in_ci.py::test_needs_the_rig" in out, out
    assert out.count("cannot start the rig here: the rig needs root") >= 2, out
