"""The resume is decided once, before launch, and each rank opens the checkpoint it continues once:
counted in a resumed DDP(2) run of `python train.py`, with an audit hook in every process it starts
(installed before train.py runs: the forked ranks inherit it). And every rank must see the very
last.pt rank 0 decided on, its step and size, not only its path."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
import torch

from config.schema import ResumePoint
from distributed.context import DistContext
from errors import ConfigError
from tests import train_server
from tests.runs import FORK_RANKS
from training.checkpoint import resume
from training.checkpoint.files import save_checkpoint

# train.py, with each process appending the checkpoint files it opens to a file named after its pid.
AUDITED_TRAIN_PY = """
import os, runpy, sys
def _opened(event, args):
    if event == "open" and isinstance(args[0], (str, os.PathLike)) and os.fspath(args[0]).endswith(".pt"):
        with open(os.path.join({opened!r}, str(os.getpid())), "a") as log:
            log.write(os.fspath(args[0]) + "\\n")
sys.addaudithook(_opened)
runpy.run_path({train_py!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_a_resumed_ddp_run_opens_last_pt_once_in_each_process(tmp_path, ddp_reference):
    run_dir = tmp_path / "run"
    shutil.copytree(ddp_reference, run_dir)
    opened, script = tmp_path / "opened", tmp_path / "audited_train.py"
    opened.mkdir()
    script.write_text(AUDITED_TRAIN_PY.format(opened=str(opened), train_py=str(train_server.TRAIN_PY)))
    # Resumed at its end: nothing left to train, but the pre-flight decides and every rank restores.
    args = [FORK_RANKS, f"hydra.run.dir={run_dir}", "debug=ddp_cpu", "trainer.resume=auto"]
    result = train_server.run(args, script=script)
    assert result.returncode == 0, result.stderr
    assert "nothing to train" in (run_dir / "train.log").read_text()
    last = str(run_dir / "checkpoints" / "last.pt")
    counts = sorted(log.read_text().splitlines().count(last) for log in opened.iterdir())
    # The launching process decides (one open), then each of the two ranks restores (one open each).
    assert counts == [1, 1, 1], counts


def _seen_by_rank_0(monkeypatch, host: str, path: Path, identity: tuple[int, int]) -> None:
    """This process is rank 1 of 2; rank 0, on `host`, saw `identity` (step, bytes) at `path`."""

    def gathered(mine, ctx):
        return [(host, str(path), identity), mine]

    monkeypatch.setattr(resume, "all_gather_object", gathered)


@pytest.mark.parametrize("differs", ["step", "size"])
def test_a_rank_that_sees_another_last_pt_than_rank_0_stops_in_one_line_naming_both(tmp_path, monkeypatch, differs):
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"step": 6, "w": torch.zeros(4)}, path)
    size = path.stat().st_size
    theirs = (7, size) if differs == "step" else (6, size + 8)
    _seen_by_rank_0(monkeypatch, "node-a", path, theirs)
    ctx = DistContext(1, 0, 2, 1, torch.device("cpu"), None)
    with pytest.raises(ConfigError) as refused:
        resume.open_resume(ResumePoint(path, *theirs), tmp_path, ctx)
    assert str(refused.value).startswith(
        f"the run dir is not shared between nodes: rank 0 resumes from {path} (step {theirs[0]}, {theirs[1]} bytes) "
        f"but rank 1 on {socket.gethostname()} sees step 6, {size} bytes at {path}; "
    )


def test_a_rank_that_sees_the_same_last_pt_resumes_from_it(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"step": 6, "w": torch.zeros(4)}, path)
    _seen_by_rank_0(monkeypatch, "node-a", path, (6, path.stat().st_size))
    ctx = DistContext(1, 0, 2, 1, torch.device("cpu"), None)
    assert resume.open_resume(ResumePoint(path, 6, path.stat().st_size), tmp_path, ctx)["step"] == 6
