"""Round two of reliability: the GPU-path refusals and wrappers reached on CPU, and non-finite
losses that stop (or skip) without saving a broken model."""

from __future__ import annotations

import contextlib
import json
import logging
import threading

import pytest
import torch
from torch import nn

from config.schema import Accelerator, StrategyConfig, StrategyName, TrainerConfig
from distributed import strategies
from distributed.context import make_context
from distributed.strategies import AutocastReplica
from errors import ConfigError, NonFiniteLoss
from preflight import check_and_plan
from tests.configs import job_config, typed_config
from tests.runs import resume_point, run_train
from tests.test_launchers import SLURM_ENV, _plan
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.state import TrainState

DDP_CPU = ("strategy=ddp", "trainer.accelerator=cpu")


class _Stop(Exception):
    """Raised by a spy to end train() where the test has seen enough."""


def _train_until_loaders(monkeypatch, run_dir, ctx, *overrides: str) -> dict:
    """training.run.train() up to its build_loaders call, whose keyword arguments it returns."""
    from training import run as run_module

    seen = {}

    def build_loaders(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(run_module, "build_loaders", build_loaders)
    monkeypatch.setattr(run_module, "PreemptionWatch", lambda *args: contextlib.nullcontext())  # its tensor: CUDA
    with pytest.raises(_Stop):
        run_module.train(ctx, job_config(run_dir, *overrides))
    return seen


def test_dp_refuses_compile_on_several_gpus_before_launch():
    """DataParallel replicates its module each forward; a compiled module does not survive it."""
    dp = strategies.get(StrategyConfig(StrategyName.dp))
    with pytest.raises(ConfigError, match="strategy=dp with trainer.compile=true on 2 GPUs.*strategy=ddp"):
        dp.check(TrainerConfig(compile=True), Accelerator.gpu, devices=2, num_nodes=1)
    dp.check(TrainerConfig(compile=True), Accelerator.gpu, devices=1, num_nodes=1)  # one GPU: no replicas


def test_static_graph_with_accumulation_is_a_one_line_error():
    with pytest.raises(ConfigError, match="strategy.static_graph=true with trainer.accumulate_grad_batches=2"):
        check_and_plan(typed_config(*DDP_CPU, "strategy.static_graph=true", "trainer.accumulate_grad_batches=2"))
    check_and_plan(typed_config(*DDP_CPU, "strategy.static_graph=true"))


@pytest.mark.parametrize("name", [StrategyName.ddp, StrategyName.fsdp])
def test_sync_batchnorm_with_compile_warns(caplog, name):
    strategy = strategies.get(StrategyConfig(name, sync_batchnorm=True))
    with caplog.at_level(logging.WARNING, logger="train"):
        strategy.check(TrainerConfig(compile=True), Accelerator.cpu, devices=2, num_nodes=1)
    assert "breaks the compiled graph" in caplog.text


def test_autocast_replica_keeps_the_dtype_in_a_fresh_thread():
    """DataParallel's parallel_apply re-enters autocast in each replica's thread without a dtype;
    a new thread starts from the default dtype (fp16 on CUDA, bf16 on CPU)."""
    net = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    dtypes = {}

    def replica(name: str, module: nn.Module) -> None:
        with torch.autocast("cpu", enabled=True):  # what parallel_apply does in the thread
            dtypes[name] = module(x).dtype

    with torch.autocast("cpu", dtype=torch.float16):  # the loop's autocast, in the main thread
        for name, module in (("bare", net), ("wrapped", AutocastReplica(net, torch.float16))):
            thread = threading.Thread(target=replica, args=(name, module))
            thread.start()
            thread.join()
    assert dtypes == {"bare": torch.bfloat16, "wrapped": torch.float16}
    assert strategies.unwrap(AutocastReplica(net, torch.float16)) is net


@pytest.mark.parametrize("dtype", [torch.bfloat16, None], ids=["bf16-mixed", "32"])
def test_dp_on_two_gpus_puts_autocast_inside_each_replica_under_mixed_precision(monkeypatch, dtype):
    """On CPU nn.DataParallel keeps the module and skips its GPU setup, so wrap's choice shows."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ctx = make_context(0, 0, 1, 1, "gpu", use_process_group=False, devices_per_process=2)
    net = nn.Linear(4, 2)
    model = strategies.get(StrategyConfig(StrategyName.dp)).wrap(net, ctx, compile_mode=None, precision_dtype=dtype)
    assert isinstance(model, nn.DataParallel)
    if dtype is None:
        assert model.module is net
    else:
        assert isinstance(model.module, AutocastReplica) and model.module.dtype == dtype
    assert strategies.unwrap(model) is net


def test_collectives_wait_ten_minutes_by_default_and_one_in_debug_runs():
    assert typed_config().launcher.timeout_s >= 600
    assert typed_config("debug=fdr").launcher.timeout_s == 60


def test_a_task_that_sees_one_gpu_uses_it_whatever_its_local_rank(monkeypatch):
    """srun --gpus-per-task=1: each rank sees cuda:0 only."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert make_context(3, 1, 4, 2, "gpu", use_process_group=True).device == torch.device("cuda", 0)
    gpu_slurm = ("trainer.accelerator=gpu", "trainer.devices=2", "trainer.num_nodes=2", "launcher.master_addr=gpu07")
    assert _plan(SLURM_ENV, "strategy=ddp", *gpu_slurm).world_size == 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match="asks for 2 GPU"):
        _plan(SLURM_ENV, "strategy=ddp", *gpu_slurm)


