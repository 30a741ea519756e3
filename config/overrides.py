"""The command line's overrides, read as Hydra reads them: a key the schema lacks, or a logger
option the run does not choose, in one line before Hydra composes; a job's overrides as
{key: value} for its record; and the keys its sweep varies."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence
from dataclasses import is_dataclass
from enum import Enum
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from config.redact import HIDDEN, IN_THE_ENVIRONMENT, is_secret_key, redact, redacted
from config.schema import Config
from config.setup import CONF_DIR, compose
from errors import ConfigError


def check_overrides(overrides: Sequence[str], own_config_dir: bool = False) -> None:
    """The command line's overrides, parsed once, before Hydra composes: a key the config lacks, in
    one line with the nearest one it has (Hydra says it in five lines and suggests `+key=value`, which
    the typed config drops unread); an option of a logger backend the run does not choose. A
    free-form node (model, optimizer, scheduler, a callback) takes new keys with `+`: its class
    judges them. The config is composed at most once, and only for commands that need it.
    `own_config_dir`: the run reads a config dir of the user's own, found elsewhere than in `overrides`."""
    # A config dir of the user's own (--config-dir, hydra.searchpath) may add options to conf/'s groups.
    only_conf = not own_config_dir and not any(
        arg.startswith(("--config-dir", "-cd", "hydra.searchpath")) for arg in overrides
    )
    overrides = [o for o in overrides if "=" in o]  # not the flags (-m, --cfg job)
    if not overrides:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # bad syntax: Hydra's own message names it
        return
    _check_no_secret(parsed)
    if only_conf:
        _check_group_options(parsed)
    free_form = _check_schema_keys(parsed)
    loggers = _unchosen_logger_options(parsed)
    if not free_form and not loggers:
        return
    theirs = tuple(f"logger.{backend}." for backend in loggers)
    kept = [
        o.input_line
        for o in parsed
        if not o.is_sweep_override()
        and o.key_or_group.split(".") not in free_form
        and not o.key_or_group.startswith(theirs)
    ]
    try:
        cfg = compose(*kept)
    except Exception:  # Hydra's to report
        return
    if free_form and not any(o.is_sweep_override() and "." not in o.key_or_group for o in parsed):
        # A sweep of values leaves the nodes as the fixed overrides compose them; one of group
        # choices (model=a,b) changes them from job to job, and is left to Hydra.
        _check_free_form_keys(free_form, cfg)
    for backend, line in loggers.items():
        if cfg.logger[backend] is None:
            raise ConfigError(
                f"{line} sets an option of logger={backend}, which this run does not choose; add it: "
                f"logger={backend}, or a list such as 'logger=[tensorboard,{backend}]'"
            )


def _check_no_secret(parsed: list[Override]) -> None:
    """A password or key on the command line would be written as typed to .hydra/ (Hydra's record
    of the run, before main() runs) and could reach a log: refused, in one line that hides it."""
    for override in parsed:
        line, secret_key = override.input_line, is_secret_key(override.key_or_group)
        if secret_key or redact(line) != line:
            # A secret's key: its whole value hidden, whatever it holds; else a URL's password.
            shown = f"{override.key_or_group}={HIDDEN}" if secret_key else redact(line)
            raise ConfigError(
                f"{shown}: a password or key on the command line is written to the run's records (.hydra/); "
                f"{IN_THE_ENVIRONMENT}"
            )


def _check_group_options(parsed: list[Override]) -> None:
    """A config group's choice (model=resnet18, logger=[tensorboard,csv], a sweep of them) that
    conf/<group>/ has no file for: one line with the options (Hydra's says it in ten)."""
    for override in parsed:
        group = override.key_or_group
        folder = CONF_DIR / group
        # Hydra's groups (hydra/job_logging=stdout) hold options of its own; a key (trainer.epochs) names no folder.
        if group.startswith("hydra") or not folder.is_dir():
            continue
        value = override.value()
        chosen = value.list if isinstance(value, ChoiceSweep) else [value]
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if None in chosen:  # Hydra's ValueError traceback
            raise ConfigError(
                f"{group}=null: a config group takes an option's name; choose {', '.join(options)}, or leave the "
                f"group out with ~{group}"
            )
        for name in chosen:
            for option in name if isinstance(name, list) else [name]:
                if isinstance(option, str) and option not in options:
                    close = difflib.get_close_matches(option, options)
                    hint = f"did you mean {group}={close[0]}? " if close else ""
                    raise ConfigError(
                        f"{group}={option}: no such option in conf/{group}/; {hint}choose {', '.join(options)}"
                    )


