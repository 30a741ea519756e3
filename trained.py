"""A trained run read back, for predict.py and export.py: the checkpoint a run dir or a path names,
the config it trained with (the resolved copy every checkpoint carries), its weights (the model's or
the EMA's; a whole file, or strategy=fsdp's sharded last.pt), its manifest and class names, and the
model built from them. Above the layers, as preflight.py is: it types the saved config with OmegaConf."""

from __future__ import annotations

import argparse
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

import data
from config import setup
from config.schema import DataConfig, DatasetConfig
from errors import ConfigError, first_line
from training.checkpoint.files import run_dir_of

WEIGHTS = ("best", "model", "ema")  # best: best_weights(checkpoint)
_FIX = "give a run dir, or a checkpoint train.py wrote (<run dir>/checkpoints/best.pt or last.pt)"


@dataclass
class Trained:
    path: Path  # the checkpoint read
    run_dir: Path  # the run it belongs to (where its checkpoints/ folder lies)
    dataset: DatasetConfig  # as the run trained: its sizes, channels, normalisation
    data: DataConfig
    trainer: dict[str, Any]  # the run's trainer keys, as saved
    model: nn.Module  # its weights loaded, in eval mode, on the CPU
    weights: str  # which: model or ema
    class_names: list[str]
    manifest: dict[str, Any] | None  # training.manifest's record; None for a checkpoint from before it


def checkpoint_path(source: str | Path) -> Path:
    """`source` itself (a checkpoint file, or strategy=fsdp's sharded directory), or, for a run dir
    (or its checkpoints/ folder), its checkpoints/best.pt (the best epoch's weights), else its last.pt."""
    source = Path(source)
    if (run_dir := run_dir_of(source)) is not None:
        for name in ("best.pt", "last.pt"):
            if (run_dir / "checkpoints" / name).exists():
                return run_dir / "checkpoints" / name
        raise ConfigError(f"{run_dir}: no checkpoints/best.pt or last.pt in it; {_FIX}")
    if source.is_dir() and not _sharded(source):
        if runs := _runs_in(source):
            shown = ", ".join(str(run) for run in runs[:3]) + (f", ... {len(runs) - 3} more" if len(runs) > 3 else "")
            raise ConfigError(
                f"{source}: holds {len(runs)} runs, not one; give one of them ({shown}); "
                f"python -m bench.report {source} compares them"
            )
        raise ConfigError(f"{source}: neither a run dir (no checkpoints/ in it) nor a sharded checkpoint; {_FIX}")
    if not source.exists():
        raise ConfigError(f"{source}: no such file or run dir; {_FIX}")
    return source


def _runs_in(folder: Path) -> list[Path]:
    """The run dirs a folder of runs holds: a -m sweep's jobs, a day's runs (outputs/<date>), two
    levels down at most. What a user gives after a sweep, where a run was asked for."""
    found = {path.parent for pattern in ("*/checkpoints", "*/*/checkpoints") for path in folder.glob(pattern)}
    return sorted((run for run in found if run_dir_of(run) == run), key=lambda run: setup.job_order(str(run)))


def load(source: str | Path, weights: str = "best") -> Trained:
    """The run `source` names, its model built and loaded with `weights` (WEIGHTS)."""
    path = checkpoint_path(source)
    checkpoint, state = _read(path)
    saved = _saved_config(checkpoint, path)
    chosen = best_weights(checkpoint) if weights == "best" else weights
    if chosen == "ema":
        if checkpoint.get("ema") is None:
            if weights == "ema":
                raise ConfigError(
                    f"{path}: holds no EMA weights (trained without trainer.ema_decay); use --weights model"
                )
            chosen = "model"
        else:
            # AveragedModel's state: the averaged module's under module., and its update count
            state = {k.removeprefix("module."): v for k, v in checkpoint["ema"].items() if k != "n_averaged"}
    dataset = _typed(DatasetConfig, saved.get("dataset"), path, "dataset")
    model = _model(saved.get("model"), path)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(
            f"{path}: its {chosen} weights do not fit the model its config builds ({first_line(e)})"
        ) from None
    manifest = checkpoint.get("manifest") or None
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return Trained(
        path=path,
        run_dir=run_dir,
        dataset=dataset,
        data=_typed(DataConfig, saved.get("data") or {}, path, "data"),
        trainer=saved.get("trainer") or {},
        model=model.eval(),
        weights=chosen,
        class_names=_class_names(manifest, dataset),
        manifest=manifest,
    )


def best_weights(checkpoint: dict[str, Any]) -> str:
    """Whose weights, the model's or the EMA's, scored the figure the run ranks its checkpoints by
    (trainer.checkpoint.monitor) at this checkpoint's validation; else (a save between validations,
    or a checkpoint from before the ranking) those that scored the run's best accuracy."""
    kept = (checkpoint.get("best_checkpoints") or {}).get("kept", [])
    at = (checkpoint.get("epoch"), checkpoint.get("step"))
    own = next((entry["weights"] for entry in kept if (entry["epoch"], entry["step"]) == at), None)
    return own or checkpoint.get("best_weights", "model")


def _sharded(path: Path) -> bool:
    """strategy=fsdp's last.pt: a torch.distributed.checkpoint directory (through its symlink)."""
    if not path.is_dir():
        return False
    from training.checkpoint.sharded import METADATA  # late: it imports torch.distributed.checkpoint, slow

    return (path / METADATA).is_file()


