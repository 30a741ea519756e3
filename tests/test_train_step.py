"""The train step's knobs (precision, channels_last, accumulation with no_sync, clipping), the
dp checks, and checkpoints that load under every strategy."""

from __future__ import annotations

import io
import logging
import math
import os
import re
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from config.schema import NonFinite, StrategyConfig, StrategyName, TrainerConfig
from data import Loaders
from distributed import strategies
from distributed.context import DistContext, make_context
from distributed.sync_batchnorm import GlooSyncBatchNorm
from errors import ConfigError
from preflight import check_and_plan
from tests.configs import typed_config
from tests.runs import resume_point
from training import validation
from training.batches import Batches
from training.checkpoint.best import BestCheckpoints
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.state import TrainState
from training.loss import CrossEntropy
from training.metrics import Averages
from training.precision import Precision
from training.run import configure_kernels
from training.trainer import Optimization, Reporting, Trainer

CPU = torch.device("cpu")


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 10)
        self.input_formats: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.input_formats.append(x.is_contiguous(memory_format=torch.channels_last))
        return self.head(self.conv(x).mean(dim=(2, 3)))


def _batch(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 6, 6), torch.randint(0, 10, (n,))


def _trainer(
    model: nn.Module,
    tmp_path,
    ctx: DistContext | None = None,
    strategy: StrategyConfig | None = None,
    loaders: Loaders | None = None,
    scaler: torch.amp.GradScaler | None = None,
    step_lr: bool = False,
    resume: bool = False,
    reporting: Reporting = Reporting(),
    **settings,
) -> Trainer:
    """A Trainer around `model` (wrapped by `strategy`, default single), reporting to `reporting`; with
    `step_lr` the learning rate halves every epoch; with `resume`, from tmp_path's last.pt."""
    ctx = ctx or make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    chosen = strategies.get(strategy or StrategyConfig())
    wrapped = chosen.wrap(model, ctx, compile_mode=None, precision_dtype=None)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) if step_lr else None
    options = TrainerConfig(**{"progress_bar": False, **settings})
    scaler = scaler or Precision.of(options.precision, CPU).grad_scaler()
    best = BestCheckpoints.chosen(options.checkpoint)
    checkpointer = Checkpointer(ctx, tmp_path, wrapped, optimizer, scheduler, "", scaler, best=best)
    state = checkpointer.restore(resume_point(tmp_path / "last.pt")) if resume else None
    return Trainer(
        model=wrapped,
        strategy=chosen,
        loaders=loaders,
        checkpointer=checkpointer,
        state=state,
        ctx=ctx,
        optimization=Optimization(CrossEntropy(options.label_smoothing), optimizer, scheduler, scaler),
        settings=options,
        reporting=reporting,
    )


