"""A trained run read back, for predict.py and export.py: its weights (training.checkpoint.weights:
the model's or the EMA's, from a run dir or a checkpoint), the config it trained with (the resolved
copy every checkpoint carries), its manifest and class names, and the model built from them. Above
the layers, as preflight.py is: it types the saved config with OmegaConf."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

import data
from config import setup
from config.schema import DataConfig, DatasetConfig
from errors import ConfigError, first_line
from training.checkpoint.weights import FIX, WEIGHTS, checkpoint_path, chosen_weights, read


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


def load(source: str | Path, weights: str = "best") -> Trained:
    """The run `source` names, its model built and loaded with `weights` (WEIGHTS)."""
    path = checkpoint_path(source)
    checkpoint = read(path)
    saved = _saved_config(checkpoint, path)
    if weights == "ema" and checkpoint.get("ema") is None:
        raise ConfigError(f"{path}: holds no EMA weights (trained without trainer.ema_decay); use --weights model")
    chosen, state = chosen_weights(checkpoint, weights)
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


def _saved_config(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    """The resolved config the run trained with, from the checkpoint (every train.py checkpoint
    carries it), else from its run dir's .hydra/config.yaml (unresolved: it must need no interpolation)."""
    text = checkpoint.get("config")
    where = f"{path}'s config"
    if not isinstance(text, str):
        recorded = (path.parent.parent if path.parent.name == "checkpoints" else path.parent) / ".hydra" / "config.yaml"
        if not recorded.is_file():
            raise ConfigError(f"{path}: carries no config, and no .hydra/config.yaml lies beside it; {FIX}")
        text, where = recorded.read_text(), str(recorded)
    setup.register()  # the resolvers a .hydra/config.yaml names
    try:
        saved = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as e:  # YAML errors, an interpolation that needs Hydra's run
        raise ConfigError(f"{where}: unreadable ({first_line(e)}); {FIX}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) or "dataset" not in saved:
        raise ConfigError(f"{where}: no model and dataset in it; {FIX}")
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
