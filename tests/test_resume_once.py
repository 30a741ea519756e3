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
from models.mnist_net import MnistNet
from tests import train_server
from tests.runs import FORK_RANKS, decide_tiny
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


RANK_1 = DistContext(1, 0, 2, 1, torch.device("cpu"), None)
ALONE = DistContext(0, 0, 1, 1, torch.device("cpu"), None)


def _seen_by_rank_0(monkeypatch, host: str, path: Path | None, identity: tuple[int, int] | None) -> None:
    """This process is rank 1 of 2; rank 0, on `host`, saw `identity` (step, bytes) at `path`."""

    def gathered(mine, ctx):
        assert ctx is RANK_1
        return [(host, path and str(path), identity), mine]

    monkeypatch.setattr(resume, "all_gather_object", gathered)


def _last_pt(tmp_path: Path, **contents) -> tuple[Path, ResumePoint]:
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"step": 6, "w": torch.zeros(4), **contents}, path)
    return path, ResumePoint(path, 6, path.stat().st_size)


def _mapped_from(tensor: torch.Tensor, path: Path) -> bool:
    """Whether the tensor's memory is a mapping of the file (Linux's /proc/self/maps)."""
    address = tensor.untyped_storage().data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # address range, permissions, offset, device, inode, the file if any
        low, high = (int(end, 16) for end in fields[0].split("-"))
        if fields[5:] == [str(path)] and low <= address < high:
            return True
    return False


def test_one_process_restores_the_file_the_pre_flight_read_mapped_not_copied(tmp_path):
    path, point = _last_pt(tmp_path)
    checkpoint = resume.open_resume(point, tmp_path, ALONE)
    assert checkpoint["step"] == 6 and _mapped_from(checkpoint["w"], path)


def test_the_pre_flights_own_read_is_restored_from_and_a_stale_one_is_not(tmp_path, monkeypatch):
    path, point = _last_pt(tmp_path)
    kept = {"step": 6, "kept": True}
    monkeypatch.setitem(resume._opened, path, (point, kept))
    assert resume.open_resume(point, tmp_path, ALONE) is kept
    assert path not in resume._opened  # held until the restore, not for the process's life
    monkeypatch.setitem(resume._opened, path, (ResumePoint(path, 5, point.size), kept))  # another read's
    assert "kept" not in resume.open_resume(point, tmp_path, ALONE)


@pytest.mark.parametrize("now", ["another step", "a foreign file"])
def test_one_process_stops_in_one_line_when_last_pt_changed_after_the_pre_flight(tmp_path, now):
    path, point = _last_pt(tmp_path)
    if now == "another step":
        save_checkpoint({"step": 7, "w": torch.zeros(4)}, path)
    else:  # not train.py's: no step
        save_checkpoint({"w": torch.zeros(4)}, path)
    step = 7 if now == "another step" else -1
    with pytest.raises(ConfigError) as refused:
        resume.open_resume(point, tmp_path, ALONE)
    assert str(refused.value) == (
        f"trainer.resume={path} changed after the pre-flight read it (step 6, {point.size} bytes; now step {step}, "
        f"{path.stat().st_size} bytes); run again to resume from it as it is now"
    )


def test_a_sharded_last_pt_is_confirmed_from_its_listing_and_left_for_dcp_to_read(tmp_path):
    version = tmp_path / "checkpoints" / "last.pt.step6.3fa9c1"  # sharded.py's names
    version.mkdir(parents=True)
    (version / ".metadata").write_bytes(b"x" * 10)
    (version / "__0_0.distcp").write_bytes(b"x" * 90)
    path = tmp_path / "checkpoints" / "last.pt"
    path.symlink_to(version.name)
    assert resume.open_resume(ResumePoint(path, 6, 100), tmp_path, ALONE) is None
    with pytest.raises(ConfigError, match=r"read it \(step 5, 100 bytes; now step 6, 100 bytes\)"):
        resume.open_resume(ResumePoint(path, 5, 100), tmp_path, ALONE)


def test_a_rank_that_sees_a_last_pt_where_rank_0_starts_afresh_or_none_where_it_resumes_stops(tmp_path, monkeypatch):
    path, point = _last_pt(tmp_path)
    host = socket.gethostname()
    _seen_by_rank_0(monkeypatch, "node-a", None, None)
    with pytest.raises(ConfigError) as refused:
        resume.open_resume(point, tmp_path, RANK_1)
    assert str(refused.value).startswith(
        f"the run dir is not shared between nodes: rank 0 starts afresh but rank 1 on {host} sees step 6, "
        f"{point.size} bytes at {path}; "
    )
    _seen_by_rank_0(monkeypatch, "node-a", path, (6, point.size))
    with pytest.raises(ConfigError) as refused:
        resume.open_resume(None, tmp_path, RANK_1)
    assert str(refused.value).startswith(
        f"the run dir is not shared between nodes: rank 0 resumes from {path} (step 6, {point.size} bytes) "
        f"but rank 1 on {host} sees no checkpoint at {tmp_path / 'checkpoints' / 'last.pt'}; "
    )


@pytest.mark.parametrize("differs", ["step", "size"])
def test_a_rank_that_sees_another_last_pt_than_rank_0_stops_in_one_line_naming_both(tmp_path, monkeypatch, differs):
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"step": 6, "w": torch.zeros(4)}, path)
    size = path.stat().st_size
    theirs = (7, size) if differs == "step" else (6, size + 8)
    _seen_by_rank_0(monkeypatch, "node-a", path, theirs)
    with pytest.raises(ConfigError) as refused:
        resume.open_resume(ResumePoint(path, *theirs), tmp_path, RANK_1)
    assert str(refused.value).startswith(
        f"the run dir is not shared between nodes: rank 0 resumes from {path} (step {theirs[0]}, {theirs[1]} bytes) "
        f"but rank 1 on {socket.gethostname()} sees step 6, {size} bytes at {path}; "
    )


def test_a_rank_that_sees_the_same_last_pt_resumes_from_it(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"step": 6, "w": torch.zeros(4)}, path)
    _seen_by_rank_0(monkeypatch, "node-a", path, (6, path.stat().st_size))
    assert resume.open_resume(ResumePoint(path, 6, path.stat().st_size), tmp_path, RANK_1)["step"] == 6


# A train.py checkpoint of the model _decide builds, less its step (_last_pt's).
TRAINED = {"model": MnistNet(1, 10, 8).state_dict(), "optimizer": {}, "scheduler": None, "epoch": 1, "best": 0.5}


def test_the_pre_flight_decides_the_point_and_keeps_what_it_read_only_in_a_process_that_restores(tmp_path, monkeypatch):
    assert decide_tiny(tmp_path, resume="auto") is None  # nothing to resume: afresh
    path, point = _last_pt(tmp_path, **TRAINED)
    monkeypatch.setattr(resume, "_opened", {})
    assert decide_tiny(tmp_path, resume="auto") == point == ResumePoint(path, 6, path.stat().st_size)
    assert resume._opened == {}  # a launcher that starts ranks holds no checkpoint in memory meanwhile
    decided = decide_tiny(tmp_path, restores_here=True, resume="auto")
    held_point, held = resume._opened[path]
    assert held_point == decided == point and held["step"] == 6 and _mapped_from(held["model"]["fc2.bias"], path)


def test_a_run_without_a_run_dir_decides_without_recording_a_torchrun_job(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")  # the record goes in the run dir: none here
    monkeypatch.setenv("RANK", "0")
    path, point = _last_pt(tmp_path, **TRAINED)
    assert decide_tiny(None, resume=str(path)) == point
