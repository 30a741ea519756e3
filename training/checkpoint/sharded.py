"""strategy=fsdp's checkpoints: last.pt sharded, best.pt whole.

    checkpoints/
      last.pt -> last.pt.step120.3fa9c1      a symlink, swapped atomically
      last.pt.step120.3fa9c1/                a torch.distributed.checkpoint directory:
        .metadata                            shapes, dtypes, which file holds which shard
        __0_0.distcp  __1_0.distcp ...       each rank's shards; rank 0's also the train state
      best.pt                                one file, the unwrapped model: loads under any strategy
      .last.pt.shards.tmp/                   only while a save is under way, or after a kill in one

Every rank writes its shards of last.pt into `.last.pt.shards.tmp` (not the whole-file save's
`.last.pt.tmp`, which a run killed under another strategy may have left); once all have (DCP's
save returns on rank 0 after the last rank's files and the metadata are fsynced), rank 0 renames
the directory to its own name and points last.pt at it by renaming a new symlink over the old
one: a kill at any moment leaves last.pt naming a whole checkpoint, so trainer.resume=auto never
reads a half-written one. best.pt costs a gather of the whole model and optimizer state to rank
0's host memory, once per epoch that improves.

Model and optimizer state across ranks, through torch.distributed.checkpoint (DCP).

A sharded checkpoint is a DCP directory: every rank writes its own shards of the model and the
optimizer state, and rank 0 the replicated rest (buffers, the train state); DCP reshards on load,
so it resumes at any world size, under any strategy. `get_state_dict` names everything by its
plain module path, so the keys are those of the unwrapped model whatever wraps it.

DCP unpickles two things: its `.metadata` (plain pickle) and every non-tensor value (torch.load
with weights_only=False). Both are read here with allowlists instead, so a sharded checkpoint,
like a file one, can carry tensors and primitives but never code.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from distributed.context import DistContext
from errors import ConfigError, first_line
from training.checkpoint.files import FIX, drop_unnamed_versions, fsync_dir


def commit(tmp: Path, final: Path, version: str) -> None:
    """Rename the written directory to `version` and point `final` at it, atomically; then drop
    the versions nothing points at any more."""
    directory = final.parent
    fsync_dir(tmp)
    os.rename(tmp, directory / version)
    link = directory / f".{final.name}.link"
    link.unlink(missing_ok=True)
    os.symlink(version, link)  # relative: the run dir can be moved or copied whole
    os.replace(link, final)
    fsync_dir(directory)
    drop_unnamed_versions(final, named=version)


METADATA = ".metadata"  # DCP writes it last, once every rank's shards are written
_TRAIN_STATE = "train_state"  # epoch, step, RNG states, scheduler...: one torch.save blob, from rank 0


def save(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, train_state: dict[str, Any], ctx: DistContext
) -> None:
    """Every rank writes its shards into the directory `path` (which must exist); returns on rank 0
    only once every rank's files are written and fsynced and the metadata is in place."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    blob = io.BytesIO()
    torch.save(train_state, blob)
    state = {"model": model_state, "optimizer": optimizer_state, _TRAIN_STATE: blob.getvalue()}
    with warnings.catch_warnings():  # no process group: DCP warns that it writes alone
        warnings.simplefilter("ignore", UserWarning)
        # Replicated values (BatchNorm statistics, the train state) come from rank 0, as DDP's do.
        dcp.save(
            state,
            storage_writer=FileSystemWriter(path),
            no_dist=not ctx.distributed,
            planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),
        )


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> dict[str, Any]:
    """Read the checkpoint directory `path` into `model` and `optimizer` in place (resharded to
    this world size; whole tensors for an unsharded model); return its train state.

    Every rank of the group calls this. The optimizer's state is created first (DCP loads into
    tensors of the right shapes): one step of zero gradients at lr 0, overwritten by the load.
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, _TRAIN_STATE: b""}
    with warnings.catch_warnings():  # no process group (single, dp): DCP warns that it reads alone
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=_Reader(path), planner=_Planner(), no_dist=not ctx.distributed)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return _train_state(state[_TRAIN_STATE])


def describe(path: Path) -> dict[str, Any]:
    """What training.checkpoint.resume.decide_resume asks of a checkpoint, without loading its tensors or a
    process group: the train state, and the model's tensors as meta tensors of their full shapes."""
    metadata = read_metadata(path)
    if _TRAIN_STATE not in metadata.state_dict_metadata:
        raise ConfigError(f"trainer.resume={path}: not a train.py checkpoint (no {_TRAIN_STATE}); {FIX}")
    state: dict[str, Any] = {_TRAIN_STATE: b""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(state, storage_reader=_Reader(path), planner=_Planner(), no_dist=True)
        except Exception as e:  # a shard file missing or cut short
            raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({first_line(e)}); {FIX}") from None
    optimizer = {key for key in metadata.state_dict_metadata if key.startswith("optimizer.")}
    model = _model_tensors(metadata)
    return {**_train_state(state[_TRAIN_STATE]), "model": model, **({"optimizer": optimizer} if optimizer else {})}


def read_whole(path: Path) -> dict[str, Any]:
    """The checkpoint as one process reads a whole-file one: its train state and the whole model's
    weights as plain CPU tensors (the optimizer state unread): to evaluate or use its weights."""
    checkpoint = describe(path)
    checkpoint.pop("optimizer", None)  # describe's: the names of its shards
    return {**checkpoint, "model": read_model_state(path)}


def read_model_state(path: Path | str) -> dict[str, torch.Tensor]:
    """The whole model of a sharded checkpoint as plain CPU tensors, read by this one process
    (no process group, no model needed): to compare or convert a checkpoint."""
    path = Path(path)
    tensors = _model_tensors(read_metadata(path))
    state = {"model": {name: torch.empty(t.shape, dtype=t.dtype) for name, t in tensors.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=_Reader(path), planner=_Planner(), no_dist=True)
    return state["model"]


def _model_tensors(metadata: Metadata) -> dict[str, torch.Tensor]:
    """The model's tensors in the metadata, as meta tensors of their full shapes."""
    return {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype, device="meta")
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }


def read_metadata(path: Path | str) -> Metadata:
    """The directory's DCP metadata; a one-line ConfigError if it has none or a foreign one."""
    try:
        with open(Path(path) / METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        what = (
            f"no {METADATA}: a directory torch.distributed.checkpoint did not finish writing"
            if any(Path(path).glob("*.distcp"))
            else "a folder with no checkpoint in it"
        )
        raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({what}); {FIX}") from None
    except pickle.UnpicklingError as e:
        raise ConfigError(f"trainer.resume={path}: refused, {e}; {FIX}") from None
    except Exception as e:
        raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({first_line(e)}); {FIX}") from None
    if not isinstance(metadata, Metadata):
        raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({METADATA} holds no DCP metadata); {FIX}")
    return metadata


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole model and optimizer state gathered on rank 0's CPU (the other ranks get empty
    dicts), in the unwrapped model's own format: optimizer state indexed as optimizer.state_dict()
    indexes it, so it loads under every strategy. Every rank calls this."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if not optimizer_state:
        return model_state, optimizer_state
    order = [name for group in optimizer_state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return model_state, {
        "state": {index[name]: value for name, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [index[n] for n in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }


def load_full(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optimizer_state: dict[str, Any]
) -> None:
    """Load a whole (file) checkpoint, which every rank holds, into a sharded model and optimizer:
    each rank keeps its own shards."""
    names = {param: name for name, param in model.named_parameters()}
    order = [names[p] for group in optimizer.param_groups for p in group["params"]]
    by_name = {
        "state": {order[i]: value for i, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }
    _load_full_model(model, model_state)
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _load_full_model(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """set_model_state_dict(full_state_dict=True)'s work (torch/distributed/_state_dict_utils.py,
    _distribute_state_dict), except that each tensor goes to the device of the tensor it replaces:
    torch's sends all to one and refuses a model on two ("Multiple devices found"), which is what
    strategy.cpu_offload makes of a model with buffers: shards in host memory, BatchNorm's
    statistics on the GPU."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    local = model.state_dict()
    for key, target in local.items():
        value = full[key].detach()
        if isinstance(target, DTensor):  # a parameter's shard: this rank's part of the whole
            local[key] = distribute_tensor(value, target.device_mesh, target.placements)
        elif isinstance(target, torch.Tensor):
            local[key] = value.to(target.device)
    model.load_state_dict(local)


def gathered_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model state on every rank (plain tensors): what replicas compare."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _train_state(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)


class _Planner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor values with weights_only=True."""

    def create_local_plan(self):
        # An optimizer setting the saving run lacked (the initial_lr a scheduler adds) keeps this
        # run's value, as optimizer.load_state_dict does; a missing tensor still fails.
        saved = self.metadata.state_dict_metadata
        for key in [k for k in self.state_dict if k.startswith("optimizer.param_groups.") and k not in saved]:
            del self.state_dict[key]
        return super().create_local_plan()

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _Reader(FileSystemReader):
    """DCP's reader, unpickling the metadata through an allowlist."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(Path(self.path) / METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


# What DCP's metadata pickles: its own classes, shapes, dtypes, layouts and the path it was
# written to. Nothing else, not even another name those modules import.
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        found = super().find_class(module, name) if module in _METADATA_MODULES or module == "torch" else None
        if module == "torch" and isinstance(found, torch.dtype):
            return found
        if isinstance(found, type) and found.__module__ == module:  # a class DCP defines there
            return found
        raise pickle.UnpicklingError(f"its {METADATA} holds a pickled Python object ({module}.{name})")
