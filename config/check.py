"""Before any process starts: the composed config against this machine, as one-line errors;
then the typed RunConfig every worker receives."""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, ValidationError

import data
from config.schema import COMPILE_MODES, PRECISIONS, Accelerator, Config, LrScaling, OptimConfig, RunConfig, ScheduleConfig
from distributed import strategies
from distributed.launch import LaunchPlan, plan_launch
from errors import ConfigError, first_line
from training.checkpoint import check_resumable, find_resume, load_checkpoint, trained_config
from training.optim import scaled_lr
from training.preemption import parse_signals

T = TypeVar("T")


def typed(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)


def check(cfg: Config, run_dir: Path | None = None, multirun: bool = False) -> LaunchPlan:
    """Everything that can be wrong before training starts, as one-line ConfigErrors. `multirun`:
    one job of a Hydra `-m` sweep (the launch plan then keeps CUDA out of this process)."""
    trainer = cfg.trainer
    strategy = strategies.get(cfg.strategy)
    plan = plan_launch(trainer, strategy, cfg.launcher, multirun=multirun)
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
        raise ConfigError(f"trainer.compile_mode={trainer.compile_mode} compiles nothing alone; add trainer.compile=true")
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
    signals = parse_signals(trainer.preempt_signals, "trainer.preempt_signals")
    parse_signals(trainer.requeue_signals, "trainer.requeue_signals")
    _check_recipe(cfg)
    # The checks that build the model (and may read a weights file) after the cheap ones.
    resolve_num_classes(cfg)  # before anything builds the model
    _check_model(cfg.model)
    strategy.check_model(factory(cfg.model))
    data.check(cfg.dataset, cfg.data)
    _check_forward(cfg)  # after the data's own keys, which name the fix more closely
    _check_resume(cfg, run_dir)
    return replace(plan, forward_signals=tuple(signals))


