"""The composed DictConfig typed into what the code reads: `typed` (the schema's dataclasses, each
checking its own values), the `_target_` nodes checked and turned into factories, and `run_config`,
the RunConfig every worker receives. Nothing here looks at this machine or the data: that is the
pre-flight's (preflight.py)."""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationResolutionError, ValidationError

from config.hparams import sweep_jobs
from config.redact import redact
from config.schema import (
    Config,
    LrScaling,
    OptimizerOptions,
    ResumePoint,
    RunConfig,
    SchedulerOptions,
    TrainerConfig,
    parse_signals,
)
from errors import ConfigError, config_error_within, first_line

T = TypeVar("T")

# The `_target_` nodes and whether a run must have one: scheduler=none is {}, a constant lr.
_NODES = {"model": True, "optimizer": True, "loss": True, "scheduler": False}


def typed(cfg: DictConfig) -> Config:
    """`cfg` as the schema's dataclasses, every value checked (a ConfigError names the first that is
    wrong), and every `_target_` node importable."""
    try:
        config: Config = OmegaConf.to_object(cfg)
    except InterpolationResolutionError as e:
        cause = config_error_within(e)  # a resolver's refusal (config.setup's per_device)
        if cause is None:
            raise
        raise cause from None
    options = optimizer_options(config.optimizer)
    warmup_epochs = scheduler_options(config.scheduler).warmup_epochs
    if warmup_epochs >= config.trainer.epochs:  # the lr would reach optimizer.lr at the run's last step, or never
        raise ConfigError(
            f"scheduler.warmup_epochs={warmup_epochs} leaves no epoch at the lr it warms up to "
            f"(trainer.epochs={config.trainer.epochs}); give fewer warmup epochs, or more trainer.epochs"
        )
    if options.lr_scaling == LrScaling.linear and "lr" not in config.optimizer:
        raise ConfigError("optimizer.lr_scaling=linear scales optimizer.lr, which is not set; give optimizer.lr")
    nodes = {key: (getattr(config, key), required) for key, required in _NODES.items()}
    if "_target_" in config.callbacks:  # written as a conf/loss/ or conf/model/ file is: flat
        raise ConfigError(
            f"callbacks._target_={config.callbacks['_target_']}: a callback's file in conf/callbacks/ puts its "
            "_target_ and options under the callback's name (`<name>:`, then `  _target_: ...`), as the files there do"
        )
    nodes.update((f"callbacks.{name}", (node, True)) for name, node in config.callbacks.items())
    for key, (node, required) in nodes.items():
        check_target(key, node, required)
    return config


def _no_such_name(key: str, target: str) -> None:
    """A `_target_` whose module imports but holds no such name (models.mlp.Mlp for models.mlp.MLP):
    Hydra's error says "No module named 'models.mlp.Mlp'; 'models.mlp' is not a package", which
    sends one looking for a missing file. Say which name is missing, and the nearest there is."""
    module_name, _, name = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception:  # the module itself does not import: Hydra's error says why
        return
    if hasattr(module, name):
        return
    names = {n.lower(): n for n in vars(module) if not n.startswith("_")}  # MLP for Mlp too
    close = difflib.get_close_matches(name.lower(), names, n=1)
    hint = f"did you mean {module_name}.{names[close[0]]}?" if close else f"name one that {module_name} defines"
    raise ConfigError(f"{key}._target_={target}: {module_name} has no {name}; {hint}")


def check_sweep(record: Path) -> None:
    """Every job of a -m sweep typed as its first job starts (`record`: the sweep's multirun.yaml):
    a value no run could use, in any job, is one line naming that job before any job trains, not a
    refusal once the jobs listed before it have run. The jobs are composed once per sweep, for the
    HParams tab's varied keys too (config.hparams.sweep_jobs)."""
    if record.is_file():
        _check_jobs(record.read_text())


@functools.lru_cache(maxsize=1)  # once per sweep: its jobs run one after another in the sweep's process
def _check_jobs(record: str) -> None:
    for swept, composed in sweep_jobs(record):
        cfg = copy.deepcopy(composed)  # shared with the HParams tab's keys, which read its hydra node
        with open_dict(cfg):
            del cfg["hydra"]  # what the job's main() is given
        try:
            typed(cfg)
        except ConfigError as e:  # never this job's own: typed already, it differs from the others by `swept`
            raise ConfigError(f"{e} (the sweep's job {' '.join(swept)}: fix it, and run the sweep again)") from None


def check_target(key: str, node: Any, required: bool = True) -> None:
    """A node that names the class to build (`_target_`) and whose class imports: one line naming the
    key otherwise, not a KeyError or an ImportError's traceback on every rank."""
    group = key.split(".")[0]
    if not isinstance(node, Mapping) or node.get("_target_") is None:
        if not required and (node is None or (isinstance(node, Mapping) and not node.get("_target_"))):
            return
        raise ConfigError(f"{key}: no _target_; name the class to build, as the files in conf/{group}/ do")
    try:
        imported(node["_target_"])
    except Exception as e:
        _no_such_name(key, node["_target_"])
        cause = e.__cause__ or e  # Hydra wraps the import's own error
        raise ConfigError(
            f"{key}._target_={node['_target_']} does not import ({type(cause).__name__}: {first_line(cause)}); "
            f"name a class importable from this repo, as the files in conf/{group}/ do"
        ) from None


