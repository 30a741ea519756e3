"""trainer.mixup_alpha / cutmix_alpha: torchvision.transforms.v2's MixUp and CutMix on a training
batch already on its device (both loaders), one of the two per batch when both are on."""

from __future__ import annotations

import torch

from config.schema import TrainerConfig
from distributed.context import epoch_seed


class Mixing:
    """The transforms draw from torch's global CPU generator; each batch forks it and seeds it
    from (seed, epoch, rank, batch). So a resumed run mixes its batches as an unbroken one does,
    and dropout's stream is left as it would be without mixing."""

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, num_classes: int, seed: int, rank: int) -> None:
        from torchvision.transforms import v2

        choices = [v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)] if mixup_alpha > 0 else []
        choices += [v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)] if cutmix_alpha > 0 else []
        self.transform = choices[0] if len(choices) == 1 else v2.RandomChoice(choices)
        self.seed, self.rank = seed, rank
        self._epoch, self._epoch_seed = -1, 0

    @classmethod
    def of(cls, settings: TrainerConfig, num_classes: int, rank: int) -> Mixing | None:
        if settings.mixup_alpha <= 0 and settings.cutmix_alpha <= 0:
            return None
        return cls(settings.mixup_alpha, settings.cutmix_alpha, num_classes, settings.seed, rank)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, epoch: int, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mixed images, soft targets N x classes (which the criterion takes: training/loss.py),
        each sample's dominant label: what train accuracy counts against). No host sync: the draws
        are CPU scalars."""
        if epoch != self._epoch:
            self._epoch, self._epoch_seed = epoch, epoch_seed(self.seed, epoch, self.rank)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(self._epoch_seed + batch)
            images, targets = self.transform(images, labels)
        return images, targets, targets.argmax(dim=1)
