"""Hydra's side of the config: the schema in its ConfigStore, the resolvers conf/ uses, and
`compose()` for tests and tools that need the config `python train.py` would get."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.hydra import Hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.nodes import EnumNode

from config import launcher_env
from config.schema import Config, devices_per_node
from errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"


def _per_device(batch: int, *, _root_: DictConfig) -> int:
    """${per_device:128}: the seeds give a batch per GPU; trainer.batch_size is the global one."""
    trainer = _root_.trainer
    return batch * devices_per_node(trainer.gpus, trainer.devices) * _nodes(trainer, f"per_device:{batch}")


def _per_node(batch: int, *, _root_: DictConfig) -> int:
    """${per_node:256}: the ImageNet example's batch is each node's, split over its GPUs."""
    return batch * _nodes(_root_.trainer, f"per_node:{batch}")


def _nodes(trainer: DictConfig, resolver: str) -> int:
    """A batch per device or per node makes a global batch only for a known count of nodes; an
    elastic world's (trainer.num_nodes=null) changes as torchrun re-forms it, and the global batch
    must not."""
    if trainer.num_nodes is None:
        raise ConfigError(
            f"${{{resolver}}} counts the nodes, and trainer.num_nodes=null leaves them to the launcher; give the "
            "global batch itself (trainer.batch_size=N), or trainer.num_nodes"
        )
    return trainer.num_nodes


def _epochs_after_warmup(epochs: int, warmup_epochs: int) -> int:
    """${epochs_after_warmup:${trainer.epochs},${scheduler.warmup_epochs}}: the epochs a scheduler
    runs once the warmup is done (torchvision's cosine T_max = epochs - warmup epochs); at least 1.
    Its inputs are named in the config, so that `--cfg job` says what it is worked out from."""
    return max(1, epochs - warmup_epochs)


def _name(choice: object) -> str:
    """An Enum key (launcher.name) reaches a resolver as the member: its name is the choice."""
    return choice.name if isinstance(choice, Enum) else str(choice)


def _spelled(key: str, *, _root_: DictConfig) -> str:
    """${spelled:trainer.gpus}: a key's value as a config spells it (null, true, auto), where Python
    would print None, True, Accelerator.auto: for the values --help shows; a key the config lacks
    (an optimizer without lr) is null. The key, not ${trainer.gpus}: a text without nested
    interpolations composes without OmegaConf's parser (its regex is enough), at every start."""
    value = OmegaConf.select(_root_, key, default=None)
    return json.dumps(value) if value is None or isinstance(value, bool) else _name(value)


def _job_dir(*, _root_: DictConfig) -> str:
    """${job_dir:}: a sweep job's dir (hydra.sweep.subdir), from the job's number and overrides."""
    job = _root_.hydra.job
    naming = job.config.override_dirname
    num = None if OmegaConf.is_missing(job, "num") else job.num  # missing: --cfg all --resolve, outside a sweep
    return job_dir(num, list(_root_.hydra.overrides.task), naming.exclude_keys, naming.kv_sep, naming.item_sep)


def job_dir(
    num: int | None, overrides: Sequence[str], exclude_keys: Sequence[str] = (), kv_sep: str = "=", item_sep: str = ","
) -> str:
    """Its number, then the overrides that tell it from the others, if any, as Hydra's
    override_dirname joins them, but with floats to 4 significant digits: a search's sampled
    0.03028525153605885 names its dir 0.03029 (the exact value stays in its .hydra/; the number
    keeps two such jobs apart). A value's "/" becomes "_" (val/loss names val_loss): the name is one
    dir, never a dir nested in it or, by "../", one outside the sweep's. A name past what file
    systems take (255 bytes) keeps its start and a hash of the whole, so that it stays apart from
    its neighbours'."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    lines = sorted(_four_digits(o) for o in parsed if o.key_or_group not in exclude_keys)
    dirname = item_sep.join(lines).replace("=", kv_sep).replace("/", "_")
    prefix = "<job number>" if num is None else str(num)
    name = f"{prefix}_{dirname}" if dirname else prefix
    if len(name.encode()) <= _NAME_BYTES:
        return name
    return f"{name.encode()[: _NAME_BYTES - 13].decode(errors='ignore')}~{hashlib.sha1(name.encode()).hexdigest()[:12]}"


def job_order(name: str) -> list[Any]:
    """The sort key of job dirs (and paths through them) by their numbers: job 10 after job 9."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _four_digits(override: Override) -> str:
    line = override.input_line
    value = override.value()
    if not isinstance(value, float) or float(f"{value:.4g}") == value:
        return line  # as typed: 1e-3 stays 1e-3
    return f"{line.split('=', 1)[0]}={value:.4g}"


_NAME_BYTES = 200  # file systems take 255 bytes a name: room to spare


SCHEMA = "schema"  # the ConfigStore name conf/config.yaml's defaults start with

# conf/config.yaml names the run dir with run_name and rank_zero_only, so every torchrun/SLURM
# rank picks the same dir and only rank 0 writes .hydra/ (Hydra #2070).
RESOLVERS = {
    "run_name": lambda launcher, default: launcher_env.run_name(_name(launcher), os.environ, default),
    "rank_zero_only": lambda launcher, value: value if launcher_env.is_rank_zero(_name(launcher), os.environ) else None,
    "per_device": _per_device,
    "per_node": _per_node,
    "job_dir": _job_dir,
    "epochs_after_warmup": _epochs_after_warmup,
    "spelled": _spelled,
    "project_root": lambda: str(ROOT),
}


def register() -> None:
    """Idempotent: train.py, Hydra's callback import, compose() and every tool may call it. The schema
    is stored once a process: each store builds its whole node again."""
    store = ConfigStore.instance()
    if f"{SCHEMA}.yaml" not in store.repo:
        store.store(name=SCHEMA, node=Config)
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


# The one group whose files set hydra.mode (a search is a sweep: no -m needed); tests/test_config.py
# holds conf/ to it.
MODE_GROUP = "hparams_search"
_composed_mode = Hydra.get_mode  # Hydra's own, which composes


def mode_from_the_command_line() -> None:
    """Before @hydra.main runs: Hydra finds whether a start is a run or a sweep (hydra.mode) by
    composing the whole config once more, only to read that key (hydra-ecosystem/hydra#3440): a
    tenth of a CPU-second at every start, every rank's under torchrun or SLURM. Here the command
    line says it: -m, hydra.mode=..., or an hparams_search=... (whose file sets the key, so then
    Hydra composes to read it, as before)."""
    Hydra.get_mode = _mode_on_the_command_line


def _mode_on_the_command_line(hydra: Hydra, config_name: str | None, overrides: list[str]) -> RunMode | None:
    """Hydra.get_mode's answer, composed only for a search: the mode the last hydra.mode=... override
    names, else None, which leaves it to -m. An override that does not parse, or names no mode, is
    None too, as get_mode's failed composition was: the run's own composition then says what is wrong."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        given = [o.value() for o in parsed if o.key_or_group == "hydra.mode"]
        if given:
            return EnumNode.validate_and_convert_to_enum(RunMode, given[-1])
    except Exception:
        return None
    if any(o.key_or_group == MODE_GROUP for o in parsed):
        return _composed_mode(hydra, config_name, overrides)
    return None


def compose(*overrides: str, hydra: bool = False) -> DictConfig:
    """The config `python train.py *overrides` composes (with `hydra`, its hydra node too); also
    from within train.py's main(), which runs with Hydra initialised on the same config dir."""
    register()
    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def load(*overrides: str) -> Config:
    """compose(), typed: what a worker's RunConfig is made of."""
    return OmegaConf.to_object(compose(*overrides))
