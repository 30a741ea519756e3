"""The command line's overrides, read as Hydra reads them: a key the schema lacks in one line
before Hydra composes, a job's overrides as {key: value} for its record, and the keys its sweep
varies."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from dataclasses import is_dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from config.schema import Config
from errors import ConfigError


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
        if override.is_delete() or len(path) < 2 or path[0] not in sections:
            continue  # group choices (a group's path, a/b, has no dot), ~ and hydra.* are Hydra's to judge
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
        kept = [
            o.input_line for o in parsed if not o.is_sweep_override() and o.key_or_group.split(".") not in free_form
        ]
        _check_free_form_keys(free_form, kept)


def _check_free_form_keys(paths: list[list[str]], others: list[str]) -> None:
    """model.*, optimizer.*, scheduler.* set without +: keys the node composed from its group's
    option (and any experiment) holds. Composed here only for commands that set one: it costs a
    second composition."""
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


def sweep_grid(record: str) -> tuple[list[str], dict[str, list[str]]]:
    """A sweep's own overrides, from the record both sweepers (Hydra's and hparams_search's) write in
    its dir before the first job (multirun.yaml, given as its text): hydra.sweeper.params, then the
    command line, a later override of a key replacing an earlier one as the sweepers read them. The
    overrides every job shares, and each key the sweep sweeps with an override per value it lists
    (none for an interval or a glob)."""
    hydra = OmegaConf.to_container(OmegaConf.create(record).hydra, resolve=False)
    params = hydra["sweeper"].get("params") or {}
    lines = [*(f"{key}={value}" for key, value in params.items()), *hydra["overrides"]["task"]]
    fixed: dict[str, str] = {}
    swept: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(lines):
        key = override.key_or_group
        fixed.pop(key, None)
        swept.pop(key, None)
        if not override.is_sweep_override():
            fixed[key] = override.input_line
            continue
        try:
            swept[key] = [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
        except HydraException:  # an interval, or a glob (which needs the config's option lists)
            swept[key] = []
    return list(fixed.values()), swept
