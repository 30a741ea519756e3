"""One rank's whole life: join the group, build data, model and Trainer, train, leave (also on error)."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import replace

import torch
from torch import nn

from config.schema import DatasetConfig, RunConfig, TrainerConfig
from data import build_loaders, class_names
from distributed import context, strategies
from distributed.collectives import all_gather_object
from distributed.context import DistContext
from errors import Preempted
from models.summary import summarize
from training.batch_layout import BatchLayout, carry_over
from training.callbacks import RunInfo
from training.checkpoint.best import BestCheckpoints
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.weights import start_from
from training.ema import EMA
from training.evaluation import test
from training.loggers import build_loggers, takes_images
from training.manifest import start as start_manifest
from training.memory import MemoryProbe
from training.metrics import reset_peak_memory
from training.mixing import Mixing
from training.optimizer import check_arguments, parameter_groups
from training.precision import Precision
from training.preemption import PreemptionWatch
from training.profiling import ProfiledSteps
from training.reporting import configure_logging, log_run_dir, write_hparams, write_metrics
from training.samples import SampleImages
from training.scheduler import with_warmup
from training.trainer import Optimization, Reporting, Trainer

log = logging.getLogger("train")


def run(ctx: DistContext, job: RunConfig) -> None:
    """The worker every launcher starts once per device."""
    configure_logging(ctx, job.run_dir)
    log_run_dir(ctx, job.run_dir)
    context.init(ctx, job.launcher.timeout_s)
    configure_kernels(job.trainer, ctx)
    finished = False
    try:
        (test if job.trainer.test_only else train)(ctx, job)
        finished = True
    except Preempted:
        finished = True  # every rank stopped at the same step: leave together, after rank 0 saved
        raise
    finally:
        context.shutdown(ctx, clean=finished)
        log_run_dir(ctx, job.run_dir, ended=True)


def configure_kernels(settings: TrainerConfig, ctx: DistContext) -> None:
    """trainer.cudnn_benchmark and trainer.deterministic, before the first kernel runs."""
    if settings.deterministic:
        # cuBLAS needs a fixed workspace to repeat itself, read when its handle is made (GPU-only;
        # torch's Reproducibility notes).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # GPU kernels that use atomics, or pick their algorithm by timing, differ from run to run. Set
    # either way: the jobs of a sweep can share a process.
    torch.use_deterministic_algorithms(settings.deterministic)
    torch.backends.cudnn.deterministic = settings.deterministic
    if ctx.device.type == "cuda":
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark and not settings.deterministic


def log_placement(ctx: DistContext, workers: int) -> None:
    """Where each rank runs, as seed 002 has every rank print it: one line from rank 0, by host."""
    if ctx.world_size == 1:
        return
    hosts: dict[str, list[str]] = {}
    here = (socket.gethostname(), f"{ctx.device} ({context.placement(workers)})")
    for rank, (host, device) in enumerate(all_gather_object(here, ctx)):
        hosts.setdefault(host, []).append(f"{rank} {device}")
    log.info("ranks by host: %s", "; ".join(f"{host}: {', '.join(ranks)}" for host, ranks in hosts.items()))


def _checkpointer(strategy: strategies.Strategy) -> type[Checkpointer]:
    if not strategy.sharded_checkpoint:
        return Checkpointer
    # torch.distributed.checkpoint, which it imports, is slow to import: only a sharded run pays for it.
    from training.checkpoint.sharded_checkpointer import ShardedCheckpointer

    return ShardedCheckpointer


def summarized(net: nn.Module, dataset: DatasetConfig) -> dict[str, int | float | None]:
    """The model's size and its FLOPs per sample at the size it is built for, logged; for
    metrics.json and the loggers' hparams (cost: BENCHMARKS.md, "Model summary")."""
    summary = summarize(net, (dataset.channels, dataset.image_size, dataset.image_size))
    log.info("model: %s", summary)
    return summary.metrics()


def train(ctx: DistContext, job: RunConfig) -> nn.Module:
    """Build everything `job` names, train, report; return the trained (unwrapped) model."""
    # From here on a preemption signal is noted, not fatal: the loop stops at an agreed step. Whatever
    # ends the run, the handlers before it come back (a -m sweep's next job, the launcher's own).
    with PreemptionWatch(
        ctx, list(job.preempt_signals), job.trainer.preempt_grace_s, list(job.requeue_signals)
    ) as preemption:
        model = _build_and_fit(ctx, job, preemption)
    if preemption.received:  # after the last step that checked: the run is saved whole, the request still stands
        raise preemption.preempted()  # (a sweep stops, SLURM requeues the job, which finds nothing left to train)
    return model


def _started(net: nn.Module, job: RunConfig) -> nn.Module:
    """The model as built, or with trainer.init_from's weights: on every rank, before a wrapper shares
    or shards it; the resume's weights replace both."""
    source = job.trainer.init_from
    if source is not None and job.resume is not None:
        log.info("trainer.init_from=%s not read: the run continues from %s", source, job.resume.path)
    elif source is not None:
        path, chosen, fresh = start_from(net, source)
        log.info("weights from %s (its %s's)", path, chosen)
        if fresh:
            log.warning(
                "trainer.init_from: %s kept fresh (shaped for another number of classes or channels)", ", ".join(fresh)
            )
    return net


