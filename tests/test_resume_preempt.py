"""Killed, preempted and failing runs of `python train.py`: nothing lost, nothing left behind."""

from __future__ import annotations

import json
import math
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import train_server
from tests.runs import FORK_RANKS, run_train

pytestmark = pytest.mark.slow

# 8 batches x 3 epochs; checkpoints every step, so kills land on every kind of moment.
TINY = ["debug=limit", "trainer.limit_train_batches=8"]
# The same math, 50 ms a forward: a signal sent once a run has logged a line lands while it trains
# (TINY alone can train to its end in the 0.3 s a loaded machine takes to read the line and signal).
SLOW = ["model._target_=tests.faults.SlowNet", "+model.delay_s=0.05"]
DDP = ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


class Run:
    """`python train.py` in the background, leading a session of its own: every process it starts
    (ranks, a forkserver, the resource tracker) is in it, orphans included, and can be found."""

    def __init__(self, run_dir: Path, *overrides: str, background: bool = False, nohup: bool = False) -> None:
        """Forked from the train server (tests/train_server.py); with `background`, started as a
        script's `python train.py ... &` is, with SIGINT ignored; with `nohup`, with SIGHUP ignored."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.out = open(run_dir.parent / f"{run_dir.name}-{uuid.uuid4().hex}.out", "w+")
        args = [f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *overrides]
        ignored = (signal.SIGINT,) * background + (signal.SIGHUP,) * nohup
        self.proc = train_server.start(args, Path(self.out.name), ignored=ignored)

    def kill(self) -> None:
        """kill -9 the whole job at once, as a node failure or SLURM's step kill does: train.py and
        every rank it started, so no rank lives on to finish a write after the moment."""
        for pid in [self.proc.pid, *self._processes()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # gone since
                pass
        self.finish()

    def wait_for(self, ready, timeout: float = 180, poll: float = 0.02) -> None:
        """Poll `ready()` every `poll` s; fail if the run ends first. 20 ms: a finer poll steals CPU from
        the run on a 2-core machine, and a log line stays."""
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended before the moment came:\n{self.output()}"
            assert time.monotonic() < deadline, self.output()
            time.sleep(poll)

    def logged(self, text: str) -> bool:
        log = self.run_dir / "train.log"
        return log.exists() and text in log.read_text()

    def finish(self, timeout: float = 180) -> int:
        code = self.proc.wait(timeout)
        self.out.close()
        return code

    def output(self) -> str:
        if not self.out.closed:
            self.out.flush()
        return Path(self.out.name).read_text()

    def leftovers(self, settle_s: float = 10.0) -> list[str]:
        """Command lines of processes this run started (in its session) still alive
        `settle_s` after it ended: helpers such as multiprocessing's resource tracker leave only
        once they notice their parent is gone."""
        deadline = time.monotonic() + settle_s
        while (found := self._processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return [_cmdline(pid) for pid in found]

    def _processes(self) -> list[int]:
        """The processes of this run's session (train.py's pid is its id)."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit():
                    stat = (entry / "stat").read_text()
                    if int(stat[stat.rindex(")") + 2 :].split()[3]) == self.proc.pid:  # state ppid pgrp session
                        found.append(int(entry.name))
            except OSError:  # gone since
                pass
        return found


def kill_inside_a_checkpoint_write(run_dir: Path, args: tuple[str, ...], whole: Callable[[], bool]) -> None:
    """SIGKILL a run of `args` in the middle of writing last.pt, its first 64 KiB written, leave its
    temp file as such a kill leaves it (a regular file, cut short), and check that the previous
    last.pt is still `whole()`.

    The temp file is a FIFO this test reads, so the writer cannot pass the pipe's buffer until the
    test reads on: the kill lands inside the write every time, however busy the machine. (Polling for
    a temp file that lives 2 ms missed it 5 times in a row under the suite's load.)"""
    tmp = run_dir / "checkpoints" / ".last.pt.tmp"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)  # an earlier kill's, when it too landed inside a write
    os.mkfifo(tmp)
    reader = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK)  # a reader already there: the writer's open goes on
    written = bytearray()
    try:
        run = Run(run_dir, *args)
        run.wait_for(lambda: _read_into(reader, written, up_to=64 * 1024) >= 64 * 1024)
        run.kill()
        _read_into(reader, written)  # what it wrote before it died, still in the pipe
    finally:
        os.close(reader)
        tmp.unlink()
    tmp.write_bytes(written)
    assert whole(), "the kill damaged the previous last.pt"