def test_each_gpu_rank_of_a_node_drives_the_gpu_of_its_local_rank(monkeypatch):
    # Global rank 3 is the second process on its node: cuda:1, not cuda:3.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert make_context(3, 1, 4, 2, "gpu", use_process_group=False).device == torch.device("cuda", 1)


def test_every_gpu_a_process_drives_gets_its_peak_reset(monkeypatch):
    from training.metrics import reset_peak_memory

    reset = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset.append)
    reset_peak_memory(make_context(0, 0, 1, 1, "gpu", use_process_group=False, devices_per_process=2))
    assert reset == [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_compiling_drops_the_partial_last_batch():
    from data import build_loaders

    cfg = typed_config()
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    sizes = {
        drop: [len(y) for _, y in build_loaders(cfg.dataset, cfg.data, ctx, 500, 0, drop_last=drop).train]
        for drop in (False, True)
    }
    assert sizes == {False: [500, 500, 437], True: [500, 500]}


def test_train_asks_for_full_batches_only_when_compiling(monkeypatch, run_dir):
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    for compiled in (True, False):
        kwargs = _train_until_loaders(monkeypatch, run_dir, ctx, f"trainer.compile={str(compiled).lower()}")
        assert kwargs["drop_last"] is compiled


@pytest.mark.parametrize("strategy", [StrategyName.single, StrategyName.dp])
@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead"])
def test_the_compile_mode_reaches_torch_compile(monkeypatch, strategy, mode):
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode: modes.append(mode) or model)
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    strategies.get(StrategyConfig(strategy)).wrap(nn.Linear(2, 2), ctx, compile_mode=mode, precision_dtype=None)
    assert modes == ([] if mode is None else [mode])


def test_train_on_a_gpu_resets_its_peaks(monkeypatch, run_dir):
    reset = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset.append)
    _train_until_loaders(monkeypatch, run_dir, make_context(0, 0, 1, 1, "cpu", use_process_group=False))
    assert reset == []  # CPU: no CUDA counters
    _train_until_loaders(monkeypatch, run_dir, make_context(0, 0, 1, 1, "gpu", use_process_group=False))
    assert reset == [torch.device("cuda", 0)]


