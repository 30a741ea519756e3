"""The pre-flight, above every layer: before any process starts, the composed config is typed and
checked against this machine, each layer asked about its own part (distributed: the world; data:
the dataset's files; training.checkpoint: a resume), every problem one line; then the launch plan
and the typed RunConfig every worker receives."""

from __future__ import annotations

import importlib
import inspect
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

import data
from config.hparams import hparams
from config.schema import (
    COMPILE_MODES,
    PRECISIONS,
    Accelerator,
    Config,
    LrScaling,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainerConfig,
)
from distributed import strategies
from distributed.launch import LaunchPlan, plan_launch
from errors import ConfigError, first_line
from models.summary import summarize
from training.checkpoint import check_resume
from training.loggers.packages import check_installed
from training.optim import scaled_lr
from training.preemption import parse_signals
from training.profiling import WAIT, WARMUP

T = TypeVar("T")


def typed(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)


def check_and_plan(cfg: Config, run_dir: Path | None = None, multirun: bool = False) -> LaunchPlan:
    """Everything that can be wrong before training starts, as one-line ConfigErrors, then the launch
    plan: the world against this machine (the batch checks need its size), the config's own values,
    then the checks that build the model or read files. `multirun`: one job of a Hydra `-m` sweep
    (the launch plan then keeps CUDA out of this process)."""
    strategy = strategies.get(cfg.strategy)
    plan = plan_launch(cfg.trainer, strategy, cfg.launcher, multirun=multirun)  # the world against this machine
    _check_trainer(cfg.trainer, plan)
    preempt = parse_signals(cfg.trainer.preempt_signals, "trainer.preempt_signals")
    requeue = parse_signals(cfg.trainer.requeue_signals, "trainer.requeue_signals")
    _check_recipe(cfg)
    _check_loggers_and_profiler(cfg)
    # The checks that build the model (and may read a weights file) after the cheap ones.
    resolve_num_classes(cfg)  # before anything builds the model
    _check_model(cfg.model)
    strategy.check_model(factory(cfg.model))
    data.check(cfg.dataset, cfg.data)
    _check_built(cfg)
    _check_forward(cfg)  # after the data's own keys, which name the fix more closely
    check_resume(
        cfg.trainer,
        run_dir,
        model=factory(cfg.model),
        scheduler=cfg.scheduler,
        warmup_epochs=schedule_config(cfg.scheduler).warmup_epochs,
        weights=cfg.model.get("weights"),
    )
    return replace(plan, forward_signals=tuple(preempt), requeue_signals=tuple(requeue))


def _check_trainer(trainer: TrainerConfig, plan: LaunchPlan) -> None:
    """The trainer keys: the batch against the world, and what each key allows."""
    if trainer.epochs < 1:
        raise ConfigError(f"trainer.epochs={trainer.epochs}: train for at least 1 epoch")
    if trainer.batch_size < plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={trainer.batch_size} is the global batch, at least one sample for each of "
            f"{plan.world_size} process(es); use {plan.world_size} or more"
        )
    if trainer.batch_size % plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={trainer.batch_size} is the global batch and must split evenly over "
            f"{plan.world_size} processes; use a multiple of {plan.world_size}"
        )
    if trainer.val_batch_size is not None and trainer.val_batch_size < plan.world_size:
        raise ConfigError(
            f"trainer.val_batch_size={trainer.val_batch_size} is the global validation batch, at least one sample for "
            f"each of {plan.world_size} process(es); use {plan.world_size} or more, or null for trainer.batch_size"
        )
    if trainer.precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={trainer.precision}: choose 32, bf16-mixed or 16-mixed")
    if trainer.precision == "16-mixed" and plan.accelerator == Accelerator.cpu.value:
        raise ConfigError(
            "trainer.precision=16-mixed needs CUDA (fp16 autocast with a GradScaler); "
            "on CPU use trainer.precision=bf16-mixed or 32"
        )
    if trainer.compile_mode not in COMPILE_MODES:
        raise ConfigError(f"trainer.compile_mode={trainer.compile_mode}: choose {', '.join(COMPILE_MODES)}")
    if trainer.compile_mode != "default" and not trainer.compile:
        raise ConfigError(
            f"trainer.compile_mode={trainer.compile_mode} compiles nothing alone; add trainer.compile=true"
        )
    if trainer.accumulate_grad_batches < 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches}: use 1 (no accumulation) or more"
        )
    if trainer.grad_clip is not None and trainer.grad_clip <= 0:
        raise ConfigError(f"trainer.grad_clip={trainer.grad_clip}: give a positive max norm, or null for none")
    for key in ("limit_train_batches", "limit_val_batches", "checkpoint_every_n_steps", "overfit_batches"):
        value = getattr(trainer, key)
        if value is not None and value < 1:
            raise ConfigError(f"trainer.{key}={value}: use a positive number, or null")


