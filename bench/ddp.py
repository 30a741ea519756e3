"""Two 1-thread processes (DDP over gloo) against one 2-thread process, at the same global batch, on CPU.

python -m bench.ddp [--quick] [--repeats 3]

Both runs go through `python train.py` with the same model, data, global batch and epochs on this
machine's cores: `strategy=single` is one process with every core as an intra-op thread;
`strategy=ddp trainer.devices=2` is two processes with a core each (train.py's thread policy),
each on half the batch, all-reducing gradients over gloo (OMP_NUM_THREADS, when set, gives every
process that many threads instead; the table's headers say which). So the ratio says how a CPU's cores are
best spent on this model (process parallelism plus gloo all-reduces against intra-op threads),
not what DDP gains by adding devices: no device is added. Figure: steady-state training samples/s
(first epoch excluded); the order alternates per round and the ratio is the median of per-round
ratios. Target: ddp / single ≥ 0.95 (DDP costs no more than 5 % on the same cores).
"""

from __future__ import annotations

import argparse
import gc
import os

from bench.common import FORKSERVER_RANKS, median, per_round, table, train, verdict

TARGET = 0.95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="mnist_net")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    args = parser.parse_args()
    quick = (2 * args.batch_size, args.batch_size, 2, 1)  # two steps an epoch, one validation batch
    train_size, val_size, epochs, repeats = quick if args.quick else (16384, 256, 4, args.repeats)

    common = [
        f"model={args.model}",
        "dataset=synthetic",
        "dataset.channels=1",
        "dataset.image_size=28",
        f"dataset.train_size={train_size}",
        f"dataset.val_size={val_size}",
        f"trainer.batch_size={args.batch_size}",
        f"trainer.epochs={epochs}",
        "trainer.accelerator=cpu",
        "scheduler=none",
    ]
    ddp = ["strategy=ddp", "trainer.devices=2", FORKSERVER_RANKS]
    runs = {"single": [*common, "strategy=single"], "ddp": [*common, *ddp]}
    speeds = {name: [] for name in runs}
    for r in range(repeats):
        for name in ("single", "ddp") if r % 2 == 0 else ("ddp", "single"):
            gc.collect()
            speeds[name].append(train(*runs[name])["train_samples_per_s"])
    ratio = median(per_round(speeds["ddp"], speeds["single"]))
    cores = len(os.sched_getaffinity(0))
    omp = os.environ.get("OMP_NUM_THREADS")  # train.py's thread policy gives way to it
    single_threads, rank_threads = (int(omp), int(omp)) if omp else (cores, max(cores // 2, 1))
    rows = [
        [
            f"{args.model} 1x28x28",
            args.batch_size,
            median(speeds["single"]),
            median(speeds["ddp"]),
            ratio,
            verdict(ratio, TARGET),
        ]
    ]
    print(
        table(
            [
                "case",
                "global batch",
                f"1 process x {single_threads} thread(s) samples/s",
                f"ddp: 2 processes x {rank_threads} thread(s) samples/s",
                "ratio (median of per-round ratios)",
                f"target ≥ {TARGET}",
            ],
            rows,
        )
    )
    print(f"\nThe same {cores} cores either way: this compares two ways to use them, not DDP's scaling over devices.")


if __name__ == "__main__":
    main()