def _check_recipe(cfg: Config) -> None:
    """The recipe keys: the ranges torchvision's reference scripts assume."""
    trainer, optim, schedule = cfg.trainer, optim_config(cfg.optimizer), schedule_config(cfg.scheduler)
    smoothing, erase, decay = trainer.label_smoothing, cfg.dataset.random_erase, optim.norm_weight_decay
    ranges = [  # key, value, whether it is allowed, what is
        ("trainer.label_smoothing", smoothing, 0 <= smoothing < 1, "0 (off) up to below 1"),
        ("dataset.random_erase", erase, 0 <= erase <= 1, "a probability, 0 (off) to 1"),
        ("trainer.mixup_alpha", trainer.mixup_alpha, trainer.mixup_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
        ("trainer.cutmix_alpha", trainer.cutmix_alpha, trainer.cutmix_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
        ("trainer.ema_decay", trainer.ema_decay, trainer.ema_decay is None or 0 < trainer.ema_decay < 1,
         "a decay in (0, 1), e.g. 0.99998, or null"),
        ("trainer.ema_every_n_steps", trainer.ema_every_n_steps, trainer.ema_every_n_steps >= 1, "1 or more"),
        ("scheduler.warmup_epochs", schedule.warmup_epochs, schedule.warmup_epochs >= 0, "0 (off) or more"),
        ("scheduler.warmup_start_factor", schedule.warmup_start_factor, 0 < schedule.warmup_start_factor <= 1,
         "a fraction of the lr in (0, 1]"),
        ("optimizer.reference_batch", optim.reference_batch, optim.reference_batch >= 1, "the batch lr was tuned for"),
        ("optimizer.norm_weight_decay", decay, decay is None or decay >= 0, "null (as weight_decay) or 0 and up"),
        ("data.repeated_augmentations", cfg.data.repeated_augmentations, cfg.data.repeated_augmentations >= 1,
         "1 (off) or more"),
    ]
    for key, value, allowed, what in ranges:
        if not allowed:
            raise ConfigError(f"{key}={value}: use {what}")
    if optim.lr_scaling == LrScaling.linear and "lr" not in cfg.optimizer:
        raise ConfigError("optimizer.lr_scaling=linear scales optimizer.lr, which is not set; give optimizer.lr")


def _check_schedule(resume: str | None, trained: Mapping[str, Any] | None, scheduler: Mapping[str, Any]) -> None:
    """The schedule a resume asks for is the one it trained with: loading the scheduler's state puts
    back the saved T_max, step_size, ..., so a run resumed with `trainer.epochs` raised would train
    its extra epochs on a cosine already at lr 0; a warmup of another length would change course
    mid-run."""
    if trained is None or not isinstance(trained.get("scheduler"), dict):  # a checkpoint that does not say
        return
    before = trained["scheduler"]
    ours = [f.name for f in fields(ScheduleConfig)]  # the warmup, before what it changes (T_max)
    keys = sorted({*before, *scheduler}, key=lambda k: (k != "_target_", k not in ours, k))
    key = next((k for k in keys if before.get(k) != scheduler.get(k)), None)
    if key is None:
        return
    epochs = (trained.get("trainer") or {}).get("epochs")
    fix = (f"resume with trainer.epochs={epochs}, which T_max follows," if key == "T_max" and epochs is not None
           else "resume with the scheduler it trained with")
    raise ConfigError(
        f"trainer.resume={resume} trained with scheduler.{key}={before.get(key, 'none')}, and this run asks for "
        f"{scheduler.get(key, 'none')}: a resume continues the saved schedule; {fix} or train afresh in a new run dir"
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


def _check_resume(cfg: Config, run_dir: Path | None) -> None:
    """Refuse a checkpoint that cannot continue this run, and never overwrite a run's last.pt."""
    resume, test_only = cfg.trainer.resume, cfg.trainer.test_only
    path = find_resume(resume, run_dir) if run_dir is not None or resume != "auto" else None
    if path is not None:
        if not path.exists():
            raise ConfigError(f"trainer.resume={resume}: no such file; give an existing checkpoint path")
        if path.is_dir():  # strategy=fsdp's sharded last.pt, checked from its metadata and train state
            if test_only:  # training.evaluation reads one whole file; strategy=fsdp writes best.pt as one
                best = path.parent / "best.pt"
                best = best if best.is_file() else "<that run>/checkpoints/best.pt"
                raise ConfigError(
                    f"trainer.test_only=true evaluates a whole-file checkpoint, but trainer.resume={resume} is "
                    f"strategy=fsdp's sharded last.pt (a directory); give trainer.resume={best}, the best epoch's "
                    "weights in one file"
                )
            from distributed import sharded_state  # torch.distributed.checkpoint: ~1 s to import

            checkpoint = sharded_state.describe(path)
        else:
            checkpoint = load_checkpoint(path)
        check_resumable(checkpoint, factory(cfg.model)(), path)
        warmed = isinstance(checkpoint["scheduler"], dict) and "last_step" in checkpoint["scheduler"]  # a Warmup's
        if not test_only and warmed != bool(schedule_config(cfg.scheduler).warmup_epochs):
            raise ConfigError(
                f"trainer.resume={resume} trained {'with' if warmed else 'without'} a warmup and cannot continue "
                f"{'without' if warmed else 'with'} one; resume with the scheduler.warmup_epochs it trained with"
            )
        if not test_only:
            _check_schedule(resume, trained_config(checkpoint), cfg.scheduler)
    elif test_only and cfg.model.get("weights") is None:
        raise ConfigError(
            f"trainer.test_only=true evaluates trained weights, but trainer.resume={resume} names no checkpoint; "
            "give trainer.resume=<checkpoint> or model.weights=<file>"
        )
    if test_only:
        return  # writes no checkpoint: a run dir's last.pt is safe
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if last is not None and last.exists() and (path is None or path.resolve() != last.resolve()):
        raise ConfigError(
            f"hydra.run.dir={run_dir} already holds checkpoints/last.pt; continue it with trainer.resume=auto "
            "or train in another hydra.run.dir"
        )


def factory(node: Any) -> Callable[..., Any]:
    """A `_target_` node as a picklable factory: each rank builds its own (Hydra's _partial_)."""
    return instantiate(node, _partial_=True, _convert_="all")


def check_override_keys(overrides: Sequence[str]) -> None:
    """A key the config lacks, in one line with the nearest one it has. Hydra says it in five lines
    and suggests `+key=value`, which the typed config drops unread; a free-form node (model,
    optimizer, scheduler) takes new keys with `+`: its class judges them (check, check_arguments)."""
    overrides = [o for o in overrides if "=" in o]  # not the flags (-m, --cfg job)
    if not overrides:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # bad syntax: Hydra's own message names it
        return
    sections = typing.get_type_hints(Config)
    free_form = []
    for override in parsed:
        key = override.key_or_group
        path = key.split(".")
        if override.is_delete() or "/" in key or "@" in key or len(path) < 2 or path[0] not in sections:
            continue  # group choices, ~ and hydra.* are Hydra's to judge
        if not is_dataclass(sections[path[0]]):
            if not (override.is_add() or override.is_force_add() or path[-1].startswith("_")):
                free_form.append(path)  # _target_, _partial_: Hydra's keys, in every such node
            continue
        cls = sections[path[0]]
        for depth, part in enumerate(path[1:], start=1):
            if not is_dataclass(cls):
                break  # a leaf, or a free-form value
            names = typing.get_type_hints(cls)
            if part not in names:
                raise _no_such_key(path, depth, names)
            cls = names[part]
    if free_form and not any(o.is_sweep_override() and "." not in o.key_or_group for o in parsed):
        # Composed with the command's fixed overrides: a sweep of values leaves the nodes as they are;
        # one of group choices (model=a,b) changes them from job to job, and is left to Hydra.
        kept = [o.input_line for o in parsed if not o.is_sweep_override() and o.key_or_group.split(".") not in free_form]
        _check_free_form_keys(free_form, kept)


def _check_free_form_keys(paths: list[list[str]], others: list[str]) -> None:
    """model.*, optimizer.*, scheduler.* set without +: keys the node composed from its group's
    option (and any experiment) holds. Composed here, ~0.1 s, only for commands that set one."""
    from config.setup import compose

    try:
        cfg = compose(*[o for o in others if o is not None])
    except Exception:  # Hydra's to report
        return
    for path in paths:
        node = cfg
        for depth, part in enumerate(path):
            if not isinstance(node, DictConfig):
                break  # a value that is not a node: Hydra says what it takes
            if part not in node:
                raise _no_such_key(path, depth, list(node), add=depth == 1)
            node = node[part]


def _no_such_key(path: list[str], depth: int, names: Sequence[str], add: bool = False) -> ConfigError:
    key = ".".join(path)
    close = difflib.get_close_matches(path[depth], list(names), n=1)
    hint = f"; did you mean {'.'.join([*path[:depth], close[0]])}?" if close else ""
    new = f"; +{key}=... adds an argument of its class" if add else ""
    return ConfigError(f"{key}: no such key{hint} (python train.py --cfg job lists them all{new})")


def swept_overrides(task_overrides: Sequence[str], exclude_keys: Sequence[str] = ()) -> dict[str, Any]:
    """A job's overrides (hydra.overrides.task) as {key: typed value}, in command-line order, less
    `exclude_keys` (hydra.job.config.override_dirname.exclude_keys: what the run dir's name leaves out)."""
    swept = {}
    for override in OverridesParser.create().parse_overrides(list(task_overrides)):
        if override.key_or_group not in exclude_keys and not override.is_delete():
            value = override.value()
            swept[override.key_or_group] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return swept


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
    cfg: DictConfig, settings: Config, run_dir: Path, choices: dict[str, str], swept: dict[str, Any]
) -> RunConfig:
    """The typed config every worker receives. `settings`: `cfg` typed; `choices`: the group
    options Hydra picked; `swept`: the job's overrides (`swept_overrides`)."""
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
        optim=optim,
        schedule=schedule_config(cfg.scheduler),
        run_dir=run_dir,
        labels=labels,
        hparams=_hparams(cfg, settings, labels, optimizer.get("lr")),
        swept=swept,
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),  # the values this run used
    )


