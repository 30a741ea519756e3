"""The baseline: the 20-line loop the seeds write by hand, on the same model, data and optimizer.

python -m bench.plain_loop --model simple_cnn --channels 3 --image-size 32 ...  → one JSON line.

--sliced drops the DataLoader: each batch is a slice of the in-memory tensors by a random
permutation, the cheapest way to feed a model (bench.peers' floor). --max-steps stops after that
many optimizer steps; --val-size adds one validation batch per epoch, as the peers job does.
Threads: torch's default, which train.py also leaves a single process (OMP_NUM_THREADS sets both).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from models.mnist_net import MnistNet
from models.simple_cnn import SimpleCNN

NETS = {"simple_cnn": SimpleCNN, "mnist_net": MnistNet}
SGD = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}  # conf/optimizer/sgd.yaml


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """What both baselines (this loop, bench/peers_lightning.py) train: a NETS model on random images."""
    parser.add_argument("--model", choices=NETS, required=True)
    parser.add_argument("--channels", type=int, required=True)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--classes", type=int, default=10)


def sliced(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for idx in torch.randperm(len(x)).split(batch_size):
        yield x[idx], y[idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser)
    parser.add_argument("--train-size", type=int, required=True)
    parser.add_argument("--val-size", type=int, default=0)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, help="default: until --max-steps")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--sliced", action="store_true")
    args = parser.parse_args()
    if args.epochs is None and args.max_steps is None:
        parser.error("give --epochs, --max-steps or both")

    torch.manual_seed(0)
    shape = (args.channels, args.image_size, args.image_size)
    x, y = torch.randn(args.train_size, *shape), torch.randint(0, args.classes, (args.train_size,))
    x_val, y_val = torch.randn(args.val_size, *shape), torch.randint(0, args.classes, (args.val_size,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = NETS[args.model](args.channels, args.classes, args.image_size)
    optimizer = torch.optim.SGD(model.parameters(), **SGD)

    speeds, steps, val_acc = [], 0, None
    for _ in range(args.epochs) if args.epochs is not None else itertools.count():
        model.train()
        start = time.perf_counter()
        for xb, yb in sliced(x, y, args.batch_size) if args.sliced else loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == args.max_steps:
                break
        else:
            speeds.append(len(x) / (time.perf_counter() - start))
        if args.val_size:
            model.eval()
            with torch.no_grad():
                val_acc = (model(x_val[: args.batch_size]).argmax(1) == y_val[: args.batch_size]).float().mean().item()
        if steps == args.max_steps:
            break
    speed = statistics.median(speeds[1:] or speeds) if speeds else None  # None: no whole epoch ran
    print(json.dumps({"samples_per_s": speed, "steps": steps, "val_acc": val_acc}))


if __name__ == "__main__":
    main()