def _read(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(the checkpoint's train state, config and manifest, its model's weights) from a whole file or
    a sharded directory, as plain CPU tensors; loaded with weights_only=True, as resuming does."""
    # torch's words for these files advise re-saving a checkpoint, or call it corrupted.
    if path.is_file() and path.suffix in (".pt2", ".onnx"):
        raise ConfigError(
            f"{path}: a model export.py wrote, not a checkpoint; give the run dir it was exported from "
            "(its metadata's checkpoint)"
        )
    if path.is_file() and not zipfile.is_zipfile(path):
        why = "not a zip archive as torch.save writes: another kind of file, or a truncated copy"
        raise ConfigError(f"{path}: not a loadable checkpoint ({why}); {_FIX}")
    try:
        if _sharded(path):
            from training.checkpoint import sharded  # late: torch.distributed.checkpoint is slow to import

            checkpoint = sharded.read_whole(path)
            return checkpoint, checkpoint["model"]
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # the optimizer state unread
    except Exception as e:  # torch raises several types for a truncated, corrupt or foreign file
        detail = str(e).split("WeightsUnpickler error:")[-1].strip()  # torch's advice comes first
        reason = detail.splitlines()[0] if detail else type(e).__name__
        raise ConfigError(f"{path}: not a loadable checkpoint ({reason}); {_FIX}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise ConfigError(f"{path}: not a checkpoint train.py wrote (no model weights); {_FIX}")
    return checkpoint, checkpoint["model"]


def _saved_config(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    """The resolved config the run trained with, from the checkpoint (every train.py checkpoint
    carries it), else from its run dir's .hydra/config.yaml (unresolved: it must need no interpolation)."""
    text = checkpoint.get("config")
    where = f"{path}'s config"
    if not isinstance(text, str):
        recorded = (path.parent.parent if path.parent.name == "checkpoints" else path.parent) / ".hydra" / "config.yaml"
        if not recorded.is_file():
            raise ConfigError(f"{path}: carries no config, and no .hydra/config.yaml lies beside it; {_FIX}")
        text, where = recorded.read_text(), str(recorded)
    setup.register()  # the resolvers a .hydra/config.yaml names
    try:
        saved = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as e:  # YAML errors, an interpolation that needs Hydra's run
        raise ConfigError(f"{where}: unreadable ({first_line(e)}); {_FIX}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) or "dataset" not in saved:
        raise ConfigError(f"{where}: no model and dataset in it; {_FIX}")
    return saved


def _typed(cls: type, node: Any, path: Path, key: str) -> Any:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), node))
    except Exception as e:  # a key this code's schema dropped, or a value it now refuses
        raise ConfigError(
            f"{path}: its {key} config does not fit this code ({first_line(e)}); use the commit it trained with "
            "(its manifest's)"
        ) from None


def _model(node: dict[str, Any], path: Path) -> nn.Module:
    """The run's model, built as training built it, without model.weights (its starting point, which
    the checkpoint's weights replace)."""
    node = {**node, "weights": None} if "weights" in node else node
    try:
        return instantiate(node, _convert_="all")
    except Exception as e:
        raise ConfigError(
            f"{path}: its model ({node.get('_target_')}) cannot be built here ({first_line(e)})"
        ) from None


def _class_names(manifest: dict[str, Any] | None, dataset: DatasetConfig) -> list[str]:
    """As the run recorded them; for a checkpoint from before manifests, as the dataset names them
    (data.class_names: an image folder needs its files), else the labels' numbers."""
    count = dataset.num_classes
    names = (manifest or {}).get("class_names")
    if isinstance(names, list) and len(names) == count:
        return [str(name) for name in names]
    try:
        names = data.class_names(dataset)
    except ConfigError:  # the dataset's files are not here
        names = []
    return names if len(names) == count else [str(label) for label in range(count)]


def metadata(trained: Trained) -> dict[str, Any]:
    """What someone without this repo needs to feed the model and read its output."""
    dataset = trained.dataset
    size = dataset.val_crop or dataset.image_size
    return {
        "class_names": trained.class_names,
        "input": f"float32 N x {dataset.channels} x {size} x {size}: pixels / 255, minus mean, divided by std, per channel",
        "channels": dataset.channels,
        "image_size": size,
        "resize": dataset.val_resize
        or dataset.resize
        or dataset.image_size,  # the shorter side, before the centre crop
        "mean": dataset.mean or [0.0] * dataset.channels,
        "std": dataset.std or [1.0] * dataset.channels,
        "output": "logits N x classes (a model ending in log_softmax: log-probabilities); softmax gives probabilities",
        "weights": trained.weights,
        "checkpoint": str(trained.path),
        "commit": (trained.manifest or {}).get("commit"),
    }


def source_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A command line that starts, as predict.py's and export.py's do, with the run to use and whose weights."""
    parse = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parse.add_argument(
        "source",
        help="a run dir (its checkpoints/best.pt, else last.pt), or a checkpoint: "
        "best.pt, last.pt, strategy=fsdp's sharded last.pt",
    )
    parse.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="best",
        help="the model's or the EMA's (trainer.ema_decay) weights; best (default): those that scored "
        "the run's trainer.checkpoint.monitor at this checkpoint (else the run's best accuracy)",
    )
    return parse
