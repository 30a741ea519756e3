"""GPU figures, CUDA only (elsewhere it says so and exits 0).

python -m bench.gpu [--quick] [--rows NAME ...] [--cifar-root DIR]

1. ResNet-50 on CIFAR-10-shaped data (random images written in CIFAR-10's format): seed 000's
   configuration as written (bench/plain_seed000.py: fp32, PIL transforms in 8 workers) against
   train.py with bf16-mixed, channels_last, data.loader=device and compile, in torch.compile's
   default mode and with CUDA graphs (trainer.compile_mode=reduce-overhead). Steady-state training
   samples/s. Target: ours / seed ≥ 2.
2. DDP over NCCL at world size 1 against single, same config, eager and with CUDA graphs, each
   with and without DDP's per-forward buffer broadcast. Target: overhead ≤ 3 %.
3. With --cifar-root holding the real CIFAR-10: ResNet-18 (CIFAR stem) to 94 % validation
   accuracy, timed from the command to the first epoch that reaches it (read back from
   TensorBoard's event file). Target: ≤ 60 s on one H100.

A row whose run fails says so in the table (its stderr is printed above it); the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, python_json, table, train, verdict
from bench.data_loaders import write_cifar_shaped

SPEEDUP_TARGET, DDP_OVERHEAD_TARGET, TTA_TARGET_S, TTA_ACC = 2.0, 0.03, 60.0, 0.94
SEED000 = [
    "model=resnet50",
    "trainer.batch_size=128",
    "optimizer=sgd",
    "optimizer.lr=0.1",
    "optimizer.nesterov=false",
    "scheduler=none",
    "trainer.accelerator=gpu",
]
FAST = ["trainer.precision=bf16-mixed", "trainer.channels_last=true", "data.loader=device"]
COMPILED = ["trainer.compile=true"]
GRAPHED = [*COMPILED, "trainer.compile_mode=reduce-overhead"]
DDP1 = ["strategy=ddp", "trainer.devices=1"]
UNSYNCED = ["strategy.forward_sync_buffers=false"]
RUNS = {  # train.py's runs, after seed 000's, in this order
    "compiled": COMPILED,
    "graphed": GRAPHED,
    "single": [],
    "ddp": DDP1,
    "ddp_unsynced": [*DDP1, *UNSYNCED],
    "ddp_graphed": [*GRAPHED, *DDP1],
    "ddp_graphed_unsynced": [*GRAPHED, *DDP1, *UNSYNCED],
    "graphed_fused": [*GRAPHED, "optimizer.fused=true"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run; its figures mean nothing")
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=RUNS,
        default=list(RUNS),
        help="train.py's runs to measure after seed 000's (default: all); the others read 'not run'",
    )
    parser.add_argument("--cifar-root", type=Path, help="a root holding the real cifar-10-batches-py/")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench.gpu: skipped, no CUDA device visible")
        return
    images, epochs = (2_560, 2) if args.quick else (25_600, 4)
    print(
        f"device: {torch.cuda.get_device_name(0)}; {images} CIFAR-shaped images, {epochs} epochs, median after the first\n"
    )

    with tempfile.TemporaryDirectory() as root:
        write_cifar_shaped(Path(root), images)
        data = ["dataset=cifar10", f"dataset.root={root}", "dataset.download=false", f"trainer.epochs={epochs}"]
        seed = python_json("-m", "bench.plain_seed000", "--root", root, "--epochs", str(epochs))["samples_per_s"]
        print(f"seed 000: {seed:.0f} samples/s", flush=True)
        speed = dict.fromkeys(RUNS, "not run")
        for name in args.rows:  # each figure as it comes: a call cut short keeps the others
            figure = speed[name] = samples_per_s(*SEED000, *data, *FAST, *RUNS[name])
            print(f"{name}: {figure:.0f} samples/s" if isinstance(figure, float) else f"{name}: {figure}", flush=True)
    compiled, graphed, single = speed["compiled"], speed["graphed"], speed["single"]
    print(
        table(
            ["ResNet-50, CIFAR-shaped, batch 128", "samples/s", "ratio", "target"],
            [
                ["seed 000 as written (fp32, PIL workers)", seed, "", ""],
                ["train.py bf16 + channels_last + device loader + compile", compiled, *speedup(compiled, seed)],
                ["the same with CUDA graphs (compile_mode=reduce-overhead)", graphed, *speedup(graphed, seed)],
                [
                    "the same with SGD's fused kernel (optimizer.fused=true)",
                    speed["graphed_fused"],
                    *speedup(speed["graphed_fused"], seed),
                ],
                ["train.py single (bf16, channels_last, device loader)", single, "", ""],
                ["train.py DDP, NCCL, world size 1 (same)", speed["ddp"], *overhead(speed["ddp"], single)],
                [
                    "the same, strategy.forward_sync_buffers=false",
                    speed["ddp_unsynced"],
                    *overhead(speed["ddp_unsynced"], single),
                ],
                [
                    "train.py DDP, NCCL, world size 1, with CUDA graphs",
                    speed["ddp_graphed"],
                    *overhead(speed["ddp_graphed"], graphed),
                ],
                [
                    "the same, strategy.forward_sync_buffers=false",
                    speed["ddp_graphed_unsynced"],
                    *overhead(speed["ddp_graphed_unsynced"], graphed),
                ],
            ],
        )
    )
    if args.cifar_root is not None:
        seconds, acc = time_to_accuracy(args.cifar_root)
        print()
        print(
            table(
                ["ResNet-18 (CIFAR stem), real CIFAR-10", f"seconds to {TTA_ACC:.0%}", "best val acc", "target"],
                [
                    [
                        "train.py",
                        seconds if seconds is not None else "not reached",
                        acc,
                        f"≤ {TTA_TARGET_S:.0f} s: "
                        + (verdict(seconds, TTA_TARGET_S, higher_is_better=False) if seconds else "MISSES target"),
                    ]
                ],
            )
        )


def samples_per_s(*overrides: str) -> float | str:
    """train.py's steady-state samples/s, or "failed" once its stderr is printed."""
    try:
        return train(*overrides)["train_samples_per_s"]
    except SystemExit as failed:
        print(failed.code, file=sys.stderr)
        return "failed"