def _check_schema_keys(parsed: list[Override]) -> list[list[str]]:
    """The typed sections' keys, against the schema; returns the free-form nodes' keys set without `+`."""
    sections = typing.get_type_hints(Config)
    free_form = []
    for override in parsed:
        path = override.key_or_group.split(".")
        if override.is_delete() or path[0] == "hydra" or "/" in path[0]:
            continue  # ~, Hydra's own node and groups (hydra/launcher=...): Hydra's to judge
        if path[0] not in sections:
            if not (override.is_add() or override.is_force_add()):  # +note=...: a label the record keeps
                _check_top_level(path, sections)
            continue
        if len(path) < 2:
            continue  # a group's choice, or a top-level value
        if not is_dataclass(sections[path[0]]):
            if not (override.is_add() or override.is_force_add() or path[-1].startswith("_")):
                free_form.append(path)  # _target_, _partial_: Hydra's keys, in every such node
            continue
        cls = sections[path[0]]
        for depth, part in enumerate(path[1:], start=1):
            cls = _optional_of(cls)
            if _is_value(cls):  # trainer.epochs.x=1: Hydra's five lines say it cannot merge a dict
                above = ".".join(path[:depth])
                raise ConfigError(f"{'.'.join(path)}: no such key; {above} is a value, not a section: give {above}=...")
            if typing.get_origin(cls) is list and not part.isdigit():  # a name under a list: Hydra's traceback
                above = ".".join(path[:depth])
                raise ConfigError(
                    f"{'.'.join(path)}: no such key; {above} is a list: give {above}=[...], or an item, {above}.0=..."
                )
            if not is_dataclass(cls):
                break  # an item of a list (dataset.mean.0=0.5)
            names = typing.get_type_hints(cls)
            if part not in names:
                raise _no_such_key(path, depth, names)
            cls = names[part]
    return free_form


def schema_type(key: str) -> Any:
    """The type the schema gives a dotted key (trainer.batch_size: int), Optional[X] as X; None for a
    key it does not type (a free-form node's: model.*, optimizer.*) or does not have."""
    hint: Any = Config
    for part in key.split("."):
        hint = _optional_of(hint)
        names = typing.get_type_hints(hint) if is_dataclass(hint) else {}
        if part not in names:
            return None
        hint = names[part]
    return _optional_of(hint)


def _optional_of(hint: Any) -> Any:
    """Optional[X] as X (logger.wandb's WandbConfig); any other type as it is."""
    inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return inner[0] if typing.get_origin(hint) is typing.Union and len(inner) == 1 else hint


def _is_value(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, (bool, int, float, str, Enum))


