"""FSDP against DDP over 2 gloo processes on CPU, at the same global batch: throughput.

python -m bench.fsdp [--quick] [--repeats 3] [--model resnet18]

Both go through `python train.py` with the same model, data, batch and epochs, one run after the
other (ddp, fsdp, fsdp ZeRO-2, ddp, ...) so that each trio sees the same machine; figure:
steady-state training samples/s (first epoch excluded); each repeat gives a ratio to its own DDP
run, and the table shows the median of those ratios and their range. No target: FSDP trades
speed for memory, and what it costs here is the number to know.
"""

from __future__ import annotations

import argparse

from bench.common import FORKSERVER_RANKS, median, per_round, spread, table, train

SYSTEMS = {  # name: overrides
    "ddp(2)": ("strategy=ddp",),
    "fsdp(2)": ("strategy=fsdp",),
    "fsdp(2) ZeRO-2": ("strategy=fsdp", "strategy.reshard_after_forward=false"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="a tiny smoke run of ddp(2) and fsdp(2); its figures mean nothing"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    args = parser.parse_args()
    quick = ("mnist_net", 2 * args.batch_size, args.batch_size, 2, 1)  # two steps an epoch, one validation batch
    model, train_size, val_size, epochs, repeats = quick if args.quick else (args.model, 1024, 128, 3, args.repeats)

    common = [
        f"model={model}",
        "dataset=synthetic",
        f"dataset.train_size={train_size}",
        f"dataset.val_size={val_size}",
        f"trainer.batch_size={args.batch_size}",
        f"trainer.epochs={epochs}",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "scheduler=none",
        "logger=none",
        FORKSERVER_RANKS,
        *(["dataset.channels=1", "dataset.image_size=28"] if model == "mnist_net" else []),
    ]
    # --quick leaves ZeRO-2 out: its row is fsdp(2)'s with one option more, made by the same code.
    systems = dict(list(SYSTEMS.items())[:2]) if args.quick else SYSTEMS
    speeds: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, overrides in systems.items():
            speeds[name].append(train(*common, *overrides)["train_samples_per_s"])
    rows = []
    for name in systems:
        ratios = per_round(speeds[name], speeds["ddp(2)"])
        rows.append([name, median(speeds[name]), median(ratios), spread(ratios)])
    shape = "1x28x28" if model == "mnist_net" else "3x32x32"
    print(f"{model} {shape} (synthetic), global batch {args.batch_size}, 2 gloo ranks, {repeats} interleaved repeats:")
    print(table(["system", "samples/s (median)", "ratio to ddp(2) (median of pairs)", "range of ratios"], rows))


if __name__ == "__main__":
    main()