def test_a_checkpoint_keeps_the_rng_state_of_every_gpu_dp_drives(monkeypatch):
    from training.checkpoint.state import gather_rng, restore_rng

    ctx = make_context(0, 0, 1, 1, "gpu", use_process_group=False, devices_per_process=2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: torch.tensor([device.index], dtype=torch.uint8))
    restored = {}
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.update({device: state.tolist()}))
    [states] = gather_rng(ctx)  # rank 0's: the CPU state, then one per GPU
    assert [state.tolist() for state in states[1:]] == [[0], [1]]
    restore_rng(states, ctx)
    assert restored == {torch.device("cuda", 0): [0], torch.device("cuda", 1): [1]}


NAN = (
    "model._target_=tests.faults.NanNet",
    "+model.at_step=5",
    "trainer.epochs=2",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=1",
    "trainer.checkpoint_every_n_steps=1",
    "trainer.log_every_n_steps=2",
)


@pytest.mark.slow
# Under DDP one rank's loss goes NaN: every rank must learn of it and stop at its step.
@pytest.mark.parametrize("strategy", [(), (*DDP_CPU, "trainer.devices=2", "+model.on_rank=1")], ids=["single", "ddp"])
def test_a_nan_loss_stops_at_its_step_and_saves_nothing_past_it(run_dir, strategy):
    result = run_train(run_dir, *NAN, *strategy)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    # Every rank stopped at the step, none failed: the error names no rank.
    assert len(errors) == 1 and errors[0].startswith(
        "error: the loss became non-finite (NaN or inf) at optimizer step 5;"
    ), result.stderr
    assert "resume from checkpoints/best.pt" in errors[0]  # it exists: epoch 1 ended before step 5
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert last["step"] == 4 and all(torch.isfinite(v).all() for v in last["model"].values())
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert best["epoch"] == 1 and all(torch.isfinite(v).all() for v in best["model"].values())


def test_a_nan_batch_counts_in_neither_the_loss_nor_the_samples_of_its_report():
    from training.metrics import Window

    window = Window()
    window.update(torch.tensor(0.5), torch.eye(3), torch.tensor([0, 1, 0]), step=1)
    window.update(torch.tensor(float("nan")), torch.eye(2), torch.tensor([0, 1]), step=2)
    figures = window.drain(torch.device("cpu")).averages()
    assert (figures.loss, figures.acc, figures.samples) == (0.5, 2 / 3, 3)


def test_the_nonfinite_error_offers_only_fixes_that_work(tmp_path):
    """No loss had checked last.pt's weights when they were saved, and a resume restores the saved
    learning rate over optimizer.lr: the error points at best.pt, and at a fresh run for a lower lr."""
    message = str(NonFiniteLoss(5))
    assert "resume from checkpoints/best.pt" in message and "last finite state" not in message
    assert "train afresh with a lower optimizer.lr (a resume keeps the saved learning rate)" in message
    ctx, net = make_context(0, 0, 1, 1, "cpu", use_process_group=False), nn.Linear(2, 2)
    saver = Checkpointer(ctx, tmp_path, net, torch.optim.SGD(net.parameters(), lr=0.1), None, "", None)
    saver.save(TrainState())
    saver.close()
    lower = torch.optim.SGD(net.parameters(), lr=0.001)  # what a resume with optimizer.lr=0.001 builds
    Checkpointer(ctx, tmp_path, net, lower, None, "", None).restore(resume_point(tmp_path / "last.pt"))
    assert lower.param_groups[0]["lr"] == 0.1


@pytest.mark.slow
def test_nonfinite_skip_drops_those_steps_counts_them_and_trains_on(run_dir):
    result = run_train(run_dir, *NAN, "+model.times=2", "trainer.nonfinite=skip")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["nonfinite_steps_skipped"] == 2 and metrics["steps"] == 8
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in last["model"].values())
    assert "step 5: non-finite gradients, update skipped" in (run_dir / "train.log").read_text()
