"""Checkpoints are written atomically, load with weights_only=True, and refuse the wrong model."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from distributed.context import DistContext, make_context
from errors import ConfigError
from models.mnist_net import MnistNet
from tests.runs import decide_tiny, resume_point
from training.checkpoint.best import BestCheckpoints
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.files import load_checkpoint, save_checkpoint
from training.checkpoint.resume import check_resumable, confirm_shared, find_resume, record_torchrun_job
from training.checkpoint.state import TrainState, host_copy, restore_rng
from training.monitor import Monitor


def test_save_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}, "epoch": 1, "config": "a: 1\n"}, path)
    save_checkpoint({"model": {"w": torch.zeros(2)}, "epoch": 2, "config": "a: 1\n"}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]
    loaded = load_checkpoint(path)
    assert loaded["epoch"] == 2 and torch.equal(loaded["model"]["w"], torch.zeros(2))


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)
    before = path.read_bytes()
    with pytest.raises((pickle.PicklingError, AttributeError)):  # what pickle raises for a local lambda
        save_checkpoint({"epoch": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert path.read_bytes() == before


def test_the_file_is_fsynced_then_renamed_then_its_directory_fsynced(tmp_path, monkeypatch):
    """A crash after the rename finds the new bytes only if they were on disk first, and the new
    directory entry only once the directory is fsynced after it."""
    path = tmp_path / "ckpt" / "last.pt"
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def record_fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def record_replace(src, dst):
        events.append(("replace", Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    save_checkpoint({"epoch": 1}, path)
    # A rename keeps the inode: the file fsynced first is the one now named last.pt.
    assert events == [("fsync", path.stat().st_ino), ("replace", path), ("fsync", path.parent.stat().st_ino)]


def test_a_host_copy_of_host_tensors_shares_no_memory_with_them():
    # .to("cpu") of a CPU tensor is the tensor itself: the step after a save would change the snapshot.
    weight = torch.ones(2)
    copy = host_copy({"model": {"w": weight}, "rng": [weight]})
    weight.fill_(7.0)
    assert torch.equal(copy["model"]["w"], torch.ones(2)) and torch.equal(copy["rng"][0], torch.ones(2))


def test_truncated_checkpoint_is_a_one_line_error(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"model": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ConfigError, match="not a loadable checkpoint"):
        load_checkpoint(path)


def test_a_write_that_fails_midway_leaves_the_previous_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint({"epoch": 2, "model": {"w": torch.ones(1000)}}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_save_that_fails_before_its_temp_file_exists_raises_its_own_error(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("training.checkpoint.files.open", disk_full, raising=False)  # the temp file's open
    with pytest.raises(OSError, match="No space left"):  # not the clean-up's FileNotFoundError
        save_checkpoint({"epoch": 1}, tmp_path / "last.pt")


def _checkpoint(model: nn.Module, best: float = 0.5) -> dict:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": None,
        "epoch": 1,
        "step": 10,
        "best": best,
        "config": "model:\n  _target_: models.mnist_net.MnistNet\n",
    }


def test_a_checkpoint_of_another_shape_names_the_tensor_and_the_model(tmp_path):
    saved = _checkpoint(MnistNet(1, 5, 8))
    with pytest.raises(ConfigError) as error:
        check_resumable(saved, MnistNet(1, 10, 8), tmp_path / "last.pt")
    message = str(error.value)
    assert "fc2.weight" in message and "[5, 128]" in message and "[10, 128]" in message
    assert "models.mnist_net.MnistNet" in message and "\n" not in message


def test_a_checkpoint_with_other_tensor_names_is_refused(tmp_path):
    saved = _checkpoint(MnistNet(1, 10, 8))
    saved["model"]["extra.weight"] = torch.ones(1)
    with pytest.raises(ConfigError, match="extra.weight"):
        check_resumable(saved, MnistNet(1, 10, 8), tmp_path / "last.pt")
    with pytest.raises(ConfigError, match="not a train.py checkpoint"):
        check_resumable({"model": {}}, MnistNet(1, 10, 8), tmp_path / "last.pt")


class _Payload:
    pass


def test_a_pickled_object_is_refused_by_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": _Payload()}, path)
    with pytest.raises(ConfigError, match=r"refused, it holds a pickled Python object \(.*_Payload\)"):
        load_checkpoint(path)


def _checkpointer(directory, model, top_k: int = 1, mode: str = "max", **options):
    ctx = DistContext(0, 0, 1, 1, torch.device("cpu"), None)
    best = BestCheckpoints(Monitor("val/acc", mode), top_k)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Checkpointer(ctx, directory, model, optimizer, None, "a: 1\n", best=best, **options)


def test_best_pt_is_never_replaced_by_a_worse_model_even_from_an_earlier_run(tmp_path):
    model = MnistNet(1, 10, 8)
    first_run = _checkpointer(tmp_path, model)
    first_run.save(TrainState(epoch=1), 0.9)
    first_run.close()
    before = (tmp_path / "best.pt").read_bytes()
    later_run = _checkpointer(tmp_path, model)  # a new run in the same directory
    later_run.save(TrainState(epoch=1), 0.5)
    later_run.wait()
    assert (tmp_path / "best.pt").read_bytes() == before
    later_run.save(TrainState(epoch=2), 0.95)
    later_run.close()
    assert torch.load(tmp_path / "best.pt", weights_only=True)["best_checkpoints"]["kept"][0]["value"] == 0.95
    assert torch.load(tmp_path / "last.pt", weights_only=True)["epoch"] == 2  # the same snapshot


def test_an_equal_score_leaves_best_pt_as_it_was(tmp_path):
    # The first model to reach a score keeps best.pt: a later tie is no improvement.
    model = nn.Linear(2, 1)
    checkpointer = _checkpointer(tmp_path, model)
    checkpointer.save(TrainState(epoch=1), 0.9)
    checkpointer.wait()
    before = (tmp_path / "best.pt").read_bytes()
    with torch.no_grad():
        model.weight.fill_(7.0)
    checkpointer.save(TrainState(epoch=2), 0.9)
    checkpointer.close()
    assert (tmp_path / "best.pt").read_bytes() == before


def test_only_rank_zero_writes_checkpoints(tmp_path):
    """Every rank calls save() (a mid-epoch one gathers their random streams); rank 1 of 2 writes
    nothing, not even under a temp name of its own, while rank 0 writes both files."""
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for rank in (1, 0):
        ctx = make_context(rank, rank, 2, 2, "cpu", use_process_group=False)
        best = BestCheckpoints(Monitor("val/acc"), 1)
        checkpointer = Checkpointer(ctx, tmp_path / f"rank{rank}", model, optimizer, None, "a: 1\n", best=best)
        checkpointer.save(TrainState(epoch=1), 0.9)  # an epoch's end
        checkpointer.save(TrainState(epoch=1, step=3, batch=3))  # mid-epoch
        checkpointer.close()
    assert [p for p in (tmp_path / "rank1").rglob("*") if not p.is_dir()] == []
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == ["best.pt", "last.pt"]


def test_restore_brings_back_the_best_top5_and_whose_weights_were_best(tmp_path):
    model = nn.Linear(2, 1)
    saver = _checkpointer(tmp_path, model)
    saver.save(TrainState(epoch=1, best_val_acc=0.8, best_val_acc5=0.9, best_weights="ema"))
    saver.close()
    state = _checkpointer(tmp_path, model).restore(resume_point(tmp_path / "last.pt"))
    assert (state.best_val_acc5, state.best_weights) == (0.9, "ema")


def test_a_save_is_the_state_at_the_call_and_written_in_the_background(tmp_path):
    """Training goes on while the file is written; what lands is the state when save was called."""
    model = torch.nn.Linear(2, 1)
    checkpointer = _checkpointer(tmp_path, model)
    checkpointer.save(TrainState(epoch=1, step=5))
    with torch.no_grad():
        model.weight.fill_(7.0)  # the next steps, before the write may have finished
    checkpointer.save(TrainState(epoch=1, step=6))
    checkpointer.close()
    assert checkpointer._writer is not None and checkpointer._pending == []
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert saved["step"] == 6 and torch.equal(saved["model"]["weight"], torch.full((1, 2), 7.0))


def test_a_failed_background_write_raises_at_a_later_save_or_at_close(tmp_path, monkeypatch):
    checkpointer = _checkpointer(tmp_path, torch.nn.Linear(2, 1))

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    checkpointer.save(TrainState(epoch=1))
    checkpointer.save(TrainState(epoch=2))  # queued behind the first: nothing waited for yet
    with pytest.raises(OSError, match="No space left"):
        checkpointer.save(TrainState(epoch=3))  # waits for the first write, which failed
    with pytest.raises(OSError, match="No space left"):
        checkpointer.close()  # the second failed too
    assert not (tmp_path / "last.pt").exists()


def test_a_whole_file_last_pt_deletes_the_sharded_one_it_replaces(tmp_path):
    # An fsdp run's sharded last.pt, resumed in its run dir under single or ddp: the whole file that
    # replaces its link leaves no directory behind; until then a failed save leaves it in place.
    from training.checkpoint.sharded import commit

    directory = tmp_path / "checkpoints"
    for step in (3, 6):  # the second commit deletes the first version, as every fsdp save does
        (directory / ".last.pt.shards.tmp").mkdir(parents=True)
        (directory / ".last.pt.shards.tmp" / ".metadata").write_bytes(b"shards")
        commit(directory / ".last.pt.shards.tmp", directory / "last.pt", f"last.pt.step{step}.abc123")
    assert sorted(p.name for p in directory.iterdir()) == ["last.pt", "last.pt.step6.abc123"]
    with pytest.raises((pickle.PicklingError, AttributeError)):  # what pickle raises for a local lambda
        save_checkpoint({"bad": lambda: None}, directory / "last.pt")
    assert (directory / "last.pt" / ".metadata").read_bytes() == b"shards"
    save_checkpoint({"epoch": 2}, directory / "best.pt")
    save_checkpoint({"epoch": 2}, directory / "last.pt")
    assert sorted(p.name for p in directory.iterdir()) == ["best.pt", "last.pt"]
    assert load_checkpoint(directory / "last.pt") == {"epoch": 2}


def test_resume_auto_finds_last_pt_or_starts_fresh(tmp_path):
    assert find_resume("auto", tmp_path) is None
    save_checkpoint({"epoch": 1}, tmp_path / "checkpoints" / "last.pt")
    assert find_resume("auto", tmp_path) == tmp_path / "checkpoints" / "last.pt"
    assert find_resume("/elsewhere/best.pt", tmp_path) == Path("/elsewhere/best.pt")
    # Another run's dir: its last.pt, as auto takes this run dir's.
    assert find_resume(str(tmp_path), tmp_path / "new") == tmp_path / "checkpoints" / "last.pt"
    assert find_resume(f"{tmp_path}/checkpoints", tmp_path / "new") == tmp_path / "checkpoints" / "last.pt"
    assert find_resume(None, tmp_path) is None


def test_a_job_slurm_restarted_resumes_unless_told_otherwise(tmp_path):
    """A requeued job (the template's, or submitit's, which reruns the same command) continues."""
    save_checkpoint({"epoch": 1}, tmp_path / "checkpoints" / "last.pt")
    restarted = {"SLURM_RESTART_COUNT": "1"}
    assert find_resume(None, tmp_path, restarted) == tmp_path / "checkpoints" / "last.pt"
    assert find_resume(None, tmp_path, {"SLURM_RESTART_COUNT": "0"}) is None
    assert find_resume("/elsewhere/best.pt", tmp_path, restarted) == Path("/elsewhere/best.pt")


TORCHRUN_JOB = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0", "RANK": "0"}


def test_a_start_of_the_torchrun_job_a_run_dir_recorded_resumes_another_jobs_does_not(tmp_path):
    """torchrun's restart count is each agent's: a node that joins a restarted job counts 0. Every node
    shares the job's rendezvous id, which the run dir recorded at the job's first start."""
    record_torchrun_job(tmp_path, TORCHRUN_JOB)
    record_torchrun_job(tmp_path, TORCHRUN_JOB | {"TORCHELASTIC_RUN_ID": "other", "RANK": "1"})  # rank 0 alone writes
    last = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint({"epoch": 1}, last)
    restarted = TORCHRUN_JOB | {"TORCHELASTIC_RESTART_COUNT": "1"}
    joined = TORCHRUN_JOB | {"RANK": "2"}  # a node that joined the restarted job: its agent counts 0
    assert find_resume(None, tmp_path, restarted) == find_resume(None, tmp_path, joined) == last
    # Another torchrun command (--standalone draws a fresh id), one without an id, a spawned run: a first start.
    for first in ({"TORCHELASTIC_RUN_ID": "def"}, {"TORCHELASTIC_RUN_ID": "none"}, {}):
        assert find_resume(None, tmp_path, restarted | first if first else {}) is None
    assert find_resume("/elsewhere/best.pt", tmp_path, restarted) == Path("/elsewhere/best.pt")


def test_a_torchrun_start_records_its_job_once_the_pre_flight_lets_it_train(tmp_path, monkeypatch):
    """A first start of another job over a run dir's last.pt is refused, and leaves the record as it was."""
    for var, value in TORCHRUN_JOB.items():
        monkeypatch.setenv(var, value)

    def check() -> None:
        decide_tiny(tmp_path)

    check()
    assert (tmp_path / "torchrun_run_id").read_text() == "abc"
    model = MnistNet(1, 10, 8).state_dict()
    last = {"model": model, "optimizer": {}, "scheduler": None, "epoch": 1, "step": 3, "best": 0.5}
    save_checkpoint(last, tmp_path / "checkpoints" / "last.pt")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    check()  # the same job again: it resumes
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "def")
    with pytest.raises(ConfigError, match="already holds checkpoints/last.pt; continue it with trainer.resume=auto"):
        check()
    assert (tmp_path / "torchrun_run_id").read_text() == "abc"


def test_a_temp_dir_a_rank_cannot_see_stops_it_in_one_line(tmp_path):
    """strategy=fsdp: rank 0 makes the temp dir every rank writes its shards into; a rank on a node
    that does not share the run dir would write them where rank 0 never looks."""
    ctx = DistContext(0, 0, 1, 1, torch.device("cpu"), None)
    (tmp_path / ".last.pt.shards.tmp").mkdir()
    confirm_shared(tmp_path / ".last.pt.shards.tmp", ctx)
    with pytest.raises(ConfigError, match=r"^the run dir is not shared between nodes: rank 0 made .* but rank 0 on "):
        confirm_shared(tmp_path / "elsewhere" / ".last.pt.shards.tmp", ctx)


def test_a_gpu_runs_random_streams_resumed_on_the_cpu_restore_the_host_stream_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *args: calls.append(args))
    torch.manual_seed(3)
    host = torch.get_rng_state()
    torch.manual_seed(4)
    restore_rng([host, torch.zeros(16, dtype=torch.uint8)], make_context(0, 0, 1, 1, "cpu", use_process_group=False))
    assert torch.equal(torch.get_rng_state(), host) and calls == []
