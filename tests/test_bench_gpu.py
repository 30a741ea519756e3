"""bench.gpu shows a failing train.py run's stderr instead of hiding it."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench import gpu
from tests import train_server


def test_a_failed_time_to_accuracy_run_prints_its_stderr_and_exits_non_zero(tmp_path, monkeypatch):
    # No CIFAR-10 there (and, on a machine without CUDA, no GPU): train.py stops with its one-line error.
    # The run forks from the train server: what bench.gpu does with a failed run is tested, not a cold start.
    def run(cmd: list[str], cwd, **kwargs) -> subprocess.CompletedProcess:
        assert cmd[:2] == [sys.executable, "train.py"] and kwargs == {"capture_output": True, "text": True}
        return train_server.run(cmd[2:], cwd=cwd)

    monkeypatch.setattr(gpu, "subprocess", SimpleNamespace(run=run))
    with pytest.raises(SystemExit) as exited:
        gpu.time_to_accuracy(tmp_path / "no-cifar")
    message = exited.value.code
    assert isinstance(message, str)  # sys.exit(<str>) prints it to stderr and exits 1
    assert "train.py" in message.splitlines()[0] and message.splitlines()[0].endswith("failed:")
    assert any(line.startswith("error: ") for line in message.splitlines()[1:]), message
