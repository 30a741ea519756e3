"""single ≡ dp ≡ ddp ≡ fsdp at the same global batch (also with label smoothing, EMA and repeated
augmentation), accumulation ≡ a bigger batch, SyncBatchNorm on CPU.

The equivalence holds for models without BatchNorm (simple_cnn here): with BatchNorm, DP and DDP
normalise each device's slice of the batch unless strategy.sync_batchnorm is on. DP runs on CPU
as the module itself (one device), so its rows check the bookkeeping, not DataParallel.

Every run here goes through training.run.train, the worker `python train.py` starts; DDP and
FSDP runs are 2 gloo processes started by the real launcher. Each rank keeps the model's whole
state (FSDP's gathered from every rank's shards).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from data import build_loaders
from distributed import context
from distributed.context import DistContext
from distributed.launch import launch
from distributed.sync_batchnorm import GlooSyncBatchNorm
from models.simple_cnn import SimpleCNN
from preflight import check_and_plan
from tests import train_server
from tests.configs import job_and_config, job_config
from tests.runs import last_weights, relative_error, run_train
from training import run as run_job
from training.batches import Batches
from training.checkpoint import sharded
from training.metrics import Averages
from training.validation import evaluate

pytestmark = pytest.mark.slow

STEPS = 8  # digits' 1,437 images make 44 steps of 2B = 32: every run below stays in epoch 1
B = 16
# simple_cnn has no dropout and digits no augmentation: the runs differ only in how they split work.
EQUIVALENCE = (
    "model=simple_cnn",
    "dataset=digits",
    "scheduler=none",
    "trainer.accelerator=cpu",
    "trainer.epochs=1",
    f"trainer.max_steps={STEPS}",
    "trainer.limit_val_batches=1",
    "trainer.progress_bar=false",
)
# Label smoothing, an EMA (decay 0.984 per step after torchvision's adjustment) and repeated augmentation.
RECIPE = ("trainer.label_smoothing=0.1", "trainer.ema_decay=0.999", "data.repeated_augmentations=2")
CLIP = "trainer.grad_clip=0.05"  # below every step's gradient norm here: every step clips
RUNS = {  # name: overrides; the ddp and fsdp runs use 2 processes of B/2
    "single": ("strategy=single", f"trainer.batch_size={B}"),
    "dp": ("strategy=dp", f"trainer.batch_size={B}"),
    "ddp": ("strategy=ddp", "trainer.devices=2", f"trainer.batch_size={B}"),
    "fsdp": ("strategy=fsdp", "trainer.devices=2", f"trainer.batch_size={B}"),
    "fsdp_zero2": (
        "strategy=fsdp",
        "strategy.reshard_after_forward=false",
        "trainer.devices=2",
        f"trainer.batch_size={B}",
    ),
    "single_2B": ("strategy=single", f"trainer.batch_size={2 * B}"),
    "single_acc2": ("strategy=single", f"trainer.batch_size={B}", "trainer.accumulate_grad_batches=2"),
    "dp_acc2": ("strategy=dp", f"trainer.batch_size={B}", "trainer.accumulate_grad_batches=2"),
    "ddp_acc2": ("strategy=ddp", "trainer.devices=2", f"trainer.batch_size={B}", "trainer.accumulate_grad_batches=2"),
    "single_recipe": ("strategy=single", f"trainer.batch_size={B}", *RECIPE),
    "ddp_recipe": ("strategy=ddp", "trainer.devices=2", f"trainer.batch_size={B}", *RECIPE),
    "fsdp_acc2": ("strategy=fsdp", "trainer.devices=2", f"trainer.batch_size={B}", "trainer.accumulate_grad_batches=2"),
    "single_clip": ("strategy=single", f"trainer.batch_size={B}", CLIP),
    "fsdp_clip": ("strategy=fsdp", "trainer.devices=2", f"trainer.batch_size={B}", CLIP),
}


def _train_and_dump(ctx: DistContext, jobs: list[tuple], out: str, check_sync_bn: bool = False) -> None:
    """Run each (name, cfg) in turn in this process group; keep every rank's final weights."""
    context.init(ctx, jobs[0][1].launcher.timeout_s)
    try:
        if check_sync_bn and ctx.world_size == 2:  # two halves of one batch
            _compare_sync_bn_with_batchnorm(ctx, Path(out))
        for name, job in jobs:
            model = run_job.train(ctx, job)
            torch.save(sharded.gathered_model_state(model), Path(out) / f"{name}.rank{ctx.rank}.pt")
            del model
    finally:
        context.shutdown(ctx, clean=True)


