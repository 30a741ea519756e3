"""trainer.test_only: evaluate a checkpoint's (or model.weights') weights on the validation set,
every rank its shard, the figures summed over ranks; nothing is trained or saved but metrics.json."""

from __future__ import annotations

import logging
import time

from torch.optim.swa_utils import AveragedModel

from config.schema import RunConfig
from data import build_loaders
from distributed.context import DistContext
from training import manifest
from training.checkpoint import find_resume, load_checkpoint
from training.metrics import Averages
from training.reporting import write_metrics
from training.trainer import Batches, evaluate

log = logging.getLogger("train")


def test(ctx: DistContext, job: RunConfig) -> dict:
    """One line with acc@1, acc@5 and loss (and the EMA's, when the checkpoint holds one)."""
    start = time.perf_counter()
    settings = job.trainer
    manifest.start(ctx, job)
    loaders = build_loaders(
        job.dataset, job.data, ctx, settings.batch_size, settings.seed, global_val_batch=settings.val_batch_size
    )
    net = job.model().to(ctx.device)  # model.weights, if given, are loaded here
    resume = find_resume(settings.resume, job.run_dir)
    source, ema = job.model.keywords.get("weights"), None
    if resume is not None:
        checkpoint = load_checkpoint(resume)
        net.load_state_dict(checkpoint["model"])
        source = str(resume)
        if checkpoint.get("ema") is not None:
            ema = AveragedModel(net, use_buffers=True)
            ema.load_state_dict(checkpoint["ema"])
    batches, criterion = Batches(ctx.device, settings.limit_val_batches), job.loss()
    val = evaluate(net, loaders.val, batches, ctx, criterion)
    metrics = _figures("val", val)
    line = f"test: acc@1 {val.acc:.4f} acc@5 {val.acc5:.4f} loss {val.loss:.4f}"
    if ema is not None:
        averaged = evaluate(ema.module, loaders.val, batches, ctx, criterion)
        metrics.update(_figures("val_ema", averaged))
        line += f"  ema acc@1 {averaged.acc:.4f} acc@5 {averaged.acc5:.4f} loss {averaged.loss:.4f}"
    log.info("%s  (%d images, %s)", line, val.samples, source)
    if ctx.is_main:
        write_metrics(
            job.run_dir,
            {
                **metrics,
                "weights": source,
                **job.labels,
                "world_size": ctx.world_size,
                "batch_size": settings.batch_size,
                "wall_s": time.perf_counter() - start,
            },
        )
    return metrics


def _figures(prefix: str, averages: Averages) -> dict[str, float | int]:
    return {
        f"{prefix}_acc": averages.acc,
        f"{prefix}_acc5": averages.acc5,
        f"{prefix}_loss": averages.loss,
        f"{prefix}_ce": averages.ce,
        f"{prefix}_samples": averages.samples,
    }
