"""`data.loader=dataloader` (PIL transforms in worker processes) against `data.loader=device`
(the set as uint8 on the device, cropped/flipped/normalised per batch) on CIFAR-10-shaped data.

python -m bench.data_loaders [--quick] [override ...]      e.g. trainer.batch_size=256

Random images written in CIFAR-10's pickle format to a temporary root feed both loaders, built
by data.build_loaders as train.py builds them, one after the other in this process. Figures:
samples/s of one pass over the training loader alone, and with simple_cnn training on each batch;
each the best of the timed epochs after a warm-up epoch (workers start, allocator fills).
Target: device / dataloader ≥ 5 for the loader alone.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.common import table, verdict

TARGET = 5.0
LOADERS = ("dataloader", "device")


def write_cifar_shaped(root: Path, images: int) -> None:
    from data import cifar10

    rng = np.random.default_rng(0)
    per_batch = images // len(cifar10.TRAIN)
    for name in cifar10.TRAIN + cifar10.VAL:
        n = max(1, per_batch // 5) if name in cifar10.VAL else per_batch
        pixels = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        cifar10.write_batch(root / cifar10.FOLDER / name, pixels, rng.integers(0, 10, n))


def epoch_rate(loaders, epoch: int, device: torch.device, step=None) -> float:
    """Samples/s of one pass over the training loader, `step(x, y)` on each batch if given."""
    loaders.train_sampler.set_epoch(epoch)
    samples = 0
    start = time.perf_counter()
    for x, y in loaders.train:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # as the loop does
        if step is not None:
            step(x, y)
        samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start)


def measure(composed, ctx, epochs: int) -> dict[str, float]:
    from config.check import factory, typed
    from data import build_loaders

    cfg = typed(composed)
    loaders = build_loaders(cfg.dataset, cfg.data, ctx, cfg.trainer.batch_size, cfg.trainer.seed)
    model = factory(composed.model)().to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    rate = lambda epoch, step=None: epoch_rate(loaders, epoch, ctx.device, step)  # noqa: E731
    rate(0)  # warm-up
    loader = max(rate(e) for e in range(1, epochs + 1))
    rate(epochs + 1, step)  # warm-up
    training = max(rate(e, step) for e in range(epochs + 2, 2 * epochs + 2))
    return {"loader": loader, "training": training, "workers": getattr(loaders.train, "num_workers", 0)}


def main() -> None:
    from config.setup import compose
    from distributed.context import make_context

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("overrides", nargs="*", help="config overrides for both loaders")
    args = parser.parse_args()
    images, epochs = (500, 1) if args.quick else (20_000, 2)

    accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    ctx = make_context(0, 0, 1, 1, accelerator, use_process_group=False)
    with tempfile.TemporaryDirectory() as root:
        write_cifar_shaped(Path(root), images)
        base = ["dataset=cifar10", f"dataset.root={root}", "dataset.download=false", "model=simple_cnn"]
        results = {}
        for name in LOADERS:
            cfg = compose(*base, *args.overrides, f"data.loader={name}")
            results[name] = measure(cfg, ctx, epochs)

    dataloader, device = results["dataloader"], results["device"]
    print(
        f"CIFAR-10-shaped, {images:,} images, {ctx.device.type}, torch threads {torch.get_num_threads()}, "
        f"global batch {cfg.trainer.batch_size}, DataLoader workers {dataloader['workers']}"
    )
    rows = []
    for what in ("loader", "training"):
        ratio = device[what] / dataloader[what]
        rows.append([what, dataloader[what], device[what], ratio, verdict(ratio, TARGET) if what == "loader" else "-"])
    print(table(["samples/s", "data.loader=dataloader", "data.loader=device", "ratio", f"target ≥ {TARGET:g}"], rows))


if __name__ == "__main__":
    main()