def _run_all(runs: dict[str, tuple], base: tuple, out: Path, check_sync_bn: bool = False) -> dict[str, list[dict]]:
    """One launch for all single-process runs, one for all 2-process runs: spawning is the cost.

    Returns each run's final weights, one state_dict per rank.
    """
    # The ranks fork from this worker's train server (tests/train_server.py): nothing left to import.
    train_server.ensure_running()
    base = (*base, "launcher.start_method=forkserver")
    plans, by_processes = {}, {}
    for name, overrides in runs.items():
        job, config = job_and_config(out / name, *base, *overrides)
        plans[name] = check_and_plan(config).launch
        by_processes.setdefault(plans[name].world_size, []).append((name, job))
    for jobs in by_processes.values():
        launch(plans[jobs[0][0]], _train_and_dump, jobs, str(out), check_sync_bn)
    return {
        name: [torch.load(out / f"{name}.rank{r}.pt", weights_only=True) for r in range(plan.world_size)]
        for name, plan in plans.items()
    }


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """Every run of RUNS, done once: the directory holding each run's dir, and its final weights."""
    out = tmp_path_factory.mktemp("equivalence")
    weights = _run_all(RUNS, EQUIVALENCE, out)
    for name in RUNS:
        assert _metrics(out / name)["steps"] == STEPS, name
    return out, weights


@pytest.fixture(scope="module")
def weights(equivalence) -> dict[str, list[dict]]:
    return equivalence[1]


def _assert_replicas_identical(replicas: list[dict]) -> None:
    first, *others = replicas
    for other in others:
        for key in first:
            assert torch.equal(first[key], other[key]), key


def test_single_dp_and_ddp_end_with_the_same_weights(weights):
    (single,) = weights["single"]
    assert relative_error(weights["dp"][0], single) <= 1e-5
    assert relative_error(weights["ddp"][0], single) <= 1e-5
    _assert_replicas_identical(weights["ddp"])


def test_fsdp_ends_with_the_weights_of_single_and_ddp(weights):
    (single,) = weights["single"]
    assert relative_error(weights["fsdp"][0], single) <= 1e-5
    assert relative_error(weights["fsdp"][0], weights["ddp"][0]) <= 1e-5
    _assert_replicas_identical(weights["fsdp"])
    # ZeRO-2 keeps the gathered parameters from forward to backward: the same arithmetic.
    _assert_replicas_identical([weights["fsdp"][0], weights["fsdp_zero2"][0]])


def test_fsdp_clips_by_the_norm_of_all_shards_together(weights):
    # Each rank's clip_grad_norm_ sees DTensor shards; a norm over its own shard alone would clip differently.
    (single,) = weights["single_clip"]
    assert relative_error(weights["fsdp_clip"][0], single) <= 1e-5
    assert relative_error(single, weights["single"][0]) > 1e-3  # the clipping changed training


def test_fsdp_holds_half_the_bytes_per_rank(equivalence):
    out, _ = equivalence
    single, fsdp = _metrics(out / "single"), _metrics(out / "fsdp")
    whole = sum(p.numel() * 4 for p in SimpleCNN(1, 10, 8).parameters())
    assert single["param_bytes_per_rank"] == single["grad_bytes_per_rank"] == [whole]
    assert sum(fsdp["param_bytes_per_rank"]) == sum(fsdp["grad_bytes_per_rank"]) == whole
    assert max(fsdp["param_bytes_per_rank"]) <= 0.51 * whole
    # SGD's momentum: one buffer per parameter, sharded like it.
    assert single["optimizer_bytes_per_rank"] == [whole] and sum(fsdp["optimizer_bytes_per_rank"]) == whole


def test_accumulating_two_batches_equals_one_batch_twice_as_big(weights):
    (big,) = weights["single_2B"]
    for name in ("single_acc2", "dp_acc2", "ddp_acc2", "fsdp_acc2"):
        assert relative_error(weights[name][0], big) <= 1e-5, name
    _assert_replicas_identical(weights["ddp_acc2"])