@pytest.fixture
def process_group():
    """A one-process gloo group in this process, so DDP can be built without spawning."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    finally:
        dist.destroy_process_group()


def test_bf16_mixed_runs_forward_in_bfloat16_and_keeps_fp32_gradients(tmp_path):
    model = TinyNet()
    logits, loss = _trainer(model, tmp_path, precision="bf16-mixed").step(*_batch(), group_size=1, sync=True)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    logits, _ = _trainer(model, tmp_path).step(*_batch(), group_size=1, sync=True)
    assert logits.dtype == torch.float32


def test_channels_last_feeds_nhwc_images(tmp_path):
    model = TinyNet().to(memory_format=torch.channels_last)
    _trainer(model, tmp_path, channels_last=True).step(*_batch(), group_size=1, sync=True)
    _trainer(model, tmp_path).step(*_batch(), group_size=1, sync=True)
    assert model.input_formats == [True, False]


def test_grad_clip_bounds_the_update(tmp_path):
    model = nn.Linear(3, 1, bias=False)
    trainer = _trainer(model, tmp_path, grad_clip=0.5)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1.0
    before = model.weight.detach().clone()
    (model(torch.full((1, 3), 1000.0)).sum()).backward()
    trainer.optimizer_step()
    assert (model.weight.detach() - before).norm().item() == pytest.approx(0.5, rel=1e-5)
    assert model.weight.grad is None  # cleared with set_to_none


def test_accumulation_all_reduces_once_per_optimizer_step(process_group, tmp_path):
    """5 micro-batches in groups of 2 make 3 steps (the last group holds one): 3 all-reduces."""
    data = TensorDataset(*_batch(20))
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    loaders = Loaders(DataLoader(data, batch_size=4, sampler=sampler), DataLoader(data), sampler)
    trainer = _trainer(
        TinyNet(),
        tmp_path,
        process_group,
        StrategyConfig(StrategyName.ddp),
        loaders,
        accumulate_grad_batches=2,
        limit_train_batches=5,
    )
    calls = []
    trainer.model.register_comm_hook(None, lambda state, bucket: calls.append(1) or allreduce_hook(None, bucket))
    averages, _ = trainer.train_epoch()
    assert trainer.state.step == 3 and len(calls) == 3 and averages.samples == 20


@pytest.mark.parametrize("terminal", [True, False])
def test_the_progress_bar_draws_on_a_terminal_only_and_lines_are_logged_elsewhere(
    tmp_path, monkeypatch, caplog, terminal
):
    """A SLURM log or a pipe would fill with the bar's redraws: it gets a line per report instead."""
    stderr = io.StringIO()
    stderr.isatty = lambda: terminal
    monkeypatch.setattr(sys, "stderr", stderr)
    data = TensorDataset(*_batch(12))
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    loaders = Loaders(DataLoader(data, batch_size=4, sampler=sampler), DataLoader(data), sampler)
    with caplog.at_level(logging.INFO, logger="train"):
        _trainer(TinyNet(), tmp_path, loaders=loaders, progress_bar=True, log_every_n_steps=2).train_epoch()
    assert ("epoch 1:" in stderr.getvalue()) == terminal, stderr.getvalue()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split("  last")[0] for line in lines] == ([] if terminal else ["step 2  epoch 1 batch 2/3"])
    assert terminal or re.fullmatch(
        r"step 2  epoch 1 batch 2/3  last 2 steps: loss \d+\.\d{4} acc \d\.\d{4}  lr 0\.1", lines[0]
    )


def test_the_lr_is_logged_as_a_schedule_means_it_not_with_float_noise(tmp_path):
    logged = []
    logger = type("Logger", (), {"log_scalars": lambda self, step, values: logged.append(values)})()
    data = TensorDataset(*_batch(8))
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    loaders = Loaders(DataLoader(data, batch_size=4, sampler=sampler), DataLoader(data), sampler)
    trainer = _trainer(TinyNet(), tmp_path, loaders=loaders, log_every_n_steps=1, reporting=Reporting([logger]))
    trainer.optimizer.param_groups[0]["lr"] = 0.05 * (1 + math.cos(math.pi / 3)) / 2  # a cosine schedule's 0.0375
    trainer.train_epoch()
    assert [repr(values["lr"]) for values in logged] == ["0.0375", "0.0375"]


def test_fp16_on_cpu_and_multi_device_dp_on_cpu_are_config_errors():
    with pytest.raises(ConfigError, match="trainer.precision=16-mixed needs CUDA.*bf16-mixed"):
        check_and_plan(typed_config("trainer.accelerator=cpu", "trainer.precision=16-mixed"))
    with pytest.raises(ConfigError, match="strategy=dp with trainer.devices=2.*strategy=ddp"):
        check_and_plan(typed_config("strategy=dp", "trainer.accelerator=cpu", "trainer.devices=2"))
    with pytest.raises(ConfigError, match="trainer.accumulate_grad_batches=0"):
        check_and_plan(typed_config("trainer.accumulate_grad_batches=0"))
    with pytest.raises(ConfigError, match="trainer.precision=64"):
        check_and_plan(typed_config("trainer.precision=64"))
    plan = check_and_plan(typed_config("strategy=dp", "trainer.accelerator=cpu")).launch
    assert (plan.processes_per_node, plan.process_group) == (1, False)


