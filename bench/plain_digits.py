"""The baseline for the default job: the same work as `python train.py`, written as a plain script.

scikit-learn's digits with the same split (data.digits) and normalisation, seed 002's Net, SGD + cosine over
`--epochs` (15, as config/schema.py) at batch 64, evaluated each epoch. Prints one JSON line: final validation accuracy.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from data.digits import images_and_labels, stratified_split
from models.mnist_net import MnistNet


def tensors(images, labels) -> TensorDataset:
    x = (torch.as_tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0 - 0.3053) / 0.3760
    return TensorDataset(x, torch.as_tensor(labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0, help="as trainer.seed")
    args = parser.parse_args()
    epochs = args.epochs
    torch.manual_seed(args.seed)
    images, labels = images_and_labels()
    train_idx, val_idx = stratified_split(labels, 0.2)
    train = DataLoader(tensors(images[train_idx], labels[train_idx]), batch_size=64, shuffle=True)
    val = DataLoader(tensors(images[val_idx], labels[val_idx]), batch_size=64)
    model = MnistNet(1, 10, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    for _ in range(epochs):
        model.train()
        for x, y in train:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val)
    print(json.dumps({"val_acc": correct / len(val.dataset)}))


if __name__ == "__main__":
    main()
