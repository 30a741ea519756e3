"""The pre-flight, above every layer: before any process starts, the typed config (config.typed,
whose values are checked already) is held against this machine and the data, each layer asked about
its own part (distributed: the world; data: the dataset's files; models: the model's own check;
training.checkpoint: the resume, decided here once), every problem one line; then the launch plan
and what the workers need from it."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

import data
from config.schema import Accelerator, Config, ResumePoint, TrainerConfig, parse_signals
from config.setup import CONF_DIR
from config.typed import factory, imported, model_factory, scheduler_options
from distributed import strategies
from distributed.context import import_optimizer_step
from distributed.launch import LaunchPlan, plan_launch
from errors import ConfigError, first_line
from models.summary import summarize
from training.checkpoint.resume import decide_resume
from training.checkpoint.weights import start_from
from training.loggers.packages import check_installed
from training.monitor import Monitor, better_way
from training.profiling import WAIT, WARMUP
from training.validation import FIGURES, produced


@dataclass(frozen=True)
class Plan:
    """What the pre-flight decided: how to launch, the dataset's classes (dataset.num_classes=null:
    counted), and the checkpoint the run continues (None: afresh)."""

    launch: LaunchPlan
    num_classes: int
    resume: ResumePoint | None = None


def check_and_plan(config: Config, run_dir: Path | None = None, multirun: bool = False) -> Plan:
    """Everything about this machine and the data that can be wrong before training starts, as
    one-line ConfigErrors, then the plan: the world against this machine (the batch checks need its
    size), the loggers' packages and the profiler's budget, then the checks that build the model or
    read files. `multirun`: one job of a Hydra `-m` sweep (the launch plan then keeps CUDA out of
    this process)."""
    strategy = strategies.get(config.strategy)
    launch = plan_launch(config.trainer, strategy, config.launcher, multirun=multirun)  # the world against this machine
    _check_world(config.trainer, launch)
    check_installed(config.logger)
    _check_profiler(config.trainer)
    # The checks that build the model (and may read a weights file) after the cheap ones.
    num_classes = config.dataset.num_classes or data.num_classes(config.dataset)
    model = model_factory(config, num_classes)
    if config.trainer.init_from is not None and config.model.get("weights") is not None:
        raise ConfigError(
            f"model.weights={config.model.get('weights')} and trainer.init_from={config.trainer.init_from} both "
            "name the weights to start from; keep one"
        )
    _check_model(config.model)
    strategy.check_model(model)
    data.check(replace(config.dataset, num_classes=num_classes), config.data)
    _check_monitors(config, _check_built(config))
    import_optimizer_step()  # else the meta forward imports it (torch._refs), the collector running
    _check_forward(config, num_classes)  # after the data's own keys, which name the fix more closely
    resume = decide_resume(
        config.trainer,
        run_dir,
        model=model,
        scheduler=config.scheduler,
        warmup_epochs=scheduler_options(config.scheduler).warmup_epochs,
        weights=config.model.get("weights"),
        restores_here=launch.in_process,
        sweep_job=multirun,
    )
    if config.trainer.init_from is not None and resume is None:  # a resume's own weights win
        start_from(model(), config.trainer.init_from)  # a run whose weights fit this model
    preempt = parse_signals(config.trainer.preempt_signals, "trainer.preempt_signals")
    requeue = parse_signals(config.trainer.requeue_signals, "trainer.requeue_signals")
    launch = replace(launch, forward_signals=tuple(preempt), requeue_signals=tuple(requeue))
    return Plan(launch, num_classes, resume)


def _check_world(settings: TrainerConfig, plan: LaunchPlan) -> None:
    """The settings keys that depend on the world and the accelerator this machine gives."""
    # An elastic world (torchrun --nnodes=MIN:MAX) re-forms at sizes the config cannot know: the fix names them.
    worlds = "every world size torchrun may re-form the job at (--nnodes=MIN:MAX x --nproc-per-node)"
    elastic = settings.num_nodes is None
    if settings.batch_size < plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={settings.batch_size} is the global batch, at least one sample for each of "
            f"{plan.world_size} process(es); use {plan.world_size} or more"
            + (f", and with trainer.num_nodes=null, as many as the largest of {worlds}" if elastic else "")
        )
    if settings.batch_size % plan.world_size:
        raise ConfigError(
            f"trainer.batch_size={settings.batch_size} is the global batch and must split evenly over "
            f"{plan.world_size} processes; use a multiple of {plan.world_size}"
            + (f", and with trainer.num_nodes=null, of {worlds}" if elastic else "")
        )
    if settings.val_batch_size is not None and settings.val_batch_size < plan.world_size:
        raise ConfigError(
            f"trainer.val_batch_size={settings.val_batch_size} is the global validation batch, at least one sample "
            f"for each of {plan.world_size} process(es); use {plan.world_size} or more, or null for "
            "trainer.batch_size"
        )
    if settings.precision == "16-mixed" and plan.accelerator == Accelerator.cpu.value:
        raise ConfigError(
            "trainer.precision=16-mixed needs CUDA (fp16 autocast with a GradScaler); "
            "on CPU use trainer.precision=bf16-mixed or 32"
        )


def _check_profiler(settings: TrainerConfig) -> None:
    """trainer.profile against the optimizer steps the run takes."""
    profile = settings.profile
    if profile is None:
        return
    warmup, (steps, why) = WAIT + WARMUP, _steps_at_most(settings)
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


def _steps_at_most(settings: TrainerConfig) -> tuple[int | None, str]:
    """The optimizer steps a run takes at most, as far as its keys tell before launch (a full epoch's
    length is the dataset's, known once it is loaded), and the keys that tell it."""
    bounds = []
    if settings.max_steps is not None:
        bounds.append((settings.max_steps, f"trainer.max_steps={settings.max_steps}"))
    key = "overfit_batches" if settings.overfit_batches else "limit_train_batches"
    batches, accumulate = getattr(settings, key), settings.accumulate_grad_batches
    if batches:
        per_batch = f" / trainer.accumulate_grad_batches={accumulate}" if accumulate > 1 else ""
        bounds.append(
            (
                settings.epochs * -(-batches // accumulate),
                f"trainer.epochs={settings.epochs} x trainer.{key}={batches}{per_batch}",
            )
        )
    return min(bounds) if bounds else (None, "")


def _check_model(node: Mapping[str, Any]) -> None:
    """A weights file that exists; then the builder's own check, if its module has one, given every
    argument the builder will get: the config's keys and the builder's defaults for the others (so
    that a check repeats no default)."""
    weights = node.get("weights")
    if weights is not None and not Path(weights).is_file():
        raise ConfigError(f"model.weights={weights}: no such file; give a state_dict file saved with torch.save")
    arguments = {k: v for k, v in node.items() if not k.startswith("_")}
    signature = inspect.signature(imported(node["_target_"]))
    try:
        signature.bind_partial(**arguments)
    except TypeError as e:  # a typo'd model.* key, or one added with + that the builder does not take
        raise ConfigError(f"model: {node['_target_']} refuses these options ({e}); fix the model.* keys") from None
    module = importlib.import_module(node["_target_"].rsplit(".", 1)[0])
    if hasattr(module, "check"):
        defaults = {name: p.default for name, p in signature.parameters.items() if p.default is not p.empty}
        module.check(**{**defaults, **arguments})  # the config's keys over the defaults


def _check_built(config: Config) -> dict[str, Any]:
    """The loss and each callback, built once: a key their class does not take, or a value it
    refuses, is one line before launch instead of a traceback on every rank. Returns the callbacks."""
    built = {}
    for key, node in [("loss", config.loss), *((f"callbacks.{name}", node) for name, node in config.callbacks.items())]:
        try:
            built[key] = factory(node)()
        except Exception as e:
            raise ConfigError(
                f"{key}: {node['_target_']} refuses these options ({first_line(e)}); fix the {key}.* keys"
            ) from None
    return {key.removeprefix("callbacks."): c for key, c in built.items() if key != "loss"}


def _source_of(name: str, chosen: list[str]) -> str | None:
    """What would produce `name` that the run does not have, and the override that adds it: the EMA
    (val_ema/*), or a callback of conf/callbacks/ that names it in its `figures`, beside the
    callbacks `chosen`."""
    if name.startswith("val_ema/") and name.removeprefix("val_ema/") in FIGURES:
        return "the EMA's figure: add trainer.ema_decay=<decay>, e.g. 0.999"
    for path in sorted((CONF_DIR / "callbacks").glob("*.yaml")):
        target = (OmegaConf.load(path).get(path.stem) or {}).get("_target_")
        try:
            figures = getattr(imported(target), "figures", ()) if target is not None else ()
        except Exception:  # an option of conf/callbacks/ that does not import: its own refusal when chosen
            continue
        if name in figures:
            listed = ",".join([*chosen, path.stem])
            return f"{path.stem}'s figure: add callbacks={f'[{listed}]' if chosen else listed}"
    return None


def _check_monitors(config: Config, callbacks: dict[str, Any]) -> None:
    """Every monitored figure (trainer.checkpoint.monitor, a callback's monitor) is one the run
    produces at validation's end: a typo is one line before launch, not a KeyError after epoch 1.
    And a best is ranked the way its figure's name says is better, if it says one: mode=auto
    takes that way, and a mode given against it (val/loss with max) would keep the worst
    checkpoints, or stop on progress."""
    figures = produced(config.trainer.ema_decay is not None, list(callbacks.values()))
    monitors = [("trainer.checkpoint.monitor", config.trainer.checkpoint.monitor)]
    # A callback's own monitor: a Monitor (early_stopping's) or a figure's name (stop_at's).
    monitors += [
        (f"callbacks.{name}.monitor", getattr(c.monitor, "name", c.monitor))
        for name, c in callbacks.items()
        if hasattr(c, "monitor")
    ]
    for key, name in monitors:
        if name in figures:
            continue
        missing = f"{key}={name}: this run produces no such figure at validation's end"
        source = _source_of(name, list(callbacks))
        if source is not None:
            raise ConfigError(f"{missing}; it is {source}")
        close = difflib.get_close_matches(name, figures, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"{missing}; {hint}it produces {', '.join(figures)}")
    checkpoint = config.trainer.checkpoint
    ranked = [("trainer.checkpoint", Monitor(checkpoint.monitor, checkpoint.mode.value))]
    ranked += [(f"callbacks.{n}", c.monitor) for n, c in callbacks.items() if _ranks_by(c)]
    for key, monitor in ranked:  # auto is resolved already: to the name's way, or left auto when it says none
        better = better_way(monitor.name)
        if monitor.mode == "auto":
            raise ConfigError(
                f"{key}.mode=auto: {monitor.name}'s name does not say which way is better; add {key}.mode=max or min"
            )
        if better not in (None, monitor.mode):
            raise ConfigError(
                f"{key}.monitor={monitor.name} is better {'lower' if better == 'min' else 'higher'}, "
                f"but {key}.mode={monitor.mode}: add {key}.mode={better}"
            )


def _ranks_by(callback: Any) -> bool:
    """A callback that keeps a best (early stopping's Monitor), not one that waits for a value to be
    reached either way (stop_at's: a loss at most, or at least to catch a divergence)."""
    return isinstance(getattr(callback, "monitor", None), Monitor)


def _check_forward(config: Config, num_classes: int) -> None:
    """One forward pass on the meta device (shapes only: no memory, no arithmetic) at the sizes
    training and validation feed: a model built for other images (a Linear sized for image_size
    after the convolutions, ViT's 224 px) fails here in one line, naming the layer and the shapes,
    instead of in the first step."""
    dataset = config.dataset
    shapes_only = {"weights": None} if "weights" in config.model else {}  # no weights file is read
    try:
        with torch.device("meta"):
            model = model_factory(config, num_classes, **shapes_only)()
    except Exception as e:
        if _needs_values(e):  # RegNet's builder reads a tensor's value: the first step will tell
            return
        raise
    sizes = {"train": dataset.train_crop or dataset.image_size, "val": dataset.val_crop or dataset.image_size}
    for split, size in sizes.items():
        model.train(split == "train")
        shape = (2, dataset.channels, size, size)  # 2: BatchNorm trains on more than one value
        where = f"the model cannot take dataset={dataset.name}'s {split} images ({shape[1]}x{size}x{size})"
        layers = _Layers(model)
        try:
            with torch.no_grad(), layers:
                out = model(torch.empty(shape, device="meta"))
        except Exception as e:
            if _needs_values(e):
                return
            raise ConfigError(
                f"{where}: {layers.describe()}: {first_line(e)}; build the model for these images, or set "
                "dataset.image_size (or train_crop / val_crop) to the size it is built for"
            ) from None
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ConfigError(
                f"the model returns {got} for a batch of 2, not logits (2, {num_classes}); "
                "build it to return one row of class scores per image"
            )


class _Layers:
    """Where a forward got to: the innermost layer it is in, or the last one it left, with shapes."""

    def __init__(self, model: nn.Module) -> None:
        self.leaves = [(name, m) for name, m in model.named_modules() if not next(m.children(), None)]
        self.inside: tuple[str, nn.Module, tuple] | None = None
        self.left: tuple[str, nn.Module, Any] | None = None
        self._handles: list = []

    def __enter__(self) -> _Layers:
        for name, module in self.leaves:
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self._handles.append(module.register_forward_hook(functools.partial(self._leave, name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def _enter(self, name: str, module: nn.Module, args: tuple) -> None:
        self.inside = (name, module, args)

    def _leave(self, name: str, module: nn.Module, args: tuple, output: Any) -> None:
        self.inside, self.left = None, (name, module, output)

    def describe(self) -> str:
        if self.inside is not None:
            name, module, args = self.inside
            return f"layer {name} ({module}) got input {_shapes(args)}"
        if self.left is not None:
            name, module, output = self.left
            return f"after layer {name} ({module}), whose output is {_shapes(output)}"
        return "before its first layer"


def _shapes(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return ", ".join(_shapes(v) for v in value if isinstance(v, (torch.Tensor, tuple, list)))
    return type(value).__name__


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
