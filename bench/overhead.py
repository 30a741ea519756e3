"""What train.py's loop costs against a hand-written loop doing the same work.

python -m bench.overhead [--quick] [--repeats 3]

Each case trains the same model on the same synthetic data with the same batch, optimizer and
threads, once through `python train.py` and once through bench/plain_loop.py (a DataLoader loop).
Figure: steady-state training samples/s (first epoch excluded). Each round runs both, the order
alternating per round, so that neither always inherits the other's warm caches or a burst of
load; the ratio is the median of the per-round ratios, not the ratio of the medians.
Target: ours / plain ≥ 0.98.
"""

from __future__ import annotations

import argparse
import gc

from bench.common import median, per_round, python_json, table, train, verdict

TARGET = 0.98
# (model, channels, image size): seed 001's CNN on CIFAR-shaped data, seed 002's Net on MNIST-shaped.
CASES = [("simple_cnn", 3, 32), ("mnist_net", 1, 28)]


def ours(model: str, channels: int, size: int, train_size: int, batch: int, epochs: int) -> float:
    return train(
        f"model={model}",
        "dataset=synthetic",
        f"dataset.channels={channels}",
        f"dataset.image_size={size}",
        f"dataset.train_size={train_size}",
        "dataset.val_size=256",
        f"trainer.batch_size={batch}",
        f"trainer.epochs={epochs}",
        "trainer.accelerator=cpu",
        "optimizer=sgd",
        "scheduler=none",
    )["train_samples_per_s"]


def plain(model: str, channels: int, size: int, train_size: int, batch: int, epochs: int) -> float:
    return python_json(
        "-m",
        "bench.plain_loop",
        "--model",
        model,
        "--channels",
        str(channels),
        "--image-size",
        str(size),
        "--train-size",
        str(train_size),
        "--batch-size",
        str(batch),
        "--epochs",
        str(epochs),
    )["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    train_size, batch, epochs, repeats = (32, 16, 2, 1) if args.quick else (8192, 64, 4, args.repeats)

    rows = []
    for model, channels, size in CASES[:1] if args.quick else CASES:
        speeds = {ours: [], plain: []}
        for r in range(repeats):
            for run in (ours, plain) if r % 2 == 0 else (plain, ours):
                gc.collect()
                speeds[run].append(run(model, channels, size, train_size, batch, epochs))
        ratio = median(per_round(speeds[ours], speeds[plain]))
        rows.append(
            [
                f"{model} {channels}x{size}x{size}",
                batch,
                median(speeds[ours]),
                median(speeds[plain]),
                ratio,
                verdict(ratio, TARGET),
            ]
        )
    print(
        table(
            [
                "case",
                "batch",
                "train.py samples/s (median)",
                "plain loop samples/s (median)",
                "ratio (median of per-round ratios)",
                f"target ≥ {TARGET}",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
