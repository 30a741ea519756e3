"""Per-sample loading (a DataLoader with PIL transforms in worker processes, what the seeds do)
against the batch-at-a-time loaders train.py uses for in-memory sets: `data.loader=dataloader` (the
set on the host, indexed, cropped, flipped and normalised a batch at a time) and `data.loader=device`
(the same on the training device), on CIFAR-10-shaped data.

python -m bench.data_loaders [--quick] [override ...]      e.g. trainer.batch_size=256

Random images written in CIFAR-10's pickle format to a temporary root feed both loaders, built
by data.build_loaders as train.py builds them, one after the other in this process. Figures:
samples/s of one pass over the training loader alone, and with simple_cnn training on each batch;
each the best of the timed epochs after a warm-up epoch (workers start, allocator fills).
Target: each batch-at-a-time loader ≥ 5x the per-sample one, for the loader alone.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from bench.common import table, verdict

TARGET = 5.0
LOADERS = {"per-sample": "dataloader", "data.loader=dataloader": "dataloader", "data.loader=device": "device"}


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
    from data import Loaders

    loaders.train_sampler.set_epoch(epoch)
    samples = 0
    start = time.perf_counter()
    for x, y in loaders.train:
        x, y = Loaders.to_device(loaders.train, x, y, device)  # as the loop does
        if step is not None:
            step(x, y)
        samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start)


def measure(composed, ctx, epochs: int) -> dict[str, float]:
    from config.typed import factory, typed
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
        for name, loader in LOADERS.items():
            cfg = compose(*base, *args.overrides, f"data.loader={loader}")
            # The baseline: the DataLoader path, which train.py keeps for sets that decode files.
            with mock.patch("data.batched", return_value=False) if name == "per-sample" else contextlib.nullcontext():
                results[name] = measure(cfg, ctx, epochs)

    per_sample = results["per-sample"]
    print(
        f"CIFAR-10-shaped, {images:,} images, {ctx.device.type}, torch threads {torch.get_num_threads()}, "
        f"global batch {cfg.trainer.batch_size}, DataLoader workers (per-sample) {per_sample['workers']}"
    )
    rows = []
    for what in ("loader", "training"):
        ratios = [results[name][what] / per_sample[what] for name in list(LOADERS)[1:]]
        verdicts = [verdict(r, TARGET) if what == "loader" else "-" for r in ratios]
        rows.append([what, *(results[name][what] for name in LOADERS), *ratios, " / ".join(verdicts)])
    print(
        table(
            ["samples/s", *LOADERS, "host batches / per-sample", "device batches / per-sample", f"target ≥ {TARGET:g}"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
