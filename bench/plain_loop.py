"""The baseline: the 20-line loop the seeds write by hand, on the same model, data and optimizer.

python -m bench.plain_loop --model simple_cnn --channels 3 --image-size 32 ...  → one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from models.mnist_net import MnistNet
from models.simple_cnn import SimpleCNN

NETS = {"simple_cnn": SimpleCNN, "mnist_net": MnistNet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=NETS, required=True)
    parser.add_argument("--channels", type=int, required=True)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    args = parser.parse_args()

    torch.set_num_threads(os.cpu_count())  # what train.py gives a single process
    torch.manual_seed(0)
    x = torch.randn(args.train_size, args.channels, args.image_size, args.image_size)
    y = torch.randint(0, args.classes, (args.train_size,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = NETS[args.model](args.channels, args.classes, args.image_size)
    # conf/optimizer/sgd.yaml's settings
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)

    speeds = []
    for _ in range(args.epochs):
        model.train()
        start = time.perf_counter()
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
        speeds.append(len(x) / (time.perf_counter() - start))
    print(json.dumps({"samples_per_s": statistics.median(speeds[1:] or speeds)}))


if __name__ == "__main__":
    main()
