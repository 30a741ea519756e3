"""The CUDA-only paths, through `python train.py` on a GPU: precisions, DP, NCCL DDP under spawn and
torchrun, FSDP2, the device loader, compile and CUDA graphs, deterministic kernels, exact resume, and
image folders decoded by nvJPEG (data.decode=gpu).

CI has no GPU: there every test here skips. On a machine with one CUDA device run
`python -m pytest tests/test_cuda.py` (BENCHMARKS.md records the last such run).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from config.setup import ROOT
from tests.runs import last_weights, run_train, same_weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# ResNet-18 (CIFAR stem: BatchNorm, convolutions cuDNN picks algorithms for) on random 3x32x32 images.
JOB = [
    "trainer.accelerator=gpu",
    "model=resnet18",
    "model.stem=cifar",
    "dataset=synthetic",
    "dataset.train_size=512",
    "dataset.val_size=256",
    "trainer.batch_size=64",
    "trainer.epochs=2",
    "logger=none",
]


def _train(run_dir, *overrides):
    result = run_train(
        run_dir, *JOB, *overrides, cold=True
    )  # the server adds launcher.start_method=fork, refused on GPUs
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.json").read_text())


def _trained_on_gpu(metrics):
    """Both epochs' 16 steps, a finite loss, and the one GPU's peak memory counted."""
    assert metrics["steps"] == 16 and math.isfinite(metrics["train_loss"]), metrics
    (peak,) = metrics["peak_memory_mb"]
    assert peak > 0, metrics


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_each_precision_trains_on_the_gpu(run_dir, precision):
    metrics = _train(
        run_dir,
        f"trainer.precision={precision}",
        "loss=focal",
        "callbacks=grad_norm",
        "logger=tensorboard",
        "logger.sample_images=0",
    )
    _trained_on_gpu(metrics)
    assert "(cuda)" in (run_dir / "train.log").read_text()
    scaler = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["scaler"]
    # fp16 autocast needs the GradScaler (its scale is saved to resume with); bf16 and fp32 run without.
    assert ("scale" in scaler) == (precision == "16-mixed"), scaler
    # The callback's norm is of the unscaled gradients: fp16's loss scale (2**16 at first) is not in it.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    norms = [e.value for e in events.Scalars("train/grad_norm")]
    assert norms and all(0 < norm < 1000 for norm in norms), norms  # an epoch of overflows only would be NaN


def test_the_fast_path_compiles_and_trains_from_the_device_loader(run_dir):
    metrics = _train(
        run_dir,
        "trainer.precision=bf16-mixed",
        "trainer.channels_last=true",
        "data.loader=device",
        "trainer.compile=true",
    )
    _trained_on_gpu(metrics)


@pytest.mark.parametrize(
    "strategy", [[], ["strategy=ddp", "launcher=spawn"], ["strategy=fsdp"]], ids=["single", "ddp", "fsdp"]
)
def test_cuda_graphs_train_under_each_strategy(run_dir, strategy):
    metrics = _train(
        run_dir,
        "trainer.precision=bf16-mixed",
        "trainer.channels_last=true",
        "data.loader=device",
        "trainer.compile=true",
        "trainer.compile_mode=reduce-overhead",
        *strategy,
    )
    _trained_on_gpu(metrics)


def test_data_parallel_on_one_gpu_saves_the_bare_module(run_dir):
    metrics = _train(run_dir, "strategy=dp", "trainer.gpus=1")
    _trained_on_gpu(metrics)
    assert metrics["strategy"] == "dp"
    assert not any(key.startswith("module.") for key in last_weights(run_dir))


def test_ddp_over_nccl_at_world_size_1_matches_single_bitwise(tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    _train(single, "trainer.deterministic=true")
    metrics = _train(ddp, "trainer.deterministic=true", "strategy=ddp", "launcher=spawn")
    _trained_on_gpu(metrics)
    assert (metrics["strategy"], metrics["world_size"]) == ("ddp", 1)
    assert same_weights(single, ddp)  # DDP's all-reduce over one rank leaves the gradients as they are


def test_the_launch_bound_remedies_train_under_nccl_ddp(run_dir):
    """bench.gpu_profile's: SGD's fused kernel, and DDP without its per-forward buffer copy (that
    this changes nothing saved takes 2 ranks to show: tests/test_strategies.py, on gloo)."""
    metrics = _train(
        run_dir, "strategy=ddp", "launcher=spawn", "optimizer.fused=true", "strategy.forward_sync_buffers=false"
    )
    _trained_on_gpu(metrics)
    (group,) = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["optimizer"]["param_groups"]
    assert group["fused"] is True


def test_torchrun_starts_a_nccl_rank(run_dir):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=1",
        "train.py",
        f"hydra.run.dir={run_dir}",
        "trainer.progress_bar=false",
        *JOB,
        "strategy=ddp",
        "launcher=torchrun",
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    _trained_on_gpu(json.loads((run_dir / "metrics.json").read_text()))


def test_deterministic_runs_repeat_bitwise_and_resume_exactly(tmp_path):
    whole, again, first, rest = (tmp_path / name for name in ("whole", "again", "first", "rest"))
    _train(whole, "trainer.deterministic=true")
    _train(again, "trainer.deterministic=true")
    assert same_weights(whole, again)
    _train(first, "trainer.deterministic=true", "trainer.max_steps=8")  # the end of epoch 1
    _train(rest, "trainer.deterministic=true", f"trainer.resume={first / 'checkpoints' / 'last.pt'}")
    assert same_weights(whole, rest)


@pytest.mark.parametrize("options", [[], ["strategy.cpu_offload=true"]], ids=["on-gpu", "cpu-offload"])
def test_fsdp_trains_in_bf16_and_resumes_from_its_sharded_checkpoint(tmp_path, options):
    first, rest = tmp_path / "first", tmp_path / "rest"
    _train(first, "strategy=fsdp", "trainer.precision=bf16-mixed", "trainer.max_steps=8", *options)
    assert (first / "checkpoints" / "last.pt").is_dir()
    metrics = _train(
        rest,
        "strategy=fsdp",
        "trainer.precision=bf16-mixed",
        *options,
        f"trainer.resume={first / 'checkpoints' / 'last.pt'}",
    )
    _trained_on_gpu(metrics)
    assert "from epoch 2" in (rest / "train.log").read_text()


def test_the_recipes_train_on_the_gpu_and_test_only_reads_their_best(tmp_path):
    run_dir, evaluated = tmp_path / "run", tmp_path / "test"
    metrics = _train(
        run_dir,
        "trainer.precision=bf16-mixed",
        "trainer.label_smoothing=0.1",
        "trainer.mixup_alpha=0.2",
        "trainer.cutmix_alpha=1.0",
        "trainer.ema_decay=0.99",
        "data.loader=device",
        "strategy=ddp",
        "strategy.sync_batchnorm=true",
        "launcher=spawn",
    )
    _trained_on_gpu(metrics)
    assert "val_ema_acc" in metrics
    best = run_dir / "checkpoints" / "best.pt"
    result = run_train(evaluated, *JOB, "trainer.test_only=true", f"trainer.resume={best}", cold=True)
    assert result.returncode == 0, result.stderr[-3000:]
    tested = json.loads((evaluated / "metrics.json").read_text())
    # The weights best.pt scored with, evaluated again in fp32 (training evaluated in bf16): a few of
    # the 256 images may change their answer.
    figure = tested["val_acc" if metrics["best_weights"] == "model" else "val_ema_acc"]
    assert figure == pytest.approx(metrics["best_val_acc"], abs=4 / 256)


def test_more_gpus_than_visible_is_one_line_naming_the_fix(run_dir):
    result = run_train(run_dir, *JOB, f"trainer.gpus={torch.cuda.device_count() + 1}", "strategy=ddp", cold=True)
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "visible" in line and "trainer.accelerator=cpu" in line, result.stderr


def test_gpu_decode_cuts_what_the_workers_cut_and_trains_a_resnet_from_jpegs(tmp_path):
    """data.decode=gpu on CUDA (what data.decode=auto picks there): nvJPEG decodes each batch and
    the GPU cuts it. Its batches are the workers' (data.decode=cpu: the same boxes) up to the two
    JPEG decoders' rounding, odd files come cut from the workers, and train.py trains from it."""
    from data import Loaders, build_loaders
    from distributed.context import make_context
    from tests.configs import typed_config
    from tests.dataset_files import write_image_folder, write_odd_images

    root = write_image_folder(tmp_path / "images", classes=3, per_class=8, size=64, suffix=".jpg")
    write_odd_images(root / "val" / "class2")
    ctx = make_context(0, 0, 1, 1, "gpu", use_process_group=False)
    batches = {}
    for decode in ("gpu", "cpu"):
        cfg = typed_config(
            "dataset=imagefolder",
            f"dataset.root={root}",
            "dataset.num_classes=3",
            "data.num_workers=0",
            f"data.decode={decode}",
        )
        loaders = build_loaders(cfg.dataset, cfg.data, ctx, global_batch=8, seed=0)
        loaders.train_sampler.set_epoch(1)
        batches[decode] = [
            Loaders.to_device(loader, *next(iter(loader)), ctx.device)[0] for loader in (loaders.train, loaders.val)
        ]
        if decode == "gpu":
            assert len(loaders.val.to_device.cpu_decoded) == 0  # the first val batch holds no odd file
    for gpu, cpu in zip(batches["gpu"], batches["cpu"]):
        assert gpu.device.type == "cuda" and gpu.shape == cpu.shape == (8, 3, 224, 224)
        assert (gpu - cpu).abs().mean() < 0.15  # normalised; nvJPEG and libjpeg-turbo round apart, a crop apart is ~1
    result = run_train(
        tmp_path / "run",
        "trainer.accelerator=gpu",
        "model=resnet18",
        "dataset=imagefolder",
        f"dataset.root={root}",
        "dataset.num_classes=3",
        "trainer.batch_size=8",
        "trainer.epochs=2",
        "trainer.precision=bf16-mixed",
        "trainer.channels_last=true",
        "logger=none",
        cold=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 6 and math.isfinite(metrics["train_loss"]), metrics
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("decoded on the CPU instead") == 1  # data.decode=auto chose the GPU; its odd files, once
