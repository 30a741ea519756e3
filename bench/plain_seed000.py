"""Seed 000's training loop as written, on one GPU: the baseline of bench.gpu.

ResNet-50 (torchvision, ImageNet stem) on CIFAR-10 batches read as torchvision's CIFAR10 reads
them, per-sample PIL transforms (RandomCrop(32, 4), flip, ToTensor, Normalize) in 8 DataLoader
workers with pinned memory, batch 128, fp32, SGD 0.1 / 0.9 / 5e-4. Prints one JSON line.

python -m bench.plain_seed000 --root <dir holding cifar-10-batches-py/> --epochs 3
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class Cifar10(Dataset):
    """torchvision.datasets.CIFAR10's reading and __getitem__, without its md5 check of the release."""

    def __init__(self, root: Path, transform) -> None:
        data, labels = [], []
        for i in range(1, 6):
            with open(root / "cifar-10-batches-py" / f"data_batch_{i}", "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            data.append(batch["data"])
            labels += batch["labels"]
        self.data = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
        self.labels, self.transform = labels, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.transform(Image.fromarray(self.data[index])), self.labels[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    transform = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
        ]
    )
    trainset = Cifar10(args.root, transform)
    trainloader = DataLoader(trainset, batch_size=128, shuffle=True, num_workers=8, pin_memory=True)
    net = torchvision.models.resnet50().cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    speeds = []
    for _ in range(args.epochs):
        net.train()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for inputs, targets in trainloader:
            inputs, targets = inputs.cuda(), targets.cuda()
            optimizer.zero_grad()
            loss = criterion(net(inputs), targets)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        speeds.append(len(trainset) / (time.perf_counter() - start))
    print(json.dumps({"samples_per_s": statistics.median(speeds[1:] or speeds)}))


if __name__ == "__main__":
    main()