def _check_top_level(path: list[str], sections: Sequence[str]) -> None:
    """A key outside the typed sections is a config group's choice (debug=fdr) or a typo: Hydra's five
    lines for it suggest `+key=value`, which the typed config would drop unread."""
    key, groups = ".".join(path), sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")
    if path[0] in groups:
        if len(path) > 1:
            raise ConfigError(
                f"{key}: no such key; {path[0]} is a config group: choose one of its options with "
                f"{path[0]}=<name> (conf/{path[0]}/)"
            )
        return
    if len(path) > 1:
        raise _no_such_key(path, 0, list(sections))
    # seed=1 from a template with a top-level seed: the typed key of that name (trainer.seed), else the nearest
    nested = [name for name in _typed_keys(Config) if name.rsplit(".", 1)[-1] == key]
    close = nested[:1] or difflib.get_close_matches(key, [*sections, *groups], n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(
        f"{key}: no such key or config group{hint} (python train.py --cfg job lists the keys, conf/ the groups)"
    )


def _typed_keys(cls: type, prefix: str = "") -> Iterator[str]:
    """Every key of the typed sections, nested ones dotted (trainer.checkpoint.monitor)."""
    for name, hint in typing.get_type_hints(cls).items():
        yield prefix + name
        if is_dataclass(_optional_of(hint)):
            yield from _typed_keys(_optional_of(hint), f"{prefix}{name}.")


def _unchosen_logger_options(parsed: list[Override]) -> dict[str, str]:
    """logger.wandb.* or logger.mlflow.* set for a backend no logger= of the command chooses (a
    preset may still choose it): {backend: the first override that sets its keys}."""
    chosen: set[str] = set()  # the backends every job's logger= names
    for override in parsed:
        if override.key_or_group == "logger" and not override.is_delete():
            jobs = override.value().list if override.is_sweep_override() else [override.value()]
            chosen = set.intersection(*({*job} if isinstance(job, list) else {job} for job in jobs))
    setting: dict[str, str] = {}
    for override in parsed:
        path = override.key_or_group.split(".")
        if len(path) > 2 and path[0] == "logger" and path[1] in ("wandb", "mlflow") and path[1] not in chosen:
            setting.setdefault(path[1], override.input_line)
    return setting


def _check_free_form_keys(paths: list[list[str]], cfg: DictConfig) -> None:
    """model.*, optimizer.*, scheduler.*, callbacks.<name>.* set without +: keys the node composed from
    its group's option (and any experiment) holds."""
    for path in paths:
        if path[0] == "callbacks" and path[1] not in cfg.callbacks:
            raise _no_such_callback(path, cfg.callbacks)
        node = cfg
        for depth, part in enumerate(path):
            if not isinstance(node, DictConfig):
                break  # a value that is not a node: Hydra says what it takes
            if part not in node:
                raise _no_such_key(path, depth, list(node), add=depth == 1)
            node = node[part]


def _no_such_callback(path: list[str], callbacks: DictConfig) -> ConfigError:
    """callbacks.patience=2: a callback's option given without the callback's name."""
    key, option = ".".join(path), path[1]
    having = [name for name, node in callbacks.items() if isinstance(node, DictConfig) and option in node]
    if having:
        return ConfigError(f"{key}: no such key; did you mean callbacks.{having[0]}.{'.'.join(path[1:])}?")
    chosen = ", ".join(callbacks) or "none"
    return ConfigError(
        f"{key}: no such key; a callback's option is callbacks.<name>.{'.'.join(path[1:])}, and this run's "
        f"callbacks are: {chosen} (choose one with callbacks=<name>, conf/callbacks/)"
    )


def _no_such_key(path: list[str], depth: int, names: Sequence[str], add: bool = False) -> ConfigError:
    key = ".".join(path)
    close = difflib.get_close_matches(path[depth], list(names), n=1)
    hint = f"; did you mean {'.'.join([*path[:depth], close[0], *path[depth + 1 :]])}?" if close else ""
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
    return redacted(swept)  # a password in an override reaches no record: the loggers' options, the manifest


def last_overrides(overrides: Sequence[Override]) -> list[Override]:
    """Each key's last override, in the order those come: a later override of a key replaces an earlier
    one, whatever either's prefix (`+a=1 a=2`: a=2), as the command line replaces a search's params."""
    last: dict[str, Override] = {}
    for override in overrides:
        key = override.get_key_element().lstrip("~+")  # its package kept: db@backup=x is another node than db=x
        last.pop(key, None)
        last[key] = override
    return list(last.values())


def sweep_grid(record: str) -> tuple[list[str], dict[str, list[str]]]:
    """A sweep's own overrides, from the record both sweepers (Hydra's and hparams_search's) write in
    its dir before the first job (multirun.yaml, given as its text): hydra.sweeper.params, then the
    command line, the last override of each key as the sweepers read them. The overrides every job
    shares, and each key the sweep sweeps with an override per value it lists (none for an interval or
    a glob)."""
    hydra = OmegaConf.to_container(OmegaConf.create(record).hydra, resolve=False)
    params = hydra["sweeper"].get("params") or {}
    lines = [*(f"{key}={value}" for key, value in params.items()), *hydra["overrides"]["task"]]
    fixed: list[str] = []
    swept: dict[str, list[str]] = {}
    for override in last_overrides(OverridesParser.create().parse_overrides(lines)):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        try:
            swept[override.key_or_group] = [
                f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()
            ]
        except HydraException:  # an interval, or a glob (which needs the config's option lists)
            swept[override.key_or_group] = []
    return fixed, swept


def command_overrides(given: Any, *left_out: str) -> list[str]:
    """The overrides a command was started with, Hydra's then the task's (`given`: the hydra.overrides
    node of a job's HydraConfig, or of a sweep's record); less hydra.mode, and whatever starts with
    `left_out`, which a command that continues it gives itself."""
    return [o for o in (*given.hydra, *given.task) if not o.startswith(("hydra.mode=", *left_out))]


def sweep_command(record: str) -> list[str]:
    """The overrides a -m sweep was started with, from its record (multirun.yaml, given as its text),
    less its dir."""
    return command_overrides(OmegaConf.create(record).hydra.overrides, "hydra.sweep.dir=")