WRAPPERS = {
    "single": lambda m: m,
    "dp": nn.DataParallel,  # on a machine without CUDA, a pass-through wrapper with .module
    "ddp": DistributedDataParallel,
    "compiled": torch.compile,  # compiles lazily: no forward here, so no compile cost
}


def test_a_checkpoint_saved_under_any_strategy_loads_under_any_other(process_group, tmp_path):
    plain_keys = set(TinyNet().state_dict())
    for saved_by, wrap_saved in WRAPPERS.items():
        torch.manual_seed(0)
        source = wrap_saved(TinyNet())
        optimizer = torch.optim.SGD(source.parameters(), lr=0.1)
        saver = Checkpointer(process_group, tmp_path / saved_by, source, optimizer, None, "", None)
        saver.save(TrainState())
        saver.close()
        saved = torch.load(tmp_path / saved_by / "last.pt", weights_only=True)["model"]
        assert set(saved) == plain_keys, saved_by
        for loaded_by, wrap_loaded in WRAPPERS.items():
            torch.manual_seed(1)
            target = wrap_loaded(TinyNet())
            optimizer = torch.optim.SGD(target.parameters(), lr=0.1)
            Checkpointer(process_group, tmp_path, target, optimizer, None, "", None).restore(
                resume_point(tmp_path / saved_by / "last.pt")
            )
            for name, value in target.state_dict().items():
                key = name.replace("module.", "").replace("_orig_mod.", "")
                assert torch.equal(value, saved[key]), (saved_by, loaded_by, name)


def test_an_epochs_wait_for_its_batches_is_measured_and_the_steps_are_not(monkeypatch):
    # The ImageNet example's data time: what the loader costs the steps, apart from the steps. On a
    # clock of the test's own, which a loaded machine's late wake-ups cannot stretch.
    now = [0.0]
    monkeypatch.setattr("training.batches.time", SimpleNamespace(perf_counter=lambda: now[0]))

    def slow_loader():
        for _ in range(3):
            now[0] += 0.05
            yield _batch()

    batches = Batches(CPU, None)
    for _ in batches.take(slow_loader()):
        now[0] += 0.1  # a step: not a wait for data
    assert batches.waited == pytest.approx(0.15)  # the steps' 0.3 s would make it 0.45


def test_deterministic_turns_on_deterministic_kernels_and_off_cudnn_benchmark(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    gpu, cudnn = make_context(0, 0, 1, 1, "gpu", use_process_group=False), torch.backends.cudnn
    monkeypatch.setattr(cudnn, "benchmark", False)  # and back after the test
    configure_kernels(TrainerConfig(), make_context(0, 0, 1, 1, "cpu", use_process_group=False))
    assert not cudnn.benchmark  # a CPU run leaves cuDNN alone
    try:
        configure_kernels(TrainerConfig(deterministic=True), gpu)
        assert torch.are_deterministic_algorithms_enabled() and cudnn.deterministic and not cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        configure_kernels(TrainerConfig(), gpu)  # the next job of a sweep, in the same process
        assert not torch.are_deterministic_algorithms_enabled() and not cudnn.deterministic and cudnn.benchmark
    finally:
        configure_kernels(TrainerConfig(), make_context(0, 0, 1, 1, "cpu", use_process_group=False))


def test_an_fp16_overflow_is_the_scalers_to_skip_not_a_nonfinite_skip(tmp_path, caplog):
    # The GradScaler overflows as it calibrates its scale in the first steps: nothing diverged.
    trainer = _trainer(
        TinyNet(), tmp_path, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0), nonfinite=NonFinite.skip
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.scaler.scale(trainer.model(_batch()[0]).sum() * float("inf")).backward()
    with caplog.at_level(logging.WARNING, logger="train"):
        trainer.optimizer_step()
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))  # skipped all the same
    assert trainer.scaler.get_scale() == 512.0 and trainer.skipped_steps == 0 and not caplog.records