def _read_into(fd: int, buffer: bytearray, up_to: int | None = None) -> int:
    """Read what the pipe `fd` holds now into `buffer`, until it holds `up_to` bytes; its length."""
    while up_to is None or len(buffer) < up_to:
        try:
            chunk = os.read(fd, 65536 if up_to is None else up_to - len(buffer))
        except BlockingIOError:  # empty, its writer still there
            break
        if not chunk:  # no writer: not yet opened, or gone
            break
        buffer += chunk
    return len(buffer)


def _cmdline(pid: int) -> str:
    try:
        return f"{pid}: " + (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # gone since
        return f"{pid}: (exited)"


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def _assert_same_weights(resumed: dict, uninterrupted: dict) -> None:
    assert (resumed["epoch"], resumed["step"]) == (uninterrupted["epoch"], uninterrupted["step"])
    for key, value in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][key], value), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    result = run_train(run_dir, *TINY)
    assert result.returncode == 0, result.stderr
    return _checkpoint(run_dir)


def test_kill_9_at_any_moment_then_resume_auto_ends_bitwise_equal(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    args = (*TINY, *SLOW, "trainer.checkpoint_every_n_steps=1", "trainer.resume=auto")
    # During an epoch: between the end-of-epoch checkpoint and the next.
    run = Run(run_dir, *args)
    run.wait_for(lambda: run.logged("epoch 1/3"))
    run.kill()
    _checkpoint(run_dir)  # readable
    kill_inside_a_checkpoint_write(run_dir, args, whole=lambda: _checkpoint(run_dir)["step"] > 0)
    result = run_train(run_dir, *args)
    assert result.returncode == 0, result.stderr
    assert "from epoch" in (run_dir / "train.log").read_text()
    _assert_same_weights(_checkpoint(run_dir), uninterrupted)


def test_sigterm_saves_mid_epoch_and_resume_continues_exactly(tmp_path, uninterrupted):
    sig = signal.SIGTERM
    run_dir = tmp_path / "run"
    run = Run(run_dir, *TINY, *SLOW)
    # After the first epoch: the resumed epoch is one whose order the sampler's default epoch (0) is not.
    run.wait_for(lambda: run.logged("epoch 1/3"))
    run.proc.send_signal(sig)
    assert run.finish() == 128 + sig, run.output()
    output = run.output()
    assert f"preempted by {sig.name}" in output and "Traceback" not in output
    assert f"hydra.run.dir={run_dir}" in output and "trainer.resume=auto" in output
    stopped = _checkpoint(run_dir)
    assert f"SIGTERM: every rank stops after step {stopped['step']};" in (run_dir / "train.log").read_text()
    assert stopped["epoch"] >= 1
    result = run_train(run_dir, *TINY, *SLOW, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr
    _assert_same_weights(_checkpoint(run_dir), uninterrupted)


def test_a_run_stopped_at_an_epochs_last_batch_resumes_with_its_figures_and_no_made_up_speed(tmp_path):
    """Stopped after the epoch's last batch, before its validation: the resume trains none of that
    epoch, yet its line said 628592 samples/s (the epoch's samples over the resume's instant), and
    the run's median took it. Its figures are the whole epoch's; its speed is none (nan)."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    assert run_train(whole, *TINY).returncode == 0
    signaling = ["model._target_=tests.faults.SignalingNet", "+model.at_step=8", f"+model.once={tmp_path / 'sent'}"]
    assert run_train(run_dir, *TINY, *signaling).returncode == 128 + signal.SIGTERM
    assert _checkpoint(run_dir)["batch"] == 8  # TINY's every batch
    result = run_train(run_dir, *TINY, *signaling, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr

    def first_epoch(run: Path) -> str:
        return next(line for line in (run / "train.log").read_text().splitlines() if "epoch 1/3  train" in line)

    resumed = first_epoch(run_dir)
    assert resumed.split("epoch 1/3")[1].split("best")[0] == first_epoch(whole).split("epoch 1/3")[1].split("best")[0]
    assert "  nan samples/s" in resumed
    assert math.isfinite(json.loads((run_dir / "metrics.json").read_text())["train_samples_per_s"])
    _assert_same_weights(_checkpoint(run_dir), _checkpoint(whole))


def test_a_signal_to_every_rank_as_a_checks_all_reduce_returns_stops_the_job_at_the_next_check(run_dir):
    """The rank's handler runs as the check's all-reduce returns, after the flags were reduced: the
    job stops at the next check and saves, where it once trained on as though no signal had come."""
    late = ["+callbacks.late._target_=tests.faults.SignalAsACheckReturns", "+callbacks.late.check=3"]
    result = run_train(run_dir, *DDP, *TINY, *late)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    stopped = (run_dir / "train.log").read_text()
    assert "SIGTERM: every rank stops after step" in stopped and "epoch 3/3" not in stopped
    assert _checkpoint(run_dir)["step"] < 3 * 8  # TINY: 3 epochs of 8 batches


def test_sigusr1_to_a_ddp_run_saves_and_resume_continues_exactly(tmp_path):
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    assert run_train(whole, *DDP, *TINY).returncode == 0
    run = Run(run_dir, *DDP, *TINY, *SLOW, "trainer.preempt_grace_s=0.1")  # the ranks agree at every step
    run.wait_for(lambda: run.logged("from epoch 1"))
    run.proc.send_signal(signal.SIGUSR1)  # to train.py only: it passes the signal on to the ranks
    assert run.finish() == 128 + signal.SIGUSR1, run.output()
    assert "trainer.resume=auto" in run.output() and "Traceback" not in run.output()
    assert run.leftovers() == []
    stopped = _checkpoint(run_dir)
    if stopped["batch"]:
        assert len(stopped["rng"]) == 2  # each rank's random stream, to continue mid-epoch
    result = run_train(run_dir, *DDP, *TINY, *SLOW, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr
    _assert_same_weights(_checkpoint(run_dir), _checkpoint(whole))


def test_ctrl_c_saves_a_ddp_run_where_it_stopped(tmp_path):
    """Ctrl-C, the terminal's SIGINT to every process of its foreground group, ended the ranks in a
    KeyboardInterrupt's traceback, with what the epoch had trained lost. It is now a preemption: saved
    where the ranks stopped, exit 130, the command that resumes it. Here train.py passes it on to its
    ranks 1.5 s late, as a busy machine can: the ranks took that copy for a second Ctrl-C, which
    stops at once, and the job ended unsaved."""
    run_dir, hold = tmp_path / "run", tmp_path / "hold"
    # The ranks wait in their third forward (the pre-flight's model makes two), their first checks
    # past, until the copy has landed; they stop at the next check, at the epoch's end.
    hold.touch()
    run = Run(run_dir, *DDP, *TINY, *SLOW, f"+model.hold={hold}", "+model.hold_from=3")
    try:
        run.wait_for(Path(f"{hold}.reached").exists)
        os.kill(run.proc.pid, signal.SIGSTOP)
        os.killpg(run.proc.pid, signal.SIGINT)
        time.sleep(1.5)
        os.kill(run.proc.pid, signal.SIGCONT)
        time.sleep(1)
    finally:
        hold.unlink()
    assert run.finish() == 128 + signal.SIGINT, run.output()
    assert "interrupted by Ctrl-C (SIGINT): last.pt is saved; resume with: python train.py" in run.output()
    assert "Traceback" not in run.output() and run.leftovers() == []
    log = (run_dir / "train.log").read_text()
    assert f"SIGINT: every rank stops after step {_checkpoint(run_dir)['step']};" in log


def test_a_run_whose_terminal_hangs_up_saves_where_it_stopped(tmp_path):
    """SIGHUP, what the kernel sends a terminal's jobs when it closes or its ssh session drops,
    killed the run at once, the epoch in progress lost. The command that resumes it gives Hydra's own
    overrides again too."""
    run = Run(tmp_path / "run", "hydra/hydra_logging=disabled", *TINY, *SLOW)
    run.wait_for(lambda: run.logged("from epoch 1"))
    os.killpg(run.proc.pid, signal.SIGHUP)
    assert run.finish() == 128 + signal.SIGHUP, run.output()
    said = "preempted by SIGHUP: last.pt is saved; resume with: python train.py hydra/hydra_logging=disabled "
    assert said in run.output() and "hydra.mode" not in run.output(), run.output()
    assert _checkpoint(tmp_path / "run")["step"] > 0


def test_a_ddp_run_under_nohup_trains_on_when_its_terminal_hangs_up(tmp_path):
    """nohup starts a run with SIGHUP ignored, meant to outlive its terminal: neither the launcher
    nor its ranks take it (trainer.preempt_signals has it)."""
    run = Run(tmp_path / "run", *DDP, FORK_RANKS, *TINY, *SLOW, nohup=True)
    run.wait_for(lambda: run.logged("from epoch 1"))
    os.killpg(run.proc.pid, signal.SIGHUP)
    assert run.finish() == 0, run.output()
    assert "SIGHUP" not in run.output() and run.leftovers() == []


@pytest.mark.parametrize("job", [DDP, []], ids=["ddp", "single"])
def test_a_second_ctrl_c_to_a_hung_run_exits_130_in_one_line(tmp_path, job):
    """A second Ctrl-C stops a run at once: here one hung in its forward, which no check reaches. Its
    KeyboardInterrupt (or that of one that lands as the ranks start, before their watch takes SIGINT)
    was swallowed by torch's wrapper: the rank exited 0 and the job reported its peer's broken
    connection, `rank 1 failed: RuntimeError: ... Connection closed by peer`, exit 1 (as the ranks
    started: exit 0, nothing trained). A single run's, in train.py's own process, was a traceback.
    It is an interruption: exit 130, in one line."""
    hung = tmp_path / "hung"
    hanging = ["model._target_=tests.faults.HangingNet", "+model.hang_rank=0", f"+model.hung_file={hung}"]
    run = Run(tmp_path / "run", *job, *TINY, *hanging)
    run.wait_for(hung.exists)
    os.killpg(run.proc.pid, signal.SIGINT)
    time.sleep(1.5)  # a Ctrl-C of its own, not the first one's copy
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish(timeout=60) == 128 + signal.SIGINT, run.output()
    output = run.output()
    said = "interrupted by Ctrl-C (SIGINT) before the ranks saved last.pt; continue from the last save, if any, with:"
    assert said in output and "failed" not in output and "Traceback" not in output, output
    assert run.leftovers() == []


def test_ctrl_c_in_the_pre_flight_exits_130_in_one_line_and_the_dirs_record_stays(tmp_path):
    """Ctrl-C before any rank ran (here as the pre-flight builds the model for its check) was a
    KeyboardInterrupt's traceback, and the run dir's .hydra/ then held the command that never ran,
    in place of the run it had finished."""
    run_dir = tmp_path / "run"
    assert run_train(run_dir, *TINY).returncode == 0
    record = (run_dir / ".hydra" / "overrides.yaml").read_text()
    ctrl_c = ["model._target_=tests.faults.SignalingNet", "+model.at_step=0", f"+model.signum={int(signal.SIGINT)}"]
    stopped = run_train(run_dir, *TINY, "trainer.epochs=5", *ctrl_c)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 128 + signal.SIGINT and "Traceback" not in output, output
    said = "interrupted by Ctrl-C (SIGINT) before the ranks saved last.pt; continue from the last save, if any, with:"
    assert said in output and "trainer.resume=auto" in output, output
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == record


def test_a_save_that_fails_as_a_ddp_job_stops_on_sigterm_is_the_error_reported(tmp_path):
    """Preempted by SIGTERM, rank 0 could not write last.pt (here a directory where its temp file
    goes; a full disk alike), and its peer, slow to leave, was stopped by torch's own SIGTERM. The
    job said "preempted by SIGTERM before the ranks saved last.pt", exit 143: the error to fix was
    hidden, and a requeue would start the job again on the same disk."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".last.pt.tmp").mkdir(parents=True)
    slow_exit = ["+callbacks.slow_exit._target_=tests.faults.SlowExit", "+callbacks.slow_exit.rank=1"]
    run = Run(run_dir, *DDP, *TINY, *SLOW, "trainer.preempt_grace_s=0.1", *slow_exit)
    run.wait_for(lambda: run.logged("from epoch 1"))
    run.proc.send_signal(signal.SIGTERM)  # to train.py only: it passes the signal on to the ranks
    assert run.finish() == 1, run.output()
    output = run.output()
    assert "error: rank 0 failed: IsADirectoryError: [Errno 21] Is a directory:" in output, output
    # Rank 0's traceback, logged above the line, shows the Preempted its failed save cut short.
    assert "before the ranks saved last.pt" not in output and "resume with" not in output
    assert not (run_dir / "checkpoints" / "last.pt").exists()
    assert run.leftovers() == []


def test_ranks_end_with_a_killed_launcher_started_in_the_background(tmp_path):
    # Started as `python train.py ... &` is, with SIGINT ignored: the signal the kernel sends a
    # spawned rank when its launcher dies. 1,000 epochs: orphans left training would outlive the wait.
    run_dir = tmp_path / "run"
    run = Run(run_dir, *DDP, *TINY, "trainer.epochs=1000", "trainer.checkpoint_every_n_steps=1", background=True)
    try:
        run.wait_for((run_dir / "checkpoints" / "last.pt").exists)
        run.proc.kill()  # train.py alone, as the OOM killer would
        run.finish()
        # The ranks stop as preempted ranks do, within trainer.preempt_grace_s (30 s): they usually leave
        # in ~2 s, but the suite's load once kept them past a 10 s wait.
        assert run.leftovers(settle_s=30) == [], run.output()[-3000:]
    finally:
        run.kill()  # whatever outlived the check


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("", "RuntimeError: injected failure on rank 1"),
        ("+model.kill=true", "killed by SIGKILL (by hand, or by the kernel when memory ran out: `dmesg` says"),
    ],
)
def test_a_failing_rank_ends_the_ddp_job_naming_it_and_leaves_no_process(monkeypatch, tmp_path, fault, reason):
    run_dir, temp = tmp_path / "run", tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # where torch has each spawned rank write its traceback
    faulty = ["model._target_=tests.faults.FailingNet", "+model.at_step=3", *([fault] if fault else [])]
    run = Run(run_dir, *DDP, *TINY, "launcher.timeout_s=20", *faulty)
    run.wait_for(lambda: run.logged("from epoch 1"))  # training starts; rank 1 fails at its 3rd step
    start = time.monotonic()
    code = run.finish(timeout=120)
    elapsed = time.monotonic() - start
    assert code == 1, run.output()
    assert f"error: rank 1 failed: {reason}" in run.output()
    log = (run_dir / "train.log").read_text()
    assert "rank 1 failed" in log
    # Where the rank's code raised, which the one line cannot say; a killed rank raised nothing.
    assert ('tests/faults.py", line' in log) == (not fault), log
    assert elapsed < 20, f"{elapsed:.0f} s from the start of training to the end of the job"
    assert run.leftovers() == []
    assert list(temp.iterdir()) == []  # and no file: the tracebacks were read, then removed