def speedup(ours: float | str, seed: float) -> list[object]:
    if isinstance(ours, str):
        return ["", ""]
    return [ours / seed, f"≥ {SPEEDUP_TARGET}×: {verdict(ours / seed, SPEEDUP_TARGET)}"]


def overhead(ddp: float | str, single: float | str) -> list[object]:
    if isinstance(ddp, str) or isinstance(single, str):
        return ["", ""]
    lost = 1 - ddp / single
    return [
        f"overhead {lost:.1%}",
        f"≤ {DDP_OVERHEAD_TARGET:.0%}: {verdict(lost, DDP_OVERHEAD_TARGET, higher_is_better=False)}",
    ]


def time_to_accuracy(cifar_root: Path) -> tuple[float | None, float]:
    """Seconds from the command to the first validation at ≥ 94 %, from the run's own TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "train.py",
            f"hydra.run.dir={run_dir}",
            "trainer.progress_bar=false",
            "model=resnet18",
            "model.stem=cifar",
            "dataset=cifar10",
            f"dataset.root={cifar_root}",
            "dataset.download=false",
            *FAST,
            "trainer.compile=true",
            "trainer.accelerator=gpu",
            "trainer.batch_size=512",
            "trainer.epochs=30",
            "optimizer=sgd",
            "optimizer.lr=0.2",
            "scheduler=cosine",
        ]
        start = time.time()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd[1:])} failed:\n{done.stderr}")
        events = EventAccumulator(str(Path(run_dir) / "tb"))
        events.Reload()
        accs = events.Scalars("val/acc")
        reached = next((e.wall_time - start for e in accs if e.value >= TTA_ACC), None)
        return reached, max(e.value for e in accs)


if __name__ == "__main__":
    main()