def _hparams(cfg: DictConfig, settings: Config, labels: dict[str, str], lr: float | None) -> dict[str, Any]:
    """The choices that tell one sweep job from another, for TensorBoard's HParams tab."""
    trainer = settings.trainer
    return {
        **labels,
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": lr,  # as trained: after optimizer.lr_scaling
        "scheduler": cfg.scheduler.get("_target_", "none").rsplit(".", 1)[-1],
        "accelerator": trainer.accelerator.value if trainer.gpus is None else "gpu",
        "devices": trainer.devices_per_node * trainer.num_nodes,
        "batch_size": trainer.batch_size,
        "epochs": trainer.epochs,
        "seed": trainer.seed,
        "precision": trainer.precision,
    }


class OutputDirCheck(Callback):
    """Hydra makes the run dir before main() runs; one it cannot make would end in a traceback.
    It also writes the run's record (.hydra/) before main() can refuse the run: what a run dir
    held is kept, for restore_run_record to put back."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            directory = config.hydra.run.dir
        except InterpolationResolutionError as e:  # run_name refuses a world whose ranks cannot share a dir
            cause = _config_error_within(e)
            if cause is None:
                raise
            print(f"error: {cause}", file=sys.stderr)
            sys.exit(2)
        _exit_unless_writable("hydra.run.dir", directory)
        subdir = config.hydra.output_subdir  # None on the ranks that write no record
        record = Path(directory, subdir) if subdir is not None else None
        if record is not None and record.is_dir():
            _kept_record.update((path, path.read_bytes()) for path in record.iterdir() if path.is_file())

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_writable("hydra.sweep.dir", config.hydra.sweep.dir)


_kept_record: dict[Path, bytes] = {}  # the run dir's .hydra/ files as an earlier run left them


def restore_run_record() -> None:
    """A refused run leaves the record of the run its dir already held as it was: bench.report
    reads a run's overrides from it."""
    for path, contents in _kept_record.items():
        path.write_bytes(contents)


def _config_error_within(error: BaseException) -> ConfigError | None:
    """OmegaConf wraps a resolver's exception and keeps it only as the context of its own."""
    while error is not None and not isinstance(error, ConfigError):
        error = error.__context__
    return error


def _exit_unless_writable(key: str, directory: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("permission denied")
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"error: {key}={directory}: cannot write there ({reason}); choose a writable {key}", file=sys.stderr)
        sys.exit(2)
