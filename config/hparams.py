"""What runs are compared by: each run's record, every option it used as one flat mapping (the
loggers' tables, hparams.json, bench.report), and the keys whose value differs between runs,
worked out from those records, whichever way a value came to differ (a group's defaults, an
interpolation, an override). Any other flat record of a run (its model summary, a manifest) joins
its record before they are compared."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from config.overrides import sweep_grid

# The options TensorBoard's HParams tab shows for every run, alike or not: the group options, then these keys.
HPARAM_GROUPS = ("model", "dataset", "strategy", "optimizer", "scheduler", "loss")
HPARAM_KEYS = (
    "optimizer.lr",
    "trainer.batch_size",
    "trainer.epochs",
    "trainer.seed",
    "trainer.precision",
    "trainer.accelerator",
    "trainer.devices",
)
# How a run starts, where it reads, writes and logs: no figure it computes depends on them, and
# they differ from machine to machine. A key is left out with everything under it.
NOT_COMPARED = (
    "paths",
    "launcher",
    "logger",
    "trainer.progress_bar",
    "trainer.resume",
    "trainer.preempt_signals",
    "trainer.requeue_signals",
    "trainer.preempt_grace_s",
    "dataset.root",
    "dataset.download",
    # A pruned search's trial's own callback (hydra_plugins/optuna_study_sweeper): its number and
    # where its study lives, which told every trial apart in bench.report, and a URL given through
    # ${oc.env:...} resolved, its password too.
    "callbacks.optuna_pruning",
)

Value = bool | int | float | str


def hparams(cfg: DictConfig, choices: Mapping[str, str | None]) -> dict[str, Value]:
    """The run's record: the group options Hydra picked (`optimizer: sgd`), then every value of the
    config resolved, under its dotted key (`optimizer.weight_decay: 0.0005`), as the config spells
    it: a number or a flag as it is, an Enum by its name, a list as JSON. Not the keys NOT_COMPARED,
    Hydra's own (`_target_`: the group option names the class), nor an unset one."""
    options: dict[str, Value] = {group: choices[group] for group in HPARAM_GROUPS if choices.get(group) is not None}
    options.update(
        (group, option)
        for group, option in choices.items()
        if option is not None and not group.startswith("hydra/") and not _not_compared(group)
    )
    for key in cfg:
        if key == "hydra":  # composed for a sweep's job: Hydra's own node, and its run-time values unset
            continue
        value = cfg[key]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True, enum_to_str=True)
        for dotted, leaf in _leaves(str(key), value):
            if leaf is not None and not _not_compared(dotted) and not any(p.startswith("_") for p in dotted.split(".")):
                options[dotted] = leaf if isinstance(leaf, (bool, int, float, str)) else json.dumps(leaf)
    return options


def _leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for name, inner in value.items():
            yield from _leaves(f"{key}.{name}", inner)
    elif value != {}:
        yield key, value


def _not_compared(key: str) -> bool:
    return any(key == left_out or key.startswith(f"{left_out}.") for left_out in NOT_COMPARED)


def differing(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """The keys whose value is not the same in every record, in the order the records first give
    them, each with the values they hold, in theirs. A key that some records lack differs (those
    records hold no value of it); 1 and 1.0 are one value, `true` and 1 two."""
    keys = dict.fromkeys(key for record in records for key in record)
    varied = {}
    for key in keys:
        values = {_comparable(record.get(key)): record.get(key) for record in records}
        if len(values) > 1:
            varied[key] = tuple(value for value in values.values() if value is not None)
    return varied


def _comparable(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    return ("number", float(value)) if isinstance(value, (int, float)) else value


def varied_hparams(
    sweep_record: Path, figures: Callable[[DictConfig], Mapping[str, Any]] | None = None
) -> dict[str, tuple[Any, ...]]:
    """The keys whose value differs between the jobs of a sweep, each with the values the jobs take:
    `differing` over the records of every job the sweep's record (multirun.yaml) lists
    (config.overrides.sweep_grid), each composed, and joined by `figures(its config)` (its model
    summary). A key an interval or a glob sweeps differs, its values unlisted. {} where there is no
    record."""
    return _varied_hparams(sweep_record.read_text(), figures) if sweep_record.is_file() else {}


@functools.lru_cache(maxsize=1)  # one per sweep: its jobs run one after another in the sweep's process
def _varied_hparams(
    record: str, figures: Callable[[DictConfig], Mapping[str, Any]] | None
) -> dict[str, tuple[Any, ...]]:
    jobs = [
        {**hparams(cfg, cfg.hydra.runtime.choices), **(figures(cfg) if figures else {})}
        for _, cfg in sweep_jobs(record)
    ]
    _, swept = sweep_grid(record)
    return {**differing(jobs), **{key: () for key, lines in swept.items() if not lines}}  # an interval: values unknown


@functools.lru_cache(maxsize=1)  # one per sweep, as above
def sweep_jobs(record: str) -> tuple[tuple[tuple[str, ...], DictConfig], ...]:
    """Each job of the sweep its record lists (multirun.yaml's text, config.overrides.sweep_grid):
    the overrides it sweeps, and its config, composed with its hydra node. A key an interval or a
    glob sweeps keeps its fixed value."""
    from config.setup import compose  # Hydra's composition: not for those who only compare records (bench.report)

    fixed, swept = sweep_grid(record)
    return tuple(
        (combination, compose(*fixed, *combination, hydra=True))
        for combination in itertools.product(*(lines for lines in swept.values() if lines))
    )