def test_label_smoothing_ema_and_repeated_augmentation_train_the_same_under_ddp(equivalence, weights):
    (single,) = weights["single_recipe"]
    assert relative_error(weights["ddp_recipe"][0], single) <= 1e-5
    _assert_replicas_identical(weights["ddp_recipe"])
    out, _ = equivalence
    ema = {name: _checkpoint(out / name)["ema"] for name in ("single_recipe", "ddp_recipe")}
    averaged = {name: {k: v for k, v in state.items() if k != "n_averaged"} for name, state in ema.items()}
    assert relative_error(averaged["ddp_recipe"], averaged["single_recipe"]) <= 1e-5
    assert int(ema["ddp_recipe"]["n_averaged"]) == STEPS
    assert relative_error(averaged["single_recipe"], {f"module.{k}": v for k, v in single.items()}) > 1e-3


def test_every_strategy_reports_the_training_figures_of_the_whole_global_batch(equivalence):
    # Each rank of 2 trains on half the batch: its own loss and accuracy alone would be half the story.
    out, _ = equivalence
    for name, reference in (
        ("dp", "single"),
        ("ddp", "single"),
        ("fsdp", "single"),
        ("ddp_acc2", "single_acc2"),
        ("ddp_recipe", "single_recipe"),
    ):
        ran, expected = _metrics(out / name), _metrics(out / reference)
        assert ran["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5), name
        assert ran["train_acc"] == pytest.approx(expected["train_acc"], abs=1e-9), name


def test_the_tolerance_tells_different_training_apart(weights):
    # The same steps at another batch size land far outside 1e-5: the checks above can fail.
    assert relative_error(weights["single"][0], weights["single_2B"][0]) > 1e-3


SYNC_BN = (
    "model=resnet18",
    "dataset=digits",
    "strategy=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=1",
    "trainer.progress_bar=false",
    # Small steps: at the default lr the second step lands where resnet18's BatchNorm on 8x8 images
    # amplifies float32's rounding, so the tolerance below held on some CPUs and not on others.
    "optimizer.lr=0.005",
)


def _bn_statistics(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var"))}


SYNC_BN_RUNS = {
    "sync": ("strategy.sync_batchnorm=true",),
    "local": ("strategy.sync_batchnorm=false", "trainer.ema_decay=0.999"),
    "local_unsynced": (
        "strategy.sync_batchnorm=false",
        "trainer.ema_decay=0.999",
        "strategy.forward_sync_buffers=false",
    ),
    "single": ("strategy=single", "trainer.devices=1"),  # the whole batch of 16 in one BatchNorm
}


@pytest.fixture(scope="module")
def sync_bn(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """resnet18 under DDP(2) with and without sync_batchnorm (and with an EMA), after the BatchNorm math check."""
    out = tmp_path_factory.mktemp("sync_bn")
    return out, _run_all(SYNC_BN_RUNS, SYNC_BN, out, check_sync_bn=True)


def test_sync_batchnorm_trains_resnet18_as_one_process_on_the_global_batch(sync_bn):
    # Each rank's BatchNorm normalises by the statistics of both ranks' halves: the weights and the
    # running statistics are one process's on all 16 images; without it, each half's own.
    out, weights = sync_bn
    (single,) = weights["single"]
    assert len(_bn_statistics(single)) == 2 * 20  # resnet18's 20 BatchNorm layers
    _assert_replicas_identical(weights["sync"])
    assert relative_error(weights["sync"][0], single) <= 1e-4
    assert relative_error(_bn_statistics(weights["local"][0]), _bn_statistics(single)) > 1e-2
    for name in weights:
        assert _checkpoint(out / name)["step"] == 2
        assert math.isfinite(_metrics(out / name)["train_loss"])


def test_ddp_reports_the_figures_of_the_model_and_ema_it_saves(sync_bn):
    """Without sync_batchnorm each rank normalises by its own half-batch: the last training forward
    leaves every rank statistics of its own, and its EMA an average of them. Evaluated as they
    were, the figures would mix ranks' models; they must be those of rank 0's, which last.pt holds."""
    out, weights = sync_bn
    _assert_replicas_identical(weights["local"])  # what each rank evaluated
    saved, metrics = _checkpoint(out / "local"), _metrics(out / "local")
    job = job_config(out / "local", *SYNC_BN, *SYNC_BN_RUNS["local"])
    net = job.model()
    net.load_state_dict(saved["model"])
    ema = AveragedModel(job.model(), use_buffers=True)
    ema.load_state_dict(saved["ema"])
    for prefix, model in (("val", net), ("val_ema", ema.module)):
        shards = [_evaluate_shard(model, job, rank) for rank in range(2)]
        loss = sum(shard.loss * shard.samples for shard in shards) / sum(shard.samples for shard in shards)
        assert metrics[f"{prefix}_loss"] == pytest.approx(loss, rel=1e-9, abs=0), prefix


def test_skipping_ddps_buffer_broadcast_changes_nothing_saved_or_reported(sync_bn):
    """Without it, rank 1 trains on BatchNorm statistics of its own, not rank 0's: rank 0, which
    only ever receives its own, trains the same, and evaluation and checkpoints take its buffers."""
    out, weights = sync_bn
    _assert_replicas_identical([weights["local"][0], *weights["local_unsynced"]])
    synced, unsynced = _checkpoint(out / "local"), _checkpoint(out / "local_unsynced")
    for part in ("model", "ema"):
        assert synced[part].keys() == unsynced[part].keys()
        assert all(torch.equal(synced[part][k], unsynced[part][k]) for k in synced[part]), part
    figures = ("val_loss", "val_acc", "val_ema_loss", "train_loss")
    assert [_metrics(out / "local")[f] for f in figures] == [_metrics(out / "local_unsynced")[f] for f in figures]


def _evaluate_shard(model: nn.Module, job, rank: int) -> Averages:
    """Rank `rank` of 2's validation figures, computed in this process."""
    ctx = context.make_context(rank, rank, 2, 2, "cpu", use_process_group=False)
    loaders = build_loaders(job.dataset, job.data, ctx, job.trainer.batch_size, job.trainer.seed)
    return evaluate(model, loaders.val, Batches(ctx.device, job.trainer.limit_val_batches), ctx, job.loss())


def _compare_sync_bn_with_batchnorm(ctx: DistContext, out: Path) -> None:
    """Rank r normalises half the batch with GlooSyncBatchNorm; BatchNorm2d all of it."""
    torch.manual_seed(0)
    x, upstream = torch.randn(8, 3, 4, 4) * 3 + 1, torch.randn(8, 3, 4, 4)
    reference, synced = nn.BatchNorm2d(3), GlooSyncBatchNorm(3)
    full = x.clone().requires_grad_()
    expected = reference(full)
    (expected * upstream).sum().backward()
    half = slice(4 * ctx.rank, 4 * ctx.rank + 4)
    mine = x[half].clone().requires_grad_()
    output = synced(mine)
    (output * upstream[half]).sum().backward()
    errors = {
        "output": output - expected[half],
        "input_grad": mine.grad - full.grad[half],
        "running_mean": synced.running_mean - reference.running_mean,
        "running_var": synced.running_var - reference.running_var,
    }
    torch.save({k: v.detach().abs().max() for k, v in errors.items()}, out / f"bn_errors.rank{ctx.rank}.pt")


def test_gloo_sync_batchnorm_is_batchnorm_over_the_global_batch(sync_bn):
    out, _ = sync_bn
    for rank in range(2):
        errors = torch.load(out / f"bn_errors.rank{rank}.pt", weights_only=True)
        assert all(error < 1e-5 for error in errors.values()), errors


TINY = ("debug=fdr", "model=simple_cnn")


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_fp16_on_cpu_is_a_one_line_error(run_dir):
    result = run_train(run_dir, *TINY, "trainer.precision=16-mixed")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.precision=16-mixed needs CUDA"), result.stderr
    assert not (run_dir / "checkpoints").exists()


def test_bf16_channels_last_run_finishes_on_cpu(run_dir):
    result = run_train(
        run_dir,
        *TINY,
        "trainer.precision=bf16-mixed",
        "trainer.channels_last=true",
        "trainer.max_steps=3",
        "trainer.limit_train_batches=6",
        "trainer.accumulate_grad_batches=2",
        "trainer.grad_clip=1.0",
    )
    assert result.returncode == 0, result.stderr
    metrics = _metrics(run_dir)
    assert metrics["steps"] == 3 and math.isfinite(metrics["train_loss"])
    assert metrics["train_samples_per_s"] > 0 and metrics["peak_memory_mb"] is None  # CPU: no CUDA peak
    # The model trained in NHWC: its 6-channel conv weight is stored channels-last.
    assert _checkpoint(run_dir)["model"]["features.3.weight"].is_contiguous(memory_format=torch.channels_last)


# Both in this file, one after the other: inductor's first compile into an empty cache (a fresh
# clone's) costs many times a later one, and two workers compiling at once would both pay it.
@pytest.mark.parametrize("strategy", ["debug=fdr", "debug=fsdp_cpu"], ids=["single", "fsdp"])
def test_compiled_model_trains_a_step_and_saves_plain_keys(run_dir, strategy):
    result = run_train(
        run_dir, strategy, "model=simple_cnn", "trainer.compile=true", "trainer.max_steps=1", timeout=280
    )
    assert result.returncode == 0, result.stderr
    assert _metrics(run_dir)["steps"] == 1
    assert last_weights(run_dir).keys() == SimpleCNN(1, 10, 8).state_dict().keys()  # no _orig_mod. prefix


def test_a_ddp_checkpoint_resumes_under_dp(equivalence, run_dir):
    ddp = equivalence[0] / "ddp" / "checkpoints" / "last.pt"  # epoch 1 stopped at STEPS (max_steps) by 2 ranks
    result = run_train(
        run_dir,
        *TINY,
        "strategy=dp",
        f"trainer.batch_size={B}",
        "trainer.epochs=2",
        "trainer.limit_train_batches=3",
        "scheduler=none",
        f"trainer.resume={ddp}",
    )
    assert result.returncode == 0, result.stderr
    # A mid-epoch checkpoint, past this run's 3 batches an epoch: epoch 1 has none left to train.
    assert f"from epoch 1 batch {STEPS + 1}" in (run_dir / "train.log").read_text()
    assert (_checkpoint(run_dir)["epoch"], _checkpoint(run_dir)["step"]) == (2, STEPS + 3)


def test_a_ddp_checkpoint_resumes_under_fsdp(equivalence, run_dir):
    ddp = equivalence[0] / "ddp" / "checkpoints" / "last.pt"  # a whole file: each fsdp rank keeps its shards of it
    result = run_train(
        run_dir,
        *TINY,
        "strategy=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        f"trainer.batch_size={B}",
        "trainer.epochs=2",
        "trainer.limit_train_batches=3",
        "scheduler=none",
        f"trainer.resume={ddp}",
    )
    assert result.returncode == 0, result.stderr
    assert f"from epoch 1 batch {STEPS + 1}" in (run_dir / "train.log").read_text()
    assert _metrics(run_dir)["steps"] == STEPS + 3 and (run_dir / "checkpoints" / "last.pt" / ".metadata").is_file()


def test_an_fsdp_run_resumes_under_single_and_its_best_pt_loads_anywhere(equivalence, run_dir):
    fsdp = equivalence[0] / "fsdp" / "checkpoints"
    assert (fsdp / "last.pt" / ".metadata").is_file()  # sharded: a torch.distributed.checkpoint directory
    best = torch.load(fsdp / "best.pt", weights_only=True)  # whole: the plain model's keys and shapes
    assert {k: v.shape for k, v in best["model"].items()} == {
        k: v.shape for k, v in SimpleCNN(1, 10, 8).state_dict().items()
    }
    assert set(best["optimizer"]["state"]) == set(range(len(best["model"])))  # indexed as optimizer.state_dict() does
    result = run_train(
        run_dir,
        *TINY,
        "strategy=single",
        f"trainer.batch_size={B}",
        "trainer.epochs=2",
        "trainer.limit_train_batches=3",
        "scheduler=none",
        f"trainer.resume={fsdp / 'last.pt'}",
    )
    assert result.returncode == 0, result.stderr
    assert (_checkpoint(run_dir)["epoch"], _checkpoint(run_dir)["step"]) == (2, STEPS + 3)
