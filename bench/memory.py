"""What one rank holds for training under DDP and under FSDP: parameter, gradient and optimizer
state bytes, on CPU.

python -m bench.memory [--quick] [--model resnet50]

Each row is one `python train.py` run of a few optimizer steps (SGD with momentum: one state
buffer per parameter) on synthetic 3x32x32 images; the figures are its metrics.json's
param/grad/optimizer_bytes_per_rank, counted from each rank's local shards, of its largest rank
(the one that must fit). They depend on the model and the world size only, not on the machine.
Target: FSDP over N ranks holds at most 1.05 / N of what a DDP rank holds (sharding pads a
tensor's first dimension to a multiple of N, and takes no more).
"""

from __future__ import annotations

import argparse

from bench.common import FORKSERVER_RANKS, table, train, verdict

TARGET = 1.05
RUNS = [("ddp", 2), ("fsdp", 2), ("fsdp", 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 ranks: the shape of the table, fast")
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    model = "mnist_net" if args.quick else args.model

    rows, baseline = [], None
    for strategy, ranks in RUNS[:2] if args.quick else RUNS:
        metrics = train(
            f"model={model}",
            "dataset=synthetic",
            "dataset.image_size=32",
            "dataset.train_size=64",
            "dataset.val_size=16",
            "trainer.batch_size=16",
            "trainer.epochs=1",
            "trainer.max_steps=2",
            "trainer.accelerator=cpu",
            f"trainer.devices={ranks}",
            f"strategy={strategy}",
            "optimizer=sgd",
            "scheduler=none",
            "logger=none",
            FORKSERVER_RANKS,
            *(["dataset.channels=1", "dataset.image_size=28"] if model == "mnist_net" else []),
        )
        sizes = [max(metrics[f"{kind}_bytes_per_rank"]) / 1e6 for kind in ("param", "grad", "optimizer")]
        total = sum(sizes)
        baseline = baseline or total  # the first row: DDP
        share = total / baseline
        ideal = 1 / ranks if strategy == "fsdp" else 1.0
        rows.append(
            [
                f"{strategy}({ranks})",
                *sizes,
                total,
                share,
                ideal,
                verdict(share / ideal, TARGET, higher_is_better=False),
            ]
        )
    headers = [
        "strategy",
        "params MB/rank",
        "grads MB/rank",
        "optimizer MB/rank",
        "total MB/rank",
        "× ddp",
        "ideal × ddp",
        f"target ≤ {TARGET} × ideal",
    ]
    print(f"{model}, SGD with momentum, largest rank:")
    print(table(headers, rows))


if __name__ == "__main__":
    main()
