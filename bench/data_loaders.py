"""Samples/s of `data.loader=dataloader` (PIL transforms in workers) vs `data.loader=device`
(the set on the device, augmented per batch) on CIFAR-10-shaped data, loader alone and training
simple_cnn, measured in one run; prints the ratios.

    python -m bench.data_loaders [--images 10000] [--epochs 2] [override ...]   e.g. trainer.batch_size=256

Writes random images in CIFAR-10's pickle format to a temporary root (or reads dataset.root=...).
Each figure is the best of `--epochs` epochs after a warm-up epoch (workers start, allocator).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

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
        x = x.to(device, non_blocking=True)  # what the training loop does: a no-op for the device loader
        if step is not None:
            step(x, y.to(device, non_blocking=True))
        samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start)


def measure(cfg, ctx, epochs: int) -> dict[str, float]:
    import models
    from data import build_loaders

    loaders = build_loaders(cfg.dataset, cfg.data, ctx, cfg.trainer.batch_size, cfg.trainer.seed)
    model = models.build(cfg.model).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    rate = lambda epoch, step=None: epoch_rate(loaders, epoch, ctx.device, step)  # noqa: E731
    rate(0)  # warm-up: workers start, caches fill
    loader = max(rate(e) for e in range(1, epochs + 1))
    rate(epochs + 1, step)
    training = max(rate(e, step) for e in range(epochs + 2, 2 * epochs + 2))
    workers = getattr(loaders.train, "num_workers", 0)
    return {"loader": loader, "training": training, "workers": workers}


def main() -> None:
    from hydra import compose, initialize_config_dir

    import train  # noqa: F401  registers the config schema, as `python train.py` does
    from distributed.context import make_context

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000, help="training images to write")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per figure")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        base = ["dataset=cifar10", f"dataset.root={tmp}", "dataset.download=false", "model=simple_cnn"]
        with initialize_config_dir(config_dir=str(Path(train.__file__).parent / "conf"), version_base="1.3"):
            configs = {name: compose("config", overrides=[*base, *args.overrides, f"data.loader={name}"]) for name in LOADERS}
        if configs["device"].dataset.root == tmp:
            write_cifar_shaped(Path(tmp), args.images)
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
        ctx = make_context(0, 0, 1, 1, accelerator, use_process_group=False)
        results = {name: measure(cfg, ctx, args.epochs) for name, cfg in configs.items()}

    cfg = configs["dataloader"]
    print(
        f"CIFAR-10-shaped, {ctx.device.type}, torch threads {torch.get_num_threads()}, global batch "
        f"{cfg.trainer.batch_size}, simple_cnn, DataLoader workers {results['dataloader']['workers']}"
    )
    print(f"{'samples/s':<12}{'dataloader':>12}{'device':>12}{'ratio':>8}")
    for what in ("loader", "training"):
        dl, dev = results["dataloader"][what], results["device"][what]
        print(f"{what:<12}{dl:>12,.0f}{dev:>12,.0f}{dev / dl:>7.1f}x")


if __name__ == "__main__":
    main()
