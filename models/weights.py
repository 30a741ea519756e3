"""model.weights: a local state_dict file (compute nodes have no internet) loaded into a model
that is already built for the dataset, so a file from any number of classes fits."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from errors import ConfigError

log = logging.getLogger("train")

_FIX = "give a state_dict file saved with torch.save(model.state_dict(), path)"


def load_matching(model: nn.Module, path: str, unused: tuple[str, ...] = ()) -> None:
    """Every tensor whose shape fits is loaded; one shaped for another number of classes or channels
    (a head, a stem) keeps its fresh initialisation, with a warning. Refused as `check_fits` refuses."""
    loaded, fresh = _fitting_file(model, path, unused)
    if fresh:
        log.warning(
            "model.weights: %s kept fresh (shaped for another number of classes, channels or stem)", ", ".join(fresh)
        )
    model.load_state_dict(loaded, strict=False)


def check_fits(model: nn.Module, path: str, unused: tuple[str, ...] = ()) -> None:
    """Before launch: the file is a state_dict of this architecture. A key this architecture lacks, or
    lacking one it has, is an error. Keys starting with `unused` are dropped from the file unread.
    Quiet about tensors kept fresh: the build says so, once, in the run's log."""
    _fitting_file(model, path, unused)


def fitting(model: nn.Module, saved: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The tensors of `saved` that fit `model`, and the keys of those shaped otherwise, which keep
    their fresh initialisation. Raises ValueError naming the first key that one has and the other lacks."""
    own = model.state_dict()
    if set(saved) != set(own):
        missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise ValueError(f"lacks {missing[0]}" if missing else f"has {extra[0]}, which it lacks")
    fresh = [key for key, tensor in saved.items() if tensor.shape != own[key].shape]
    return {key: tensor for key, tensor in saved.items() if key not in fresh}, fresh


def _fitting_file(model: nn.Module, path: str, unused: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], list[str]]:
    try:
        return fitting(model, {key: tensor for key, tensor in _read(path).items() if not key.startswith(unused)})
    except ValueError as e:
        raise ConfigError(
            f"model.weights={path} is not a state_dict of this architecture ({e}); give the file of the model.arch "
            "it was saved from"
        ) from None


def _read(path: str) -> dict[str, torch.Tensor]:
    try:
        saved = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for pickled modules, truncated or foreign files
        raise ConfigError(
            f"model.weights={path}: torch.load(weights_only=True) cannot read it ({type(e).__name__}); {_FIX}"
        ) from None
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        raise ConfigError(
            f"model.weights={path} is a train.py checkpoint, not a state_dict; start a run from its weights with "
            f"trainer.init_from={path} instead, or continue it with trainer.resume={path}"
        )
    if not isinstance(saved, dict) or not all(isinstance(tensor, torch.Tensor) for tensor in saved.values()):
        raise ConfigError(f"model.weights={path} holds a {type(saved).__name__}, not a state_dict; {_FIX}")
    return saved