def imported(target: str) -> Any:
    """What a `_target_` names (Hydra's get_object), without the three-line ERROR that Hydra logs
    before it raises: the caller says it in one line, or passes over it."""
    quiet = logging.getLogger("hydra.utils")
    disabled, quiet.disabled = quiet.disabled, True
    try:
        return get_object(target)
    finally:
        quiet.disabled = disabled


def factory(node: Any, **arguments: Any) -> Callable[..., Any]:
    """A `_target_` node as a picklable factory (Hydra's _partial_): each rank builds its own.
    `arguments` replace the node's (a value the pre-flight found, such as num_classes)."""
    return instantiate(node, _partial_=True, _convert_="all", **arguments)


def typed_part(node: Mapping[str, Any], cls: type[T], prefix: str) -> T:
    """`cls`'s keys of a `_target_` node, validated as the schema would (Enum names, numbers), then
    by `cls`'s own checks."""
    part = OmegaConf.structured(cls)
    for f in fields(cls):
        value = node[f.name]
        try:
            part[f.name] = value
        except ValidationError as e:
            shown = value.name if hasattr(value, "name") else value
            raise ConfigError(f"{prefix}.{f.name}={shown}: {first_line(e)}") from None
    return OmegaConf.to_object(part)


def optimizer_options(node: Mapping[str, Any]) -> OptimizerOptions:
    return typed_part(node, OptimizerOptions, "optimizer")


def scheduler_options(node: Mapping[str, Any]) -> SchedulerOptions:
    return typed_part(node, SchedulerOptions, "scheduler")


def target_arguments(node: Any, cls: type) -> dict[str, Any]:
    """The node without `cls`'s keys: what the `_target_` itself takes."""
    ours = {f.name for f in fields(cls)}
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    return {k: v for k, v in plain.items() if k not in ours}


def scaled_lr(lr: float, options: OptimizerOptions, settings: TrainerConfig) -> float:
    """lr_scaling=linear (Goyal et al.): an optimizer step that sees k times reference_batch
    samples takes k times the lr."""
    if options.lr_scaling == LrScaling.none:
        return lr
    return lr * settings.batch_size * settings.accumulate_grad_batches / options.reference_batch


@dataclass(frozen=True)
class Composition:
    """What Hydra's composition says besides the values: where the run writes, its record, and the
    sweep it is one job of (config.setup.composition reads them from Hydra)."""

    run_dir: Path
    choices: dict[str, str]  # the option Hydra picked for each group
    swept: dict[str, Any]  # the job's command-line overrides, {key: value} (config.overrides.swept_overrides)
    hparams: dict[str, Any]  # the run's main options and its overrides, for the loggers' tables
    sweep_dir: Path | None = None  # the -m sweep's or search's dir; None: a single run
    varied: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # the keys its sweep varies


def model_factory(config: Config, num_classes: int, **arguments: Any) -> Callable[..., Any]:
    """The model's factory. dataset.num_classes=null reached the model's num_classes, interpolated from
    it, as null too: `num_classes` is the count the pre-flight found."""
    node = config.model
    counted = {"num_classes": num_classes} if "num_classes" in node and node["num_classes"] is None else {}
    return factory(node, **counted, **arguments)


def config_yaml(config: Config, num_classes: int) -> str:
    """The values this run uses, as YAML (saved in every checkpoint): dataset.num_classes=null
    written as the count, in the dataset's and the model's node alike."""
    dataset = replace(config.dataset, num_classes=num_classes)
    counted = "num_classes" in config.model and config.model["num_classes"] is None
    model = {**config.model, "num_classes": num_classes} if counted else config.model
    # A password in the config reaches no checkpoint.
    return redact(OmegaConf.to_yaml(OmegaConf.structured(replace(config, dataset=dataset, model=model))))


def run_config(
    config: Config, composition: Composition, *, num_classes: int, resume: ResumePoint | None = None
) -> RunConfig:
    """The typed config every worker receives. `num_classes`: the dataset's, as the pre-flight found
    it (dataset.num_classes=null counts them); `resume`: the checkpoint it chose to continue."""
    dataset = replace(config.dataset, num_classes=num_classes)
    options = optimizer_options(config.optimizer)
    optimizer = target_arguments(config.optimizer, OptimizerOptions)
    if "lr" in optimizer:
        optimizer["lr"] = scaled_lr(optimizer["lr"], options, config.trainer)
    scheduler = target_arguments(config.scheduler, SchedulerOptions)
    settings = config.trainer
    return RunConfig(
        trainer=settings,
        strategy=config.strategy,
        launcher=config.launcher,
        data=config.data,
        dataset=dataset,
        logger=config.logger,
        model=model_factory(config, num_classes),
        optimizer=factory(optimizer),
        scheduler=factory(scheduler) if scheduler.get("_target_") else None,
        loss=factory(config.loss),
        callbacks={name: factory(node) for name, node in config.callbacks.items()},
        optimizer_options=options,
        scheduler_options=scheduler_options(config.scheduler),
        run_dir=composition.run_dir,
        choices={group: composition.choices[group] for group in ("model", "dataset", "strategy")},
        hparams=composition.hparams,
        swept=composition.swept,
        varied=composition.varied,
        config_yaml=config_yaml(config, num_classes),
        preempt_signals=tuple(parse_signals(settings.preempt_signals, "trainer.preempt_signals")),
        requeue_signals=tuple(parse_signals(settings.requeue_signals, "trainer.requeue_signals")),
        sweep_dir=composition.sweep_dir,
        resume=resume,
    )
