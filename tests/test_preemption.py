"""Preemption units: the signal is noted, not fatal; SLURM requeues only on a requeue signal."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import pytest
import torch

from config.overrides import sweep_command
from config.schema import taken_signals
from distributed.context import DistContext, make_context
from errors import Preempted
from tests.configs import job_config
from training import preemption
from training.checkpoint.cadence import SaveCadence
from training.preemption import PreemptionWatch, requeue_or_explain, resume_command, sweep_resume_command
from training.run import train

CPU = DistContext(0, 0, 1, 1, torch.device("cpu"), None)


def test_a_signal_is_noted_and_a_single_process_stops_at_its_next_step(caplog):
    watch = PreemptionWatch(CPU, [signal.SIGUSR1], grace_s=30)
    try:
        assert not watch.should_stop(step=3)
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the watch
        with caplog.at_level(logging.WARNING, logger="train"):
            assert watch.should_stop(step=4)  # no other rank to agree with: at once
        assert "SIGUSR1: every rank stops after step 4" in caplog.text
        assert watch.preempted().exit_code == 128 + signal.SIGUSR1
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_ctrl_c_is_noted_with_its_launchers_copy_and_a_second_one_raises(monkeypatch):
    """A SIGINT sent to every process of a job (`pkill -INT -f train.py`) reaches a spawned rank
    itself and as its launcher's copy: one Ctrl-C."""
    clock = [100.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    watch = PreemptionWatch(CPU, [signal.SIGINT], grace_s=30)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # pkill's
        clock[0] += 0.01
        os.kill(os.getpid(), signal.SIGINT)  # the launcher's copy of the same Ctrl-C
        assert watch.received == signal.SIGINT
        clock[0] += 1.5
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C of its own
        clock[0] += 0.01
        os.kill(os.getpid(), signal.SIGINT)  # the launcher's copy of the second: not a third, in the cleanup
        assert watch.preempted().exit_code == 130 and str(watch.preempted()) == "interrupted by Ctrl-C (SIGINT)"
    finally:
        watch.close()


def test_the_launchers_copy_of_a_ctrl_c_landing_inside_its_handler_is_not_a_second_one():
    """pkill's SIGINT and the launcher's copy reach a rank microseconds apart, and Python may
    run the copy's handler between any two bytecodes of the first's. Landing anywhere, the pair is
    one Ctrl-C: noted, not a KeyboardInterrupt (which ended a loaded DDP run's rank unsaved)."""
    point = 1
    while _ctrl_c_and_its_copy_at(point):
        point += 1
    assert point > 10  # it landed after each of the handler's bytecodes


def _ctrl_c_and_its_copy_at(point: int) -> bool:
    """A fresh watch's handler for pkill's SIGINT, with the launcher's copy run inside it
    after its `point`-th bytecode: whether it had that many."""
    watch = PreemptionWatch(CPU, [signal.SIGINT], grace_s=30)
    count, landed = 0, False

    def each_bytecode(frame, event, arg):
        nonlocal count, landed
        count += event == "opcode"
        if count == point and not landed:
            landed = True
            sys.settrace(None)
            watch._note(signal.SIGINT, None)  # the launcher's copy
        return each_bytecode

    def calls(frame, event, arg):
        if frame.f_code is not PreemptionWatch._note.__code__:
            return None
        frame.f_trace_opcodes = True
        return each_bytecode

    sys.settrace(calls)
    try:
        watch._note(signal.SIGINT, None)  # pkill's
    except KeyboardInterrupt:
        pytest.fail(f"the copy, landing after bytecode {point} of the handler, raised as a second Ctrl-C")
    finally:
        sys.settrace(None)
        watch.close()
    assert watch.received == signal.SIGINT
    return landed


class _AllReduceMax:
    """all_reduce_max over two ranks that run in threads of this process."""

    def __init__(self) -> None:
        self.met, self.sent = threading.Barrier(2, timeout=10), [None, None]

    def __call__(self, tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
        self.sent[ctx.rank] = tensor.clone()
        self.met.wait()  # a rank checking at a step the other does not would wait here, and fail
        result = torch.maximum(*self.sent)
        self.met.wait()
        return tensor.copy_(result)


def test_ranks_check_a_quarter_grace_period_apart_by_the_slowest_and_stop_at_one_step(monkeypatch):
    """Rank 0 steps in 50 ms, rank 1 in 10 ms; rank 1 alone gets the signal at step 12. With a 1 s
    grace period both check every 0.25 s of rank 0's steps (5 steps), and both stop at the first
    check after the signal: in time, and at one step (at different steps they would hang)."""
    monkeypatch.setattr(preemption, "all_reduce_max", _AllReduceMax())
    checks: list[list[int]] = [[], []]
    stopped: list[int | None] = [None, None]

    def rank(r: int, seconds_per_step: float) -> None:
        watch = PreemptionWatch(DistContext(r, r, 2, 2, torch.device("cpu"), "gloo"), [], grace_s=1.0)
        for step in range(1, 40):
            time.sleep(seconds_per_step)
            if r == 1 and step == 12:
                watch.received = signal.SIGTERM
            before = watch._next_check
            if watch.should_stop(step):
                stopped[r] = step
                return
            if watch._next_check != before:
                checks[r].append(step)

    threads = [threading.Thread(target=rank, args=(r, t)) for r, t in ((0, 0.05), (1, 0.01))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert checks[0] == checks[1] and stopped[0] == stopped[1], (checks, stopped)
    gaps = [b - a for a, b in zip(checks[0][1:], checks[0][2:])]  # after the first, which paid the start
    assert gaps and all(4 <= gap <= 5 for gap in gaps), checks
    assert 12 <= stopped[0] <= 12 + 5, (checks, stopped)


def test_a_run_resumed_late_checks_a_quarter_grace_period_apart_from_its_first_steps(monkeypatch):
    """Resumed at step 200, 50 ms a step, a 1 s grace period: the signal at step 205 stops both ranks
    within a quarter of it (5 steps). The first check timed the start over the 200 steps the run
    never took, and put the next one ~1000 steps away: past the grace period, and SLURM's SIGKILL."""
    monkeypatch.setattr(preemption, "all_reduce_max", _AllReduceMax())
    stopped: list[int | None] = [None, None]

    def rank(r: int) -> None:
        watch = PreemptionWatch(DistContext(r, r, 2, 2, torch.device("cpu"), "gloo"), [], grace_s=1.0)
        for step in range(201, 240):
            time.sleep(0.05)
            if r == 1 and step == 205:
                watch.received = signal.SIGTERM
            if watch.should_stop(step):
                stopped[r] = step
                return

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert stopped[0] == stopped[1] and stopped[0] is not None and stopped[0] <= 205 + 6, stopped


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stand-in `scontrol` on PATH that records its arguments."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    handler = signal.getsignal(signal.SIGTERM)  # a requeue ignores SIGTERM from then on
    yield calls
    signal.signal(signal.SIGTERM, handler)


def test_a_signal_noted_as_a_checks_all_reduce_returns_stops_the_ranks_at_the_next_check(monkeypatch):
    """The ranks wait in a check's all-reduce together, and a signal to all of them at once (SLURM's,
    or the kernel's when their launcher dies) runs its handler as the all-reduce returns, after the
    flags were reduced: it counts at the next check. Lost, the ranks would train on to the
    scheduler's SIGKILL, or, orphaned, forever."""
    watch = PreemptionWatch(DistContext(0, 0, 2, 2, torch.device("cpu"), "gloo"), [], grace_s=30.0)

    def signalled_as_it_returns(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
        reduced = tensor.clone()
        watch._note(signal.SIGTERM, None)
        return reduced

    monkeypatch.setattr(preemption, "all_reduce_max", signalled_as_it_returns)
    assert not watch.should_stop(1, force=True)  # every rank alike: none knew in time
    monkeypatch.setattr(preemption, "all_reduce_max", lambda tensor, ctx: tensor.clone())
    assert watch.should_stop(2, force=True) and watch.received == signal.SIGTERM


def test_a_signal_after_the_last_check_still_stops_the_job_once_it_is_saved(tmp_path):
    """SIGTERM in the forward of step 20 of a run that trainer.max_steps ends there, after its last
    check: the run ends whole, then stops as preempted instead of going quiet (a sweep would start
    its next job, SLURM would not requeue)."""
    job = job_config(
        tmp_path,
        "trainer.epochs=1",
        "trainer.max_steps=20",
        "logger=none",
        "trainer.progress_bar=false",
        "model._target_=tests.faults.SignalingNet",
        "+model.at_step=20",
    )
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match="SIGTERM"):
        train(make_context(0, 0, 1, 1, "cpu", use_process_group=False), job)
    assert (tmp_path / "metrics.json").is_file()
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["step"] == 20
    assert signal.getsignal(signal.SIGTERM) is handler  # train()'s own is gone again


def test_sigusr1_under_slurm_requeues_the_job(scontrol, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "python train.py trainer.resume=auto")
    assert scontrol.read_text() == "requeue 4242\n"
    assert "requeued SLURM job 4242" in caplog.text
    # The requeue SIGTERMs the job's processes: this one still logs that line and leaves by itself.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


@pytest.mark.parametrize(
    "job, signum, codes",
    [
        ("4242", signal.SIGUSR1, (138, 0)),  # rank 0 requeues: the others leave at once, without a bad exit
        ("4242", signal.SIGTERM, (143, 143)),  # scancel: nothing to requeue
        (None, signal.SIGUSR1, (138, 138)),  # not a SLURM job
    ],
)
def test_the_other_ranks_of_a_job_rank_0_requeues_exit_0(monkeypatch, job, signum, codes):
    """`srun --kill-on-bad-exit` kills the job's remaining tasks once one exits non-zero: rank 0
    too, before its `scontrol requeue` (which runs once the ranks left the group) reaches SLURM."""
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    exits = []
    for rank in (0, 1):
        watch = PreemptionWatch(DistContext(rank, rank, 2, 2, torch.device("cpu"), "gloo"), [], 30, [signal.SIGUSR1])
        watch.received = signum
        exits.append(watch.preempted().exit_code)
    assert tuple(exits) == codes


def test_an_array_task_is_requeued_by_its_own_id(scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "cmd")
    assert scontrol.read_text() == "requeue 4000_3\n"


def test_sigterm_such_as_scancel_never_requeues(scontrol, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGTERM), [signal.SIGUSR1], "python train.py trainer.resume=auto")
    assert not scontrol.exists()
    assert "resume with: python train.py trainer.resume=auto" in caplog.text


def test_outside_slurm_it_says_how_to_resume(scontrol, caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "the command")
    assert not scontrol.exists() and "resume with: the command" in caplog.text


def test_ranks_ended_before_they_saved_say_so(scontrol, caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGTERM, saved=False), [signal.SIGUSR1], "the command")
    said = "preempted by SIGTERM before the ranks saved last.pt; continue from the last save, if any, with: the command"
    assert said in caplog.text and "is saved" not in caplog.text and not scontrol.exists()


def test_under_torchrun_it_says_a_re_form_resumes_by_itself(scontrol, monkeypatch, caplog):
    """torchrun's agent SIGTERMs its ranks when a node joins, then starts them again: not a stop."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic")
    with caplog.at_level(logging.WARNING, logger="train"):
        requeue_or_explain(Preempted(signal.SIGTERM), [signal.SIGUSR1], "the command")
    assert "if torchrun is re-forming the group (a node joined or left), it starts the ranks again" in caplog.text
    assert caplog.text.rstrip().endswith("if the job was stopped, resume with: the command")


def test_under_torchrun_the_resume_command_starts_train_py_by_torchrun(monkeypatch):
    # Not `python train.py`, which would resume a multi-node job as one process.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic")
    assert resume_command(["strategy=ddp"], "/runs/r") == (
        "torchrun <its options, as before> train.py strategy=ddp hydra.run.dir=/runs/r trainer.resume=auto"
    )


def test_the_resume_command_keeps_the_overrides_and_pins_the_run_dir(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    given = [
        "hydra.run.dir=x",
        "hydra/job_logging=disabled",
        "strategy=ddp",
        "trainer.resume=/old.pt",
        "model.name=a b",
    ]
    command = resume_command(given, "/runs/r")
    assert command == (
        "python train.py hydra/job_logging=disabled strategy=ddp 'model.name=a b' hydra.run.dir=/runs/r trainer.resume=auto"
    )


RECORD = """
hydra:
  overrides:
    hydra: [hydra.sweeper.n_trials=4, hydra.sweep.dir=/sweeps/s, hydra.mode=MULTIRUN]
    task: [hparams_search=digits, trainer.resume=auto, logger.mlflow.password=hunter2, 'model.name=a b']
"""


def test_a_search_requeues_its_slurm_job_once_not_each_trial(scontrol, monkeypatch, tmp_path, caplog):
    """SLURM's USR1 to a job step reaches the search and each trial in a process of its own: the trials
    save and leave it to the search (explained_by_search), which then requeues the job, once."""
    from hydra_plugins.optuna_study_sweeper import _study

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setattr(preemption, "explained_by_search", True)  # in a trial's process (_processes._child)
    with caplog.at_level(logging.WARNING, logger="train"):
        for _ in range(2):
            requeue_or_explain(Preempted(signal.SIGUSR1), [signal.SIGUSR1], "the search's command")
        assert not scontrol.exists() and caplog.text == ""
        monkeypatch.setattr(preemption, "explained_by_search", False)  # the sweeper's, once they have saved
        (tmp_path / "multirun.yaml").write_text(RECORD)
        with pytest.raises(SystemExit) as ended:
            _study.end_stopped(Preempted(signal.SIGUSR1), [signal.SIGUSR1], tmp_path)
    assert ended.value.code == 128 + signal.SIGUSR1 and scontrol.read_text() == "requeue 4242\n"
    assert "requeued SLURM job 4242" in caplog.text


def test_a_sweeps_command_is_its_own_overrides_less_its_mode_and_dir():
    assert sweep_command(RECORD) == [
        "hydra.sweeper.n_trials=4",
        "hparams_search=digits",
        "trainer.resume=auto",
        "logger.mlflow.password=hunter2",
        "model.name=a b",
    ]


def test_a_sweeps_job_names_the_command_that_continues_the_sweep():
    head = "python train.py -m hydra.sweeper.n_trials=4 hparams_search=digits"
    # A grid: in its dir, each job goes on from its last.pt, says it had ended, or starts.
    assert sweep_resume_command(sweep_command(RECORD), "/s", search=False) == (
        f"{head} logger.mlflow.password=*** 'model.name=a b' hydra.sweep.dir=/s trainer.resume=auto"
    )
    # A search: its very overrides, or the study refuses to continue.
    assert sweep_resume_command(sweep_command(RECORD), "/s", search=True) == (
        f"{head} trainer.resume=auto logger.mlflow.password=*** 'model.name=a b' hydra.sweep.dir=/s"
    )


def test_a_run_that_fails_while_it_is_built_gives_the_signals_back(tmp_path):
    """train() notes SIGUSR1/SIGTERM from its start; a run that fails before its loop (here its
    model) leaves the handlers it found, not a watch of a run that is gone (a -m sweep's next job,
    or the rest of the process, would have its signals swallowed)."""
    job = job_config(tmp_path, "trainer.epochs=1", "logger=none", "+model.no_such_argument=1")
    handlers = {sig: signal.getsignal(sig) for sig in job.preempt_signals}
    with pytest.raises(TypeError, match="no_such_argument"):
        train(make_context(0, 0, 1, 1, "cpu", use_process_group=False), job)
    assert {sig: signal.getsignal(sig) for sig in job.preempt_signals} == handlers


def test_without_other_ranks_a_save_by_time_reads_this_processs_clock_every_step():
    now = [0.0]
    saves = SaveCadence(every_n_steps=4, every_n_seconds=10, clock=lambda: now[0])
    due = []
    for step in range(1, 9):
        now[0] += 3  # 3 s a step
        if saves.due(step):
            due.append(step)
            saves.saved()  # the seconds count from the last save, whatever its cause
    assert due == [4, 8]  # 12 s at step 4 (also its 4th step), then 4 steps since: 12 s at step 8
    assert SaveCadence(every_n_steps=None, every_n_seconds=5, clock=lambda: 5.0).due(1) is False  # 0 s in


def test_a_save_by_time_comes_by_rank_0s_clock_at_a_check_and_every_rank_saves_at_that_step(monkeypatch):
    """Rank 0's clock runs (0.5 s a step), rank 1's stands still: each rank's own would save at
    different steps, and a rank saving alone waits for the others forever. Both save at the same
    steps, those of a check (the preemption watch's, a quarter of the 1 s cadence apart: it is
    shorter than the grace period) where rank 0's clock says a second has passed."""
    monkeypatch.setattr(preemption, "all_reduce_max", _AllReduceMax())
    saved: list[list[int]] = [[], []]
    checked: list[list[int]] = [[], []]

    def rank(r: int) -> None:
        step_now = [0]
        clock = (lambda: step_now[0] * 0.5) if r == 0 else (lambda: 0.0)
        saves = SaveCadence(None, every_n_seconds=1.0, agreed=True, clock=clock)
        watch = PreemptionWatch(DistContext(r, r, 2, 2, torch.device("cpu"), "gloo"), [], grace_s=30.0)
        watch.carry(saves)
        for step in range(1, 80):
            step_now[0] = step
            time.sleep(0.01)
            before = watch._next_check
            assert not watch.should_stop(step)
            if watch._next_check != before:
                checked[r].append(step)
            if saves.due(step):
                saved[r].append(step)
                saves.saved()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert saved[0] == saved[1] and len(saved[0]) >= 2, (saved, checked)
    assert set(saved[0]) <= set(checked[0]), (saved, checked)
    gaps = [b - a for a, b in zip(checked[0][1:], checked[0][2:])]  # 0.25 s apart at ~0.01 s a step, not 7.5 s
    assert gaps and max(gaps) <= 40, checked


@pytest.mark.slow
def test_a_time_based_save_lands_mid_epoch_through_train_py(tmp_path):
    """Two DDP ranks, trainer.checkpoint_every_n_seconds and nothing else that saves mid-epoch: rank 1
    fails in its 3rd step, and last.pt holds the 2nd, saved mid-epoch by rank 0's clock."""
    from tests.runs import run_train

    result = run_train(
        tmp_path,
        "debug=ddp_cpu",
        "trainer.limit_train_batches=6",
        "trainer.checkpoint_every_n_seconds=0.001",
        "model._target_=tests.faults.FailingNet",
        "logger=none",
    )
    assert result.returncode != 0 and "injected failure on rank 1" in result.stderr, result.stderr[-3000:]
    last = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert (last["epoch"], last["step"], last["batch"]) == (0, 2, 2)


def test_a_signal_the_process_started_with_ignored_is_not_taken_but_sigint_always_is():
    """nohup's SIGHUP stays ignored; a script's `... &` ignores SIGINT by the way, and a spawned
    rank gets SIGINT when its launcher dies: that one is taken (docs/reliability.md)."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGHUP, signal.SIGINT)}
    try:
        signals = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
        assert taken_signals(signals) == [signal.SIGINT, signal.SIGTERM]
        with PreemptionWatch(make_context(0, 0, 1, 1, "cpu", use_process_group=False), signals, 30.0):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, previous[signal.SIGINT])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
