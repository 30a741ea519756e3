"""DDP over 2 gloo processes against one process, at the same global batch, on CPU.

python -m bench.ddp [--quick]

Both runs go through `python train.py` with the same model, data, global batch and epochs; the
single process gets all the cores, each DDP rank its share (train.py's thread policy). Figure:
steady-state training samples/s (first epoch excluded), median over alternating repeats.
Target: ddp / single ≥ 0.95.
"""
from __future__ import annotations

import argparse

from bench.common import median, table, train, verdict

TARGET = 0.95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="mnist_net")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    args = parser.parse_args()
    train_size, epochs, repeats = (512, 2, 1) if args.quick else (16384, 4, args.repeats)

    common = [
        f"model={args.model}", "dataset=synthetic", "dataset.channels=1", "dataset.image_size=28",
        f"dataset.train_size={train_size}", "dataset.val_size=256", f"trainer.batch_size={args.batch_size}",
        f"trainer.epochs={epochs}", "trainer.accelerator=cpu", "scheduler=none",
    ]
    single, ddp = [], []
    for _ in range(repeats):
        single.append(train(*common, "strategy=single")["train_samples_per_s"])
        ddp.append(train(*common, "strategy=ddp", "trainer.devices=2")["train_samples_per_s"])
    ratio = median(ddp) / median(single)
    rows = [[f"{args.model} 1x28x28", args.batch_size, median(single), median(ddp), ratio, verdict(ratio, TARGET)]]
    print(table(["case", "global batch", "single samples/s", "ddp(2, gloo) samples/s", "ratio", f"target ≥ {TARGET}"], rows))


if __name__ == "__main__":
    main()