def _check_recipe(cfg: Config) -> None:
    """The recipe keys: the ranges torchvision's reference scripts assume."""
    trainer, optim, schedule = cfg.trainer, optim_config(cfg.optimizer), schedule_config(cfg.scheduler)
    smoothing, erase, decay = trainer.label_smoothing, cfg.dataset.random_erase, optim.norm_weight_decay
    ranges = [  # key, value, whether it is allowed, what is
        ("trainer.label_smoothing", smoothing, 0 <= smoothing < 1, "0 (off) up to below 1"),
        ("dataset.random_erase", erase, 0 <= erase <= 1, "a probability, 0 (off) to 1"),
        ("trainer.mixup_alpha", trainer.mixup_alpha, trainer.mixup_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
        ("trainer.cutmix_alpha", trainer.cutmix_alpha, trainer.cutmix_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
        (
            "trainer.ema_decay",
            trainer.ema_decay,
            trainer.ema_decay is None or 0 < trainer.ema_decay < 1,
            "a decay in (0, 1), e.g. 0.99998, or null",
        ),
        ("trainer.ema_every_n_steps", trainer.ema_every_n_steps, trainer.ema_every_n_steps >= 1, "1 or more"),
        ("scheduler.warmup_epochs", schedule.warmup_epochs, schedule.warmup_epochs >= 0, "0 (off) or more"),
        (
            "scheduler.warmup_start_factor",
            schedule.warmup_start_factor,
            0 < schedule.warmup_start_factor <= 1,
            "a fraction of the lr in (0, 1]",
        ),
        ("optimizer.reference_batch", optim.reference_batch, optim.reference_batch >= 1, "the batch lr was tuned for"),
        ("optimizer.norm_weight_decay", decay, decay is None or decay >= 0, "null (as weight_decay) or 0 and up"),
        (
            "data.repeated_augmentations",
            cfg.data.repeated_augmentations,
            cfg.data.repeated_augmentations >= 1,
            "1 (off) or more",
        ),
    ]
    for key, value, allowed, what in ranges:
        if not allowed:
            raise ConfigError(f"{key}={value}: use {what}")
    if optim.lr_scaling == LrScaling.linear and "lr" not in cfg.optimizer:
        raise ConfigError("optimizer.lr_scaling=linear scales optimizer.lr, which is not set; give optimizer.lr")


def _check_loggers_and_profiler(cfg: Config) -> None:
    """The chosen loggers' packages, and trainer.profile against the optimizer steps the run takes."""
    check_installed(cfg.logger)
    profile = cfg.trainer.profile
    if profile is None:
        return
    if profile < 1:
        raise ConfigError(f"trainer.profile={profile}: profile 1 or more optimizer steps, or null for none")
    warmup, (steps, why) = WAIT + WARMUP, _steps_at_most(cfg.trainer)
    if steps is not None and profile + warmup > steps:
        fix = (
            f"use trainer.profile={steps - warmup} or fewer"
            if steps > warmup
            else f"train {profile + warmup} or more steps"
        )
        raise ConfigError(
            f"trainer.profile={profile} needs {profile + warmup} optimizer steps ({warmup} to warm the profiler "
            f"up, then {profile} recorded), and this run takes {steps} ({why}); {fix}"
        )


def _steps_at_most(trainer: TrainerConfig) -> tuple[int | None, str]:
    """The optimizer steps a run takes at most, as far as its keys tell before launch (a full epoch's
    length is the dataset's, known once it is loaded), and the keys that tell it."""
    bounds = []
    if trainer.max_steps is not None:
        bounds.append((trainer.max_steps, f"trainer.max_steps={trainer.max_steps}"))
    key = "overfit_batches" if trainer.overfit_batches else "limit_train_batches"
    batches, accumulate = getattr(trainer, key), trainer.accumulate_grad_batches
    if batches:
        per_batch = f" / trainer.accumulate_grad_batches={accumulate}" if accumulate > 1 else ""
        bounds.append(
            (
                trainer.epochs * -(-batches // accumulate),
                f"trainer.epochs={trainer.epochs} x trainer.{key}={batches}{per_batch}",
            )
        )
    return min(bounds) if bounds else (None, "")


def check_logger_options(overrides: Sequence[str]) -> None:
    """logger.wandb.* or logger.mlflow.* set for a backend the run does not choose: one line naming
    the choice to add, where Hydra would stop with an assertion on the unset node (so this runs before
    Hydra composes). A backend chosen on the command line costs nothing; otherwise the config is
    composed without those keys, to see whether a preset (an experiment) chose it."""
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o])  # not -m, --cfg
    except Exception:  # bad syntax: Hydra's own message names it
        return
    chosen: set[str] = set()  # the backends every job's logger= names
    for override in parsed:
        if override.key_or_group == "logger" and not override.is_delete():
            jobs = override.value().list if override.is_sweep_override() else [override.value()]
            chosen = set.intersection(*({*job} if isinstance(job, list) else {job} for job in jobs))
    setting: dict[str, str] = {}  # a backend not chosen here -> the first override that sets its keys
    for override in parsed:
        path = override.key_or_group.split(".")
        if len(path) > 2 and path[0] == "logger" and path[1] in ("wandb", "mlflow") and path[1] not in chosen:
            setting.setdefault(path[1], override.input_line)
    if not setting:
        return
    from config.setup import compose

    theirs = tuple(f"logger.{backend}." for backend in setting)
    try:
        cfg = compose(
            *[o.input_line for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith(theirs)]
        )
    except Exception:  # Hydra's to report
        return
    for backend, line in setting.items():
        if cfg.logger[backend] is None:
            raise ConfigError(
                f"{line} sets an option of logger={backend}, which this run does not choose; add it: "
                f"logger={backend}, or a list such as 'logger=[tensorboard,{backend}]'"
            )


def resolve_num_classes(cfg: Config) -> None:
    """dataset.num_classes=null: the dataset counts its classes (ImageFolder's rule); the model's
    num_classes, interpolated from it, reached the typed config as null too."""
    if cfg.dataset.num_classes is None:
        cfg.dataset.num_classes = data.num_classes(cfg.dataset)
    if isinstance(cfg.model, dict) and "num_classes" in cfg.model and cfg.model["num_classes"] is None:
        cfg.model["num_classes"] = cfg.dataset.num_classes


def _check_model(node: Mapping[str, Any]) -> None:
    """A weights file that exists; then the builder's own check, if its module has one."""
    weights = node.get("weights")
    if weights is not None and not Path(weights).is_file():
        raise ConfigError(f"model.weights={weights}: no such file; give a state_dict file saved with torch.save")
    arguments = {k: v for k, v in node.items() if not k.startswith("_")}
    try:
        inspect.signature(get_object(node["_target_"])).bind_partial(**arguments)
    except TypeError as e:  # a typo'd model.* key, or one added with + that the builder does not take
        raise ConfigError(f"model: {node['_target_']} refuses these options ({e}); fix the model.* keys") from None
    module = importlib.import_module(node["_target_"].rsplit(".", 1)[0])
    if hasattr(module, "check"):
        module.check(**arguments)


def _check_built(cfg: Config) -> None:
    """The loss and each callback, built once: a key their class does not take, or a value it
    refuses, is one line before launch instead of a traceback on every rank."""
    for key, node in [("loss", cfg.loss), *((f"callbacks.{name}", node) for name, node in cfg.callbacks.items())]:
        if not isinstance(node, Mapping) or "_target_" not in node:
            group = key.split(".")[0]
            raise ConfigError(f"{key}: no _target_; name the class to build, as the files in conf/{group}/ do")
        try:
            factory(node)()
        except Exception as e:
            raise ConfigError(
                f"{key}: {node['_target_']} refuses these options ({first_line(e)}); fix the {key}.* keys"
            ) from None


def _check_forward(cfg: Config) -> None:
    """One forward pass on the meta device (shapes only: no memory, no arithmetic) at the sizes
    training and validation feed: a model built for other images (a Linear sized for image_size
    after the convolutions, ViT's 224 px) fails here in one line instead of in the first step."""
    dataset = cfg.dataset
    node = {**cfg.model, "weights": None} if "weights" in cfg.model else cfg.model  # shapes only
    try:
        with torch.device("meta"):
            model = factory(node)()
    except Exception as e:
        if _needs_values(e):  # RegNet's builder reads a tensor's value: the first step will tell
            return
        raise
    sizes = {"train": dataset.train_crop or dataset.image_size, "val": dataset.val_crop or dataset.image_size}
    for split, size in sizes.items():
        model.train(split == "train")
        shape = (2, dataset.channels, size, size)  # 2: BatchNorm trains on more than one value
        where = f"the model cannot take dataset={dataset.name}'s {split} images ({shape[1]}x{size}x{size})"
        fix = "set dataset.image_size (or train_crop / val_crop) to the size the model takes"
        try:
            with torch.no_grad():
                out = model(torch.empty(shape, device="meta"))
        except Exception as e:
            if _needs_values(e):
                return
            raise ConfigError(f"{where}: {first_line(e)}; {fix}") from None
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, dataset.num_classes):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ConfigError(
                f"the model returns {got} for a batch of 2, not logits (2, {dataset.num_classes}); "
                "build it to return one row of class scores per image"
            )