# The recipe's stateful parts: mixing draws, the EMA (every 2 steps), per-step warmup, repeated augmentation.
RECIPE = [
    "trainer.mixup_alpha=0.2",
    "trainer.cutmix_alpha=1.0",
    "trainer.ema_decay=0.99",
    "trainer.ema_every_n_steps=2",
    "scheduler.warmup_epochs=1",
    "data.repeated_augmentations=2",
]


def test_kill_9_mid_epoch_with_mixing_and_ema_then_resume_ends_bitwise_equal(tmp_path):
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    assert run_train(whole, *TINY, *RECIPE).returncode == 0
    args = (*TINY, *RECIPE, "trainer.checkpoint_every_n_steps=1", "trainer.resume=auto")
    # The model summary's forward (on the meta device) comes first, then epoch 1's 8 training
    # forwards and 2 validation ones (the debug presets draw no sample grid; the EMA's copy counts
    # its own): forward 15 is epoch 2's fourth batch, killed (SIGKILL)
    # just after its third step's save went to the background writer, so last.pt holds that step
    # or, when the kill beat the writes, one of the two before (a save waits only for the write
    # before the one in flight): each is whole.
    killer = ["model._target_=tests.faults.FailingNet", "+model.fail_rank=0", "+model.at_step=15", "+model.kill=true"]
    run = Run(run_dir, *args, *killer)
    assert run.finish() == -9, run.output()
    stopped = _checkpoint(run_dir)
    assert (stopped["epoch"], stopped["step"] - stopped["batch"]) == (1, 8) and stopped["batch"] in (1, 2, 3)
    assert stopped["ema"] is not None and stopped["rng"] is not None
    result = run_train(run_dir, *args)
    assert result.returncode == 0, result.stderr
    resumed, uninterrupted = _checkpoint(run_dir), _checkpoint(whole)
    # The EMA updates after every 2nd optimizer step (RECIPE); in the 1 warmup epoch it copies the
    # weights and n_averaged stays 0, so only the updates of epochs 2 and 3 count.
    steps_per_epoch, epochs, every, warmup_epochs = 8, 3, 2, 1  # TINY, debug=limit, RECIPE, RECIPE
    assert uninterrupted["step"] == epochs * steps_per_epoch
    after_warmup = range(warmup_epochs * steps_per_epoch + 1, epochs * steps_per_epoch + 1)
    averaged = [step for step in after_warmup if step % every == 0]
    assert int(uninterrupted["ema"]["n_averaged"]) == len(averaged)
    _assert_same_weights(resumed, uninterrupted)
    for key, value in uninterrupted["ema"].items():
        assert torch.equal(resumed["ema"][key], value), key
    assert resumed["scheduler"] == uninterrupted["scheduler"]