def test_the_grad_scaler_state_is_checkpointed(tmp_path):
    trainer = _trainer(TinyNet(), tmp_path, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    x, _ = _batch()
    trainer.scaler.scale(trainer.model(x).sum() * float("inf")).backward()
    trainer.optimizer_step()  # overflow: skip the step, halve the scale
    trainer.checkpointer.save(TrainState())
    trainer.checkpointer.close()
    restored = torch.amp.GradScaler("cpu")
    Checkpointer(trainer.ctx, tmp_path, trainer.model, trainer.optimizer, None, "", restored).restore(
        resume_point(tmp_path / "last.pt")
    )
    assert restored.get_scale() == 512.0


def test_the_best_weights_are_the_emas_when_its_accuracy_beats_the_models(tmp_path):
    trainer = _trainer(TinyNet(), tmp_path)
    state = trainer.state
    epochs = [  # (model's, EMA's) validation figures, epoch by epoch
        (Averages(1.0, 0.5, 10, acc5=0.8), Averages(0.9, 0.7, 10, acc5=0.9)),  # the EMA's is the best
        (Averages(1.0, 0.6, 10, acc5=0.8), Averages(0.9, 0.5, 10, acc5=0.8)),  # the model beats the EMA, not the best
        (Averages(0.8, 0.8, 10, acc5=1.0), Averages(0.9, 0.75, 10, acc5=0.9)),  # the model's is the best
    ]
    seen = []
    for val, ema in epochs:
        figures = {**validation.figures(val, "val/"), **validation.figures(ema, "val_ema/")}
        trainer._note_best(figures)
        # trainer.checkpoint.monitor=val/acc: the better of the two, for the best checkpoints
        seen.append((trainer._monitored(figures), state.best_val_acc, state.best_val_acc5, state.best_weights))
    assert seen == [
        ((0.7, "ema"), 0.7, 0.9, "ema"),
        ((0.6, "model"), 0.7, 0.9, "ema"),
        ((0.8, "model"), 0.8, 1.0, "model"),
    ]


class _Jittered(TensorDataset):
    """Noise drawn per image as it is loaded, from the global random stream: a DataLoader without
    workers draws it in the training process, between the steps, as dataset.random_erase does."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().__getitem__(i)
        return x + torch.rand(()), y


def _dropout_net() -> nn.Module:
    """Dropout: each step draws from the global random stream too."""
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10))


def _loaders(dataset: TensorDataset, workers: int) -> Loaders:
    """6 training batches of 2; validation by a DataLoader, which draws a base seed from the global stream."""
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
    train = DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=workers)
    return Loaders(train, DataLoader(TensorDataset(*_batch(4)), batch_size=2), sampler)


@pytest.mark.parametrize(
    "data, workers",
    [(TensorDataset, 0), (_Jittered, 0), (_Jittered, 1)],
    ids=["tensors", "augmented", "augmented_worker"],
)
def test_a_max_steps_stop_mid_epoch_then_resume_trains_as_one_run(tmp_path, caplog, data, workers):
    """trainer.max_steps=4 of 6 steps per epoch: last.pt holds epoch 1 at batch 4 (the schedule
    not stepped), and a resume with no max_steps ends bitwise where an unstopped run does."""
    torch.manual_seed(0)
    dataset, init = data(*_batch(12)), _dropout_net().state_dict()
    for name, max_steps, resume in (("whole", None, False), ("run", 4, False), ("run", None, True)):
        model = _dropout_net()
        model.load_state_dict(init)
        trainer = _trainer(
            model,
            tmp_path / name,
            loaders=_loaders(dataset, workers),
            step_lr=True,
            resume=resume,
            epochs=2,
            max_steps=max_steps,
            log_every_n_steps=1,
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="train"):
            figures = trainer.fit()
        trainer.checkpointer.close()
        if max_steps:
            stopped = torch.load(tmp_path / name / "last.pt", weights_only=True)
            assert (stopped["epoch"], stopped["batch"], stopped["step"]) == (0, 4, 4) and stopped["rng"] is not None
            assert stopped["scheduler"]["last_epoch"] == 0
            assert "stopped at step 4 (trainer.max_steps) in epoch 1 of 2, after batch 4 of 6" in caplog.text
            assert "epoch 1/2" not in caplog.text
            assert (figures["steps"], figures["epochs"]) == (4, 0)  # metrics.json's
    whole, resumed = (torch.load(tmp_path / name / "last.pt", weights_only=True) for name in ("whole", "run"))
    assert [run[key] for key in ("epoch", "batch", "step") for run in (whole, resumed)] == [2, 2, 0, 0, 12, 12]
    for key, value in whole["model"].items():
        assert torch.equal(resumed["model"][key], value), key
    assert resumed["scheduler"] == whole["scheduler"]


def test_ddp_options_reach_distributed_data_parallel(process_group):
    strategy = typed_config(
        "strategy=ddp",
        "strategy.find_unused_parameters=true",
        "strategy.bucket_cap_mb=1",
        "strategy.gradient_as_bucket_view=false",
    ).strategy
    model = _wrap(TinyNet(), strategy, process_group)
    assert (model.find_unused_parameters, model.static_graph, model.gradient_as_bucket_view) == (True, False, False)
    assert model.bucket_bytes_cap == 1024 * 1024
    assert model.forward_sync_buffers
    unsynced = typed_config("strategy=ddp", "strategy.forward_sync_buffers=false").strategy
    assert not _wrap(TinyNet(), unsynced, process_group).forward_sync_buffers
    # static_graph finds unused parameters itself, so it goes without find_unused_parameters.
    model = _wrap(TinyNet(), typed_config("strategy=ddp", "strategy.static_graph=true").strategy, process_group)
    assert (model.static_graph, model.gradient_as_bucket_view) == (True, True)


@pytest.mark.parametrize("as_view", [True, False])
def test_gradient_as_bucket_view_shares_one_buffer_for_all_gradients(process_group, as_view, tmp_path):
    """seed 002: the gradients live in DDP's bucket instead of a copy of their own, step after step:
    zero_grad frees them and each backward's DDP points them into the bucket again."""
    strategy = typed_config("strategy=ddp", f"strategy.gradient_as_bucket_view={as_view}").strategy
    trainer = _trainer(TinyNet(), tmp_path, process_group, strategy)
    for _ in range(2):
        trainer.step(*_batch(), group_size=1, sync=True)
        storages = {p.grad.untyped_storage().data_ptr() for p in trainer.model.parameters()}
        assert (len(storages) == 1) == as_view
        trainer.optimizer_step()
        assert all(p.grad is None for p in trainer.model.parameters())


def test_sync_batchnorm_swaps_every_batchnorm_and_keeps_its_statistics(process_group):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(4)))
    net[1].running_mean.fill_(0.5)
    strategy = typed_config("strategy=ddp", "strategy.sync_batchnorm=true").strategy
    model = _wrap(net, strategy, process_group).module
    assert isinstance(model[1], GlooSyncBatchNorm) and isinstance(model[2][0], GlooSyncBatchNorm)
    assert torch.equal(model[1].running_mean, torch.full((4,), 0.5))


def _wrap(model: nn.Module, strategy: StrategyConfig, ctx: DistContext) -> nn.Module:
    return strategies.get(strategy).wrap(model, ctx, compile_mode=None, precision_dtype=None)


def test_evaluate_runs_the_dataparallel_that_splits_the_batch_over_its_gpus():
    """strategy=dp validates on every GPU it trains on only if evaluate calls the DataParallel, not
    its module (which would run each whole batch on the first GPU). On CPU a DataParallel calls its
    module as it is, so which one evaluate calls can be seen here."""
    from training.validation import evaluate

    wrapped = nn.DataParallel(nn.Sequential(nn.Flatten(), nn.Linear(4, 10)))
    called = []
    wrapped.register_forward_hook(lambda module, inputs, output: called.append(module))
    batches = [(torch.randn(6, 1, 2, 2), torch.randint(0, 10, (6,))) for _ in range(2)]
    averages = evaluate(wrapped, batches, Batches(CPU, None), DistContext(0, 0, 1, 1, CPU, None), CrossEntropy())
    assert averages.samples == 12 and len(called) == 2 and all(module is wrapped for module in called)