def _needs_values(error: Exception) -> bool:
    """The meta device's own limit (.item(), a copy to the host, a data-dependent op), not the model's."""
    return isinstance(error, NotImplementedError) or "meta" in str(error)


def model_figures(cfg: DictConfig) -> dict[str, Any]:
    """The model summary a job logs as it starts (models.summary: its parameters, size and FLOPs per
    sample), counted on the meta device before it runs, for what a sweep's jobs differ in besides
    their config; {} where the config alone cannot build the model (a class count its data tells)."""
    dataset = cfg.dataset
    try:
        with torch.device("meta"):
            model = factory({**cfg.model, "weights": None} if "weights" in cfg.model else cfg.model)()
    except Exception:
        return {}
    return summarize(model, (dataset.channels, dataset.image_size, dataset.image_size)).metrics()


def factory(node: Any) -> Callable[..., Any]:
    """A `_target_` node as a picklable factory: each rank builds its own (Hydra's _partial_)."""
    return instantiate(node, _partial_=True, _convert_="all")


def typed_part(node: Mapping[str, Any], cls: type[T], prefix: str) -> T:
    """`cls`'s keys of a `_target_` node, validated as the schema would (Enum names, numbers)."""
    part = OmegaConf.structured(cls)
    for f in fields(cls):
        value = node[f.name]
        try:
            part[f.name] = value
        except ValidationError as e:
            shown = value.name if hasattr(value, "name") else value
            raise ConfigError(f"{prefix}.{f.name}={shown}: {first_line(e)}") from None
    return OmegaConf.to_object(part)


