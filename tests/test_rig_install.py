"""slurm/rig.sh's install of slurm and munge, on a machine without them (a fresh CI machine): the
test modules that each bring a rig up start at once, and so do their installs. A PATH that hides
this machine's slurm, and an apt-get that, like dpkg, refuses a second caller while one holds its
lock, stand in for the fresh machine; no root is needed and nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.fake_apt import fake_apt_get

RIG = Path(__file__).resolve().parents[1] / "slurm" / "rig.sh"

# What rig.sh runs before and during an install; slurm's and munge's commands are left out.
TOOLS = ("bash", "realpath", "dirname", "md5sum", "cut", "mkdir", "flock", "sleep", "chmod", "cat")

FAKE_APT_GET = fake_apt_get(
    """  for command in slurmctld slurmd srun munged; do printf '#!/bin/sh\\n' > "$FAKE/bin/$command"; done
  chmod +x "$FAKE"/bin/*
"""
)


def test_two_rigs_installing_at_once_on_a_machine_without_slurm_both_succeed_with_one_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": str(bin_dir), "FAKE": str(tmp_path), "RIG_INSTALL_LOCK": str(tmp_path / "rig.lock")}
    rigs = [
        subprocess.Popen(["bash", str(RIG), "install"], env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    errors = [rig.communicate(timeout=60)[1] for rig in rigs]
    assert [rig.returncode for rig in rigs] == [0, 0], errors
    # The second waited for the first, then found slurm installed: one update, one install.
    assert (tmp_path / "calls").read_text().split() == ["update", "install"]