def _build_and_fit(ctx: DistContext, job: RunConfig, preemption: PreemptionWatch) -> nn.Module:
    start = time.perf_counter()
    settings = job.trainer
    reset_peak_memory(ctx)
    torch.manual_seed(settings.seed)  # the same initial weights on every rank
    layout = BatchLayout.of(settings, ctx.world_size, len(ctx.devices))  # trainer.max_batch_per_device
    underfilled = layout.underfilled(settings, len(ctx.devices))
    if underfilled is not None and ctx.rank == 0:  # the same on every rank
        log.warning("%s", underfilled)
    in_micro_batches = layout.loop_settings(settings)  # the loop's counts: this world's micro-batches
    loaders = build_loaders(
        job.dataset,
        job.data,
        ctx,
        layout.samples,
        settings.seed,
        shuffle=settings.overfit_batches is None,
        drop_last=settings.compile,  # a partial last batch would make torch.compile compile again
        global_val_batch=layout.val_samples,
    )
    if settings.overfit_batches:  # validate on the very batches it trains on: they must be learnt
        loaders = replace(loaders, val=loaders.train)
    net = _started(job.model(), job).to(ctx.device)
    model_figures = summarized(net, job.dataset) if ctx.is_main else {}  # as built: before a wrapper shards it
    if ctx.is_main:
        write_hparams(job.run_dir, {**job.hparams, **model_figures})
    if settings.channels_last:
        net = net.to(memory_format=torch.channels_last)
    strategy = strategies.get(job.strategy)
    precision = Precision.of(settings.precision, ctx.device)
    model = strategy.wrap(net, ctx, settings.compile_mode if settings.compile else None, precision.dtype)
    check_arguments(job.optimizer, job.scheduler)
    optimizer = job.optimizer(parameter_groups(model, job.optimizer_options.norm_weight_decay))
    scheduler = job.scheduler(optimizer) if job.scheduler is not None else None
    scheduler = with_warmup(optimizer, scheduler, job.scheduler_options, in_micro_batches, len(loaders.train))
    ema = None
    if settings.ema_decay is not None:  # of the trained module: sync_batchnorm may have replaced `net`'s layers
        decay = settings.ema_decay_per_update
        ema = EMA(strategies.unwrap(model), decay, job.scheduler_options.warmup_epochs)
        log.info("EMA every %d step(s), decay %.6g per update", settings.ema_every_n_steps, decay)
    scaler = precision.grad_scaler()
    loggers = build_loggers(job.logger, job) if ctx.is_main else []
    chosen = {name: build() for name, build in job.callbacks.items()}  # conf/callbacks/: their state is saved
    callbacks = list(chosen.values())
    if job.logger.sample_images and takes_images(job.logger):
        callbacks.insert(0, SampleImages(job.logger.sample_images, model, loaders.val, ctx.device))
    profiler = None
    if settings.profile and ctx.is_main:  # rank 0's steps: a trace in the run dir, a table in the log
        profiler = ProfiledSteps(settings.profile, ctx.device, job.run_dir / "profile" / "trace.json")
        callbacks.append(profiler)
    info = RunInfo(ctx, loggers, class_names(job.dataset), job.run_dir)
    for callback in callbacks:
        callback.setup(info)
    best = BestCheckpoints.chosen(settings.checkpoint)
    # Once every part is built (a rank's own check has passed): rank 0's manifest.json, and every checkpoint's.
    manifest = start_manifest(ctx, job)
    checkpointer = _checkpointer(strategy)(
        ctx,
        job.run_dir / "checkpoints",
        model,
        optimizer,
        scheduler,
        job.config_yaml,
        scaler,
        ema,
        best,
        chosen,
        manifest,
    )
    resume = job.resume
    state = checkpointer.restore(resume)
    trained_before_s = state.train_s  # by the processes this one resumes: wall_s is the whole run's
    state.batch, state.layout = carry_over(state.batch, state.layout, layout), layout
    memory = MemoryProbe(model, optimizer)  # after restore: loading a sharded checkpoint steps the optimizer once
    log_placement(ctx, getattr(loaders.train, "num_workers", 0))
    log.info(
        "%s on %s: %s, world size %d (%s), global batch %d%s, from epoch %d%s",
        job.choices["model"],
        job.choices["dataset"],
        job.choices["strategy"],
        ctx.world_size,
        ctx.device.type,
        settings.batch_size,
        f" ({layout.describe()}: trainer.max_batch_per_device)" if layout.split > 1 else "",
        state.epoch + 1,
        f" batch {state.batch + 1} ({resume.path})" if resume else "",
    )
    trainer = Trainer(
        model=model,
        strategy=strategy,
        ema=ema,
        mixing=Mixing.of(settings, job.dataset.num_classes, ctx.rank),
        optimization=Optimization(job.loss(), optimizer, scheduler, scaler),
        loaders=loaders,
        checkpointer=checkpointer,
        state=state,
        preemption=preemption,
        reporting=Reporting(loggers, callbacks),
        ctx=ctx,
        settings=in_micro_batches,
    )
    try:
        metrics = trainer.fit()
        if metrics:
            final = {
                **metrics,
                **job.choices,
                "world_size": ctx.world_size,
                "devices": len(ctx.devices) * ctx.world_size,
                "batch_size": settings.batch_size,
                "wall_s": trained_before_s + time.perf_counter() - start,
                **memory.per_rank(ctx, metrics["peak_memory_mb"]),
                **model_figures,
            }
            if ctx.is_main:
                write_metrics(job.run_dir, final)
            for logger in loggers:
                logger.log_hparams({**job.hparams, **model_figures}, final)
    finally:
        if profiler is not None:
            profiler.close()
        checkpointer.close()  # the last save is on disk before the process may exit
        for logger in loggers:
            logger.close()
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # for the next job of a torchrun/SLURM rank that runs a -m sweep
    return strategies.unwrap(model)