def optim_config(node: Mapping[str, Any]) -> OptimConfig:
    return typed_part(node, OptimConfig, "optimizer")


def schedule_config(node: Mapping[str, Any]) -> ScheduleConfig:
    return typed_part(node, ScheduleConfig, "scheduler")


def target_arguments(node: Any, cls: type) -> dict[str, Any]:
    """The node without `cls`'s keys: what the `_target_` itself takes."""
    ours = {f.name for f in fields(cls)}
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    return {k: v for k, v in plain.items() if k not in ours}


def run_config(
    cfg: DictConfig,
    settings: Config,
    run_dir: Path,
    choices: dict[str, str],
    swept: dict[str, Any],
    preempt_signals: tuple[signal.Signals, ...],
    requeue_signals: tuple[signal.Signals, ...] = (),
    sweep_dir: Path | None = None,
    varied: dict[str, tuple[Any, ...]] | None = None,
) -> RunConfig:
    """The typed config every worker receives. `settings`: `cfg` typed; `choices`: the group
    options Hydra picked; `swept`: the job's overrides (`swept_overrides`); `preempt_signals`,
    `requeue_signals`: trainer.preempt_signals and requeue_signals as check_and_plan parsed them
    (its plan's forward_signals and requeue_signals); `sweep_dir`: the -m sweep's or search's dir
    that this job is one of (the loggers group its jobs by it); `varied`: the keys its sweep varies
    (`config.hparams.varied_hparams`), none for a single run."""
    labels = {group: choices[group] for group in ("model", "dataset", "strategy")}
    resolve_num_classes(settings)
    cfg.dataset.num_classes = settings.dataset.num_classes  # the model node interpolates it
    optim = optim_config(cfg.optimizer)
    optimizer = target_arguments(cfg.optimizer, OptimConfig)
    if "lr" in optimizer:
        optimizer["lr"] = scaled_lr(optimizer["lr"], optim, settings.trainer)
    scheduler = target_arguments(cfg.scheduler, ScheduleConfig)
    return RunConfig(
        trainer=settings.trainer,
        strategy=settings.strategy,
        launcher=settings.launcher,
        data=settings.data,
        dataset=settings.dataset,
        logger=settings.logger,
        model=factory(cfg.model),
        optimizer=factory(optimizer),
        scheduler=factory(scheduler) if scheduler.get("_target_") else None,
        loss=factory(cfg.loss),
        callbacks=[factory(node) for node in cfg.callbacks.values()],
        optim=optim,
        schedule=schedule_config(cfg.scheduler),
        run_dir=run_dir,
        labels=labels,
        hparams=hparams(cfg, choices),
        swept=swept,
        varied=varied or {},
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),  # the values this run used
        preempt_signals=preempt_signals,
        requeue_signals=requeue_signals,
        sweep_dir=sweep_dir,
    )
