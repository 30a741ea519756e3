"""The criterion (conf/loss/): one object that training minimises and validation reports as `val/loss`.

Built from `loss._target_` by Hydra (a factory in RunConfig.loss, called once per rank). Validation
also reports plain cross-entropy (`val/ce`), so runs trained with different losses stay comparable.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class Criterion(Protocol):
    """What the Trainer calls for training's loss and for validation's.

    `logits`: N x C class scores, in autocast's dtype when mixed. `targets`: either hard targets,
    N class indices (int64), or soft targets, N x C float probabilities that sum to 1 per row
    (MixUp and CutMix make these for training: training/mixing.py). Validation always passes hard
    targets. `reduction`: "mean" (training: one scalar, the mean over the N samples) or "none"
    (validation: N per-sample losses, which it sums in float64 across batches and ranks). The
    result is float32 or wider, whatever the logits' dtype: compute in float32 under autocast.
    """

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor: ...


class CrossEntropy:
    """torch's cross-entropy: with `label_smoothing` s, each target is (1 - s) x itself + s spread
    over all classes (trainer.label_smoothing), hard and soft targets alike."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = _smoothing(label_smoothing)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing, reduction=reduction)


class FocalLoss:
    """Focal loss (Lin et al., 2017), multi-class: -sum_c q_c (1 - p_c)^gamma log p_c over the
    target distribution q (the one-hot label, a soft target, either smoothed as CrossEntropy smooths
    it). Samples the model already gets right weigh less; gamma=0 is CrossEntropy."""

    def __init__(self, gamma: float = 2.0, label_smoothing: float = 0.0) -> None:
        if gamma < 0:
            raise ValueError(f"gamma={gamma}: use 0 (cross-entropy) or more")
        self.gamma, self.label_smoothing = gamma, _smoothing(label_smoothing)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        log_p = F.log_softmax(logits, dim=1, dtype=torch.float32)
        q = targets.float() if targets.is_floating_point() else F.one_hot(targets, logits.shape[1]).float()
        if self.label_smoothing:
            q = q * (1 - self.label_smoothing) + self.label_smoothing / logits.shape[1]
        losses = -(q * (1 - log_p.exp()).pow(self.gamma) * log_p).sum(dim=1)
        return losses.mean() if reduction == "mean" else losses


def _smoothing(value: float) -> float:
    if not 0 <= value < 1:
        raise ValueError(f"label_smoothing={value}: use 0 (off) up to below 1")
    return value
