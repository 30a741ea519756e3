"""trainer.test_only: evaluate trained weights (trainer.resume's, trainer.init_from's or model.weights')
on the validation set, every rank its shard, the figures summed over ranks; nothing is trained or
saved but metrics.json."""

from __future__ import annotations

import logging
import time

from torch.optim.swa_utils import AveragedModel

from config.schema import RunConfig
from data import build_loaders, class_names
from distributed.context import DistContext
from training import manifest, validation
from training.batch_layout import BatchLayout
from training.batches import Batches
from training.callbacks import RunInfo, end_validation, handling
from training.checkpoint.resume import open_resume
from training.checkpoint.weights import start_from
from training.reporting import write_metrics
from training.validation import evaluate

log = logging.getLogger("train")


def test(ctx: DistContext, job: RunConfig) -> dict:
    """One line with acc@1, acc@5 and loss (and the EMA's, when the checkpoint holds one)."""
    start = time.perf_counter()
    manifest.start(ctx, job)
    settings = job.trainer
    layout = BatchLayout.of(settings, ctx.world_size, len(ctx.devices))  # trainer.max_batch_per_device
    loaders = build_loaders(
        job.dataset, job.data, ctx, layout.samples, settings.seed, global_val_batch=layout.val_samples
    )
    net = job.model().to(ctx.device)  # model.weights, if given, are loaded here
    source, ema = job.model.keywords.get("weights"), None
    checkpoint = open_resume(job.resume, job.run_dir, ctx)
    if checkpoint is None and job.resume is not None:  # strategy=fsdp's sharded last.pt: read whole, as predict.py does
        from training.checkpoint import sharded  # torch.distributed.checkpoint: slow to import

        checkpoint = sharded.read_whole(job.resume.path)
    if checkpoint is not None:
        net.load_state_dict(checkpoint["model"])
        source = str(job.resume.path)
        if checkpoint.get("ema") is not None:
            ema = AveragedModel(net, use_buffers=True)
            ema.load_state_dict(checkpoint["ema"])
    elif settings.init_from is not None:  # the run's best weights alone, as predict.py takes them
        path, chosen, _ = start_from(net, settings.init_from)
        source = f"{path}, its {chosen}'s"
    callbacks = [build() for build in job.callbacks.values()]  # what they add reaches metrics.json
    for callback in callbacks:
        callback.setup(RunInfo(ctx, (), class_names(job.dataset), job.run_dir))
    batches, criterion = Batches(ctx.device, layout.loop_settings(settings).limit_val_batches), job.loss()
    val = evaluate(net, loaders.val, batches, ctx, criterion, handling(callbacks, "on_validation_batch_end"))
    added = validation.figures(val, "val/")
    epoch, step = (checkpoint["epoch"], checkpoint["step"]) if checkpoint is not None else (0, 0)
    end_validation(callbacks, epoch, step, added, ctx)
    declared = [name for callback in callbacks for name in callback.figures]
    metrics = {
        **validation.figures(val, "val_"),
        "val_samples": val.samples,
        **{name.replace("/", "_"): added[name] for name in declared if name in added},
    }
    line = f"test: acc@1 {val.acc:.4f} acc@5 {val.acc5:.4f} loss {val.loss:.4f}"
    if ema is not None:
        averaged = evaluate(ema.module, loaders.val, batches, ctx, criterion)
        metrics.update(validation.figures(averaged, "val_ema_"), val_ema_samples=averaged.samples)
        line += f"  ema acc@1 {averaged.acc:.4f} acc@5 {averaged.acc5:.4f} loss {averaged.loss:.4f}"
    log.info("%s  (%d images, %s)", line, val.samples, source)
    if ctx.is_main:
        write_metrics(
            job.run_dir,
            {
                **metrics,
                "weights": source,
                **job.choices,
                "world_size": ctx.world_size,
                "batch_size": settings.batch_size,
                "wall_s": time.perf_counter() - start,
            },
        )
    return metrics
