"""strategy=fsdp beyond the equivalence runs of test_strategies: which modules it shards, the
commands people run, sharded checkpoints resumed at other world sizes, after kill -9 and under
torchrun, and forwards that every rank must run together (uneven validation shards, samples)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torchvision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from data import build_loaders
from distributed import strategies
from distributed.context import make_context
from distributed.fsdp import block_classes, shard_units
from distributed.launch import LaunchPlan, plan_launch
from models.mnist_net import MnistNet
from models.resnet import resnet
from models.simple_cnn import SimpleCNN
from tests.configs import job_config, typed_config
from tests.runs import FORK_RANKS, last_weights, relative_error, resume_point, run_train, same_weights
from tests.test_launchers import _finish, _one_run_dir, _torchrun
from tests.test_resume_preempt import Run
from training.batches import Batches
from training.checkpoint import sharded
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.files import save_checkpoint
from training.checkpoint.resume import find_resume
from training.precision import Precision
from training.validation import evaluate

FSDP = ["debug=fsdp_cpu"]  # 2 gloo ranks, 3 batches of one epoch, no TensorBoard
# No BatchNorm, no dropout, no schedule: any world size trains the same numbers (test_strategies).
EXACT = [*FSDP, "model=simple_cnn", "scheduler=none"]
SHARDS_OF_2 = [".metadata", "__0_0.distcp", "__1_0.distcp"]  # a last.pt both ranks of a 2-rank run wrote


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def _names(classes) -> set[str]:
    return {cls.__name__ for cls in classes}


def _shard_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints" / "last.pt").iterdir())


@pytest.fixture(scope="module")
def saved_at_2(tmp_path_factory) -> Path:
    """An fsdp(2) run of EXACT: one epoch of 3 steps, a complete sharded last.pt and best.pt."""
    run_dir = tmp_path_factory.mktemp("saved_at_2") / "run"
    result = run_train(run_dir, *EXACT)
    assert result.returncode == 0, result.stderr
    assert _shard_files(run_dir) == SHARDS_OF_2
    return run_dir


def test_the_shard_groups_are_the_models_repeated_blocks():
    assert _names(block_classes(resnet("resnet18", 3, 10))) == {"BasicBlock"}
    assert _names(block_classes(resnet("resnet50", 3, 10))) == {"Bottleneck"}  # not the convs inside them
    assert _names(block_classes(SimpleCNN(1, 10, 8))) == {"Conv2d", "Linear"}  # the seeds' layers
    assert _names(block_classes(MnistNet(1, 10, 8))) == {"Conv2d", "Linear"}
    vit = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=10
    )
    assert _names(block_classes(vit)) == {"EncoderBlock"}
    assert len(shard_units(resnet("resnet50", 3, 10), None)) == 16  # 3 + 4 + 6 + 3 Bottlenecks


def test_shard_modules_overrides_the_groups_children_first():
    model = resnet("resnet18", 3, 10)
    units = shard_units(model, ["BasicBlock", "Sequential"])
    assert len(units) == 8 + 4 + 3  # blocks, stages, the downsample Sequentials inside blocks
    position = {id(unit): i for i, unit in enumerate(units)}
    for unit in units:  # fully_shard must reach a module before any module holding it
        assert all(
            position[id(inner)] < position[id(unit)]
            for inner in unit.modules()
            if id(inner) in position and inner is not unit
        )


@pytest.mark.slow
def test_resume_auto_never_picks_up_a_half_written_sharded_checkpoint(tmp_path, saved_at_2):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    shutil.copytree(saved_at_2 / "checkpoints", checkpoints, symlinks=True)
    complete = (checkpoints / "last.pt").resolve()  # last.pt.step3.<hex>
    # Later saves a kill cut short: every rank's shards, but no .metadata (DCP writes it last). One
    # under the writer's temp name, one under a version name with a higher step: a finder that took
    # the newest directory, or any one not known to be whole, would read it.
    halves = (checkpoints / ".last.pt.shards.tmp", checkpoints / "last.pt.step5.dead00")
    for half in halves:
        half.mkdir()
        for shard in complete.glob("__*.distcp"):
            shutil.copy(shard, half)
    # And a whole-file save killed under another strategy (single, ddp), which the sharded saves pass by.
    (checkpoints / ".last.pt.tmp").write_bytes(b"half a file")
    assert find_resume("auto", run_dir).resolve() == complete
    result = run_train(run_dir, *EXACT, "trainer.epochs=2", "trainer.resume=auto")
    assert result.returncode == 0, result.stderr
    assert f"from epoch 2 batch 1 ({checkpoints / 'last.pt'})" in (run_dir / "train.log").read_text()
    assert _metrics(run_dir)["steps"] == 6  # 3 from the whole step-3 checkpoint, 3 more
    assert not any(half.exists() for half in halves)  # the run's first save cleared them away


def test_a_whole_file_checkpoint_is_read_to_host_memory_before_it_reaches_the_gpus(tmp_path):
    """Read to each GPU, the file would be a second model and optimizer on every rank (under FSDP,
    the whole of both): here, with no CUDA, reading it to the rank's GPU would fail outright."""
    on_gpus = make_context(0, 0, 2, 2, "gpu", use_process_group=False)  # no CUDA needed to name the device
    net = MnistNet(1, 10, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    save_checkpoint(
        {
            "model": net.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": None,
            "epoch": 1,
            "step": 3,
            "best": 0.5,
        },
        tmp_path / "last.pt",
    )
    state = Checkpointer(on_gpus, tmp_path, net, optimizer, None, "").restore(resume_point(tmp_path / "last.pt"))
    assert (state.epoch, state.step) == (1, 3)


@pytest.mark.parametrize(
    "overrides, gloo_beside_nccl",
    [
        (
            ["strategy=fsdp", "strategy.cpu_offload=true"],
            True,
        ),  # gradient shards in host memory: their norm is a host all-reduce
        (["strategy=fsdp"], False),
        (["strategy=ddp"], False),
    ],
)
def test_a_gpu_group_takes_host_tensors_when_fsdp_offloads_to_the_cpu(overrides, gloo_beside_nccl):
    cfg = typed_config("trainer.accelerator=cpu", *overrides)
    plan = plan_launch(cfg.trainer, strategies.get(cfg.strategy), cfg.launcher)
    assert plan.host_collectives == gloo_beside_nccl and plan.context(0, 0).backend == "gloo"
    on_gpus = LaunchPlan("spawn", "gpu", 2, 2, 1, True, None, None, host_collectives=plan.host_collectives)
    assert on_gpus.context(1, 1).backend == ("cuda:nccl,cpu:gloo" if gloo_beside_nccl else "nccl")


@pytest.mark.parametrize(
    "overrides, reshard, mixed, offload",
    [
        ((), True, MixedPrecisionPolicy(), OffloadPolicy),  # 32 bits: no cast
        (("strategy.reshard_after_forward=false",), False, MixedPrecisionPolicy(), OffloadPolicy),
        (
            ("trainer.precision=bf16-mixed",),
            True,
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            OffloadPolicy,
        ),
        (
            ("trainer.precision=bf16-mixed", "strategy.mixed_precision=false"),
            True,
            MixedPrecisionPolicy(),
            OffloadPolicy,
        ),
        (("strategy.cpu_offload=true",), True, MixedPrecisionPolicy(), CPUOffloadPolicy),
    ],
)
def test_the_strategy_options_reach_fully_shard(tmp_path, monkeypatch, overrides, reshard, mixed, offload):
    calls = []
    # distributed/fsdp.py imports fully_shard from torch.distributed.fsdp when it shards.
    monkeypatch.setattr("torch.distributed.fsdp.fully_shard", lambda module, **kw: calls.append((module, kw)) or module)
    cfg = typed_config(*EXACT, *overrides)
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = SimpleCNN(1, 10, 8)
        units = shard_units(model, None)
        strategies.get(cfg.strategy).wrap(model, ctx, None, Precision.of(cfg.trainer.precision, ctx.device).dtype)
    finally:
        dist.destroy_process_group()
    assert [module for module, _ in calls] == [*units, model]  # every block, then the root
    *blocks, root = [kw for _, kw in calls]
    assert [kw["reshard_after_forward"] for kw in blocks] == [reshard] * len(units)
    assert root["reshard_after_forward"] is False  # the root's parameters: the first backward needs them
    assert [kw["mp_policy"] for kw in blocks] == [mixed] * len(units)
    # The root casts the logits back to fp32 for the loss.
    assert root["mp_policy"] == (replace(mixed, output_dtype=torch.float32) if mixed.param_dtype else mixed)
    for kw in (*blocks, root):
        assert type(kw["offload_policy"]) is offload
        assert getattr(kw["offload_policy"], "pin_memory", False) is False  # pinned memory needs CUDA


def test_batchnorm_stays_fp32_when_fsdp_computes_in_bf16(tmp_path):
    # batch_norm refuses bf16 weights beside its fp32 running statistics: each BatchNorm is a group
    # of its own that FSDP does not cast, sharded before the blocks that hold it.
    cfg = typed_config(*EXACT, "trainer.precision=bf16-mixed")
    precision = Precision.of(cfg.trainer.precision, torch.device("cpu"))
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = strategies.get(cfg.strategy).wrap(resnet("resnet18", 3, 10, stem="cifar"), ctx, None, precision.dtype)
        with precision.autocast():
            logits = model(torch.randn(4, 3, 8, 8))
        torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    finally:
        dist.destroy_process_group()
    assert logits.dtype == torch.float32  # the root casts the logits back for the loss
    assert all(g.dtype == torch.float32 and g.isfinite().all() for g in grads.values())
    assert grads["bn1.weight"].abs().sum() > 0


def test_a_whole_file_state_loads_into_an_offloaded_model_with_buffers(tmp_path):
    # The whole-file resume path (best.pt, a single or ddp last.pt): each rank keeps its shards; on
    # GPUs, cpu_offload's shards are in host memory and BatchNorm's statistics on the device.
    cfg = typed_config(*EXACT, "strategy.cpu_offload=true")
    torch.manual_seed(0)
    saved = resnet("resnet18", 3, 10, stem="cifar")
    saved.bn1.running_mean.normal_()
    saved_optimizer = torch.optim.SGD(saved.parameters(), lr=0.1, momentum=0.9)
    saved(torch.randn(4, 3, 8, 8)).sum().backward()
    saved_optimizer.step()
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = strategies.get(cfg.strategy).wrap(resnet("resnet18", 3, 10, stem="cifar"), ctx, None, None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sharded.load_full(model, optimizer, saved.state_dict(), saved_optimizer.state_dict())
        loaded = sharded.gathered_model_state(model)
        momentum = optimizer.state[model.fc.weight]["momentum_buffer"].full_tensor()
    finally:
        dist.destroy_process_group()
    assert loaded.keys() == saved.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in saved.state_dict().items())
    assert torch.equal(momentum, saved_optimizer.state[saved.fc.weight]["momentum_buffer"])


@pytest.mark.slow
def test_resnet18_on_synthetic_images_trains_with_half_the_bytes_per_rank(run_dir):
    # 49 validation images over 2 ranks of 8: rank 0 has 4 batches, rank 1 has 3 and must pad, as
    # it must join rank 0's forward of the sample images for TensorBoard.
    result = run_train(
        run_dir,
        "strategy=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "model=resnet18",
        "dataset=synthetic",
        "dataset.val_size=49",
        "trainer.batch_size=16",
        "trainer.epochs=1",
        "trainer.limit_train_batches=3",
        "launcher.timeout_s=60",
    )
    assert result.returncode == 0, result.stderr
    metrics = _metrics(run_dir)
    whole = sum(p.numel() * p.element_size() for p in resnet("resnet18", 3, 10).parameters())
    for key in ("param_bytes_per_rank", "grad_bytes_per_rank"):
        assert sum(metrics[key]) == whole and max(metrics[key]) <= 0.51 * whole, (key, metrics[key], whole)
    assert sum(metrics["optimizer_bytes_per_rank"]) == whole  # SGD's momentum
    assert math.isfinite(metrics["val_loss"]) and (metrics["val_acc"] * 49) == pytest.approx(
        round(metrics["val_acc"] * 49)
    )
    assert "memory per rank" in (run_dir / "train.log").read_text()
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert len(events.Images("val/samples")) == 1
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert best.keys() == last_weights(run_dir).keys() == resnet("resnet18", 3, 10).state_dict().keys()


@pytest.mark.slow
def test_the_model_evaluated_is_the_model_saved_batchnorm_included(run_dir):
    # Each rank's BatchNorm statistics follow its own data; evaluation must use rank 0's, the saved ones.
    overrides = (*FSDP, "model=resnet18", "model.stem=cifar", "trainer.limit_val_batches=null")
    result = run_train(run_dir, *overrides)
    assert result.returncode == 0, result.stderr
    job = job_config(run_dir, *overrides)
    model = job.model()
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"])
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    val = build_loaders(job.dataset, job.data, ctx, global_batch=64, seed=0).val
    alone = evaluate(model, val, Batches(ctx.device, None), ctx, job.loss())
    assert alone.samples == 360
    assert alone.loss == pytest.approx(_metrics(run_dir)["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_every_train_step_option_runs_under_fsdp(run_dir):
    result = run_train(
        run_dir,
        *FSDP,
        "model=simple_cnn",
        "trainer.precision=bf16-mixed",
        "trainer.channels_last=true",
        "trainer.accumulate_grad_batches=2",
        "trainer.grad_clip=1.0",
        "strategy.cpu_offload=true",
        "strategy.reshard_after_forward=false",
        "trainer.limit_train_batches=6",
    )
    assert result.returncode == 0, result.stderr
    metrics = _metrics(run_dir)
    assert metrics["steps"] == 3 and math.isfinite(metrics["train_loss"])
    # bf16 compute, fp32 shards: the optimizer stepped, and saved, the fp32 weights.
    assert last_weights(run_dir)["features.0.weight"].dtype == torch.float32


@pytest.mark.slow
def test_a_checkpoint_saved_at_2_ranks_resumes_at_1_and_at_4(tmp_path, saved_at_2):
    # 3 more steps from the step-3 checkpoint at 1, 2 and 4 ranks end where 6 unbroken steps at 2
    # ranks do: bitwise at 2, to rounding at 1 and 4 (the global batch is summed in another order).
    unbroken = tmp_path / "unbroken"
    result = run_train(unbroken, *EXACT, "trainer.epochs=2")
    assert result.returncode == 0, result.stderr
    reference = last_weights(unbroken)
    last = saved_at_2 / "checkpoints" / "last.pt"
    for devices in (1, 2, 4):
        run_dir = tmp_path / f"at{devices}"
        result = run_train(run_dir, *EXACT, f"trainer.devices={devices}", "trainer.epochs=2", f"trainer.resume={last}")
        assert result.returncode == 0, result.stderr
        assert "from epoch 2" in (run_dir / "train.log").read_text()
        metrics = _metrics(run_dir)
        assert (metrics["world_size"], metrics["steps"], len(metrics["param_bytes_per_rank"])) == (devices, 6, devices)
        error = relative_error(last_weights(run_dir), reference)
        assert error <= 1e-5, (devices, error)
    assert same_weights(tmp_path / "at2", unbroken)


@pytest.mark.slow
def test_test_only_under_ddp_reports_the_single_process_figures_of_an_fsdp_best_pt_or_sharded_last_pt(
    tmp_path, saved_at_2
):
    """best.pt (one file) and the sharded last.pt (a directory, read whole by every rank) hold the
    same weights here: the run's one epoch was its best."""
    args = ("model=simple_cnn", "trainer.accelerator=cpu", "logger=none", "trainer.test_only=true")
    figures = {}
    for checkpoint in ("best.pt", "last.pt"):
        for name, strategy in (("single", ()), ("ddp", ("strategy=ddp", "trainer.devices=2"))):
            run_dir = tmp_path / f"{checkpoint}-{name}"
            result = run_train(run_dir, *args, *strategy, f"trainer.resume={saved_at_2 / 'checkpoints' / checkpoint}")
            assert result.returncode == 0, result.stderr
            metrics = _metrics(run_dir)
            figures[checkpoint, name] = {k: metrics[k] for k in ("val_acc", "val_acc5", "val_loss", "val_samples")}
            assert metrics["world_size"] == (2 if strategy else 1)
    assert (saved_at_2 / "checkpoints" / "last.pt").is_dir()
    assert all(f == figures["best.pt", "single"] for f in figures.values()), figures
    assert figures["best.pt", "single"]["val_samples"] == 360


@pytest.mark.slow
def test_kill_9_mid_epoch_and_mid_save_then_resume_auto_ends_bitwise_equal(tmp_path):
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    # 3 epochs of 4 steps: a mid-epoch moment in epoch 2, and steps left after it for the kills in a save.
    batches = 4
    fsdp = [
        "strategy=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "debug=limit",
        f"trainer.limit_train_batches={batches}",
    ]
    assert run_train(whole, *fsdp).returncode == 0
    # Its ranks forked (FORK_RANKS): each attempt's kill is what is under test, not how ranks start.
    args = (*fsdp, "trainer.checkpoint_every_n_steps=1", "trainer.resume=auto", FORK_RANKS)
    run = Run(run_dir, *args)
    run.wait_for(lambda: _committed_step(run_dir) > batches)  # epoch 2 under way: last.pt is a mid-epoch checkpoint
    run.kill()
    # The ranks writing their shards of the next: the previous last.pt is still whole.
    _kill_inside_a_sharded_save(run_dir, args)
    step = _committed_step(run_dir)
    result = run_train(run_dir, *args)
    assert result.returncode == 0, result.stderr
    # train.log gains a line per resumed attempt; the last is this run's, from the step last.pt held.
    # The first kill came inside epoch 2: an attempt resumed mid-epoch.
    log = (run_dir / "train.log").read_text()
    resumed = [tuple(map(int, found)) for found in re.findall(r"from epoch (\d+) batch (\d+) \(", log)]
    epoch, batch = resumed[-1]
    assert (epoch - 1) * batches + batch - 1 == step, (resumed, step)
    assert any(batch > 1 for _, batch in resumed), resumed
    assert (_metrics(run_dir)["epochs"], _metrics(run_dir)["steps"]) == (3, 3 * batches)
    assert same_weights(run_dir, whole)


def _kill_inside_a_sharded_save(run_dir: Path, args: tuple[str, ...]) -> None:
    """SIGKILL runs of `args` until one dies while its ranks write their shards of last.pt (the
    shards' temp directory, left behind, proves it), checking after each kill that the previous
    last.pt is whole. A sharded save (each rank's shards, a barrier, the commit) stays open long enough
    for a 1 ms poll to find it."""
    tmp = run_dir / "checkpoints" / ".last.pt.shards.tmp"
    for _ in range(5):
        run = Run(run_dir, *args)
        run.wait_for(tmp.exists, poll=0.001)
        run.kill()
        assert (run_dir / "checkpoints" / "last.pt" / ".metadata").is_file(), "the kill damaged the previous last.pt"
        if tmp.exists():
            return
    raise AssertionError("no kill landed inside a sharded save in 5 tries")


def _committed_step(run_dir: Path) -> int:
    """The step of the checkpoint last.pt points at (last.pt -> last.pt.step<N>.<hex>); 0 before one."""
    try:
        target = os.readlink(run_dir / "checkpoints" / "last.pt")
    except FileNotFoundError:
        return 0
    return int(re.fullmatch(r"last\.pt\.step(\d+)\.\w+", target).group(1))


@pytest.mark.slow
def test_torchrun_two_processes_train_fsdp_like_spawn(tmp_path, fsdp_reference):
    code, stderr = _finish(
        _torchrun(tmp_path, ["--standalone", "--nproc_per_node=2"], "strategy=fsdp", "trainer.devices=2")
    )
    assert code == 0, stderr
    run_dir = _one_run_dir(tmp_path)
    assert (
        _metrics(run_dir)["strategy"] == "fsdp" and _shard_files(run_dir) == SHARDS_OF_2
    )  # each rank wrote its shards
    assert same_weights(run_dir, fsdp_reference)
