"""trainer.ema_decay: an exponential moving average of the weights and buffers (torchvision's
ExponentialMovingAverage: torch.optim.swa_utils.AveragedModel with use_buffers=True), built with
the decay per update that TrainerConfig.ema_decay_per_update adjusts."""

from __future__ import annotations

from collections import defaultdict
from itertools import chain

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class EMA(AveragedModel):
    """The averaged copy lives on the model's device, one per rank (DDP's replicas are equal, so
    are their averages). During scheduler.warmup_epochs it copies the weights (torchvision resets
    n_averaged there), so the average starts from trained weights, not the random ones."""

    def __init__(self, model: nn.Module, decay: float, warmup_epochs: int = 0) -> None:
        # No device argument: the copy stays on the model's device and n_averaged on the CPU,
        # where reading it costs no device sync.
        super().__init__(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.warmup_epochs = warmup_epochs

    @torch.no_grad()
    def update_parameters(self, model: nn.Module, epoch: int = 0) -> None:
        """AveragedModel.update_parameters' math without its n_averaged.to(device), a blocking copy
        (a device sync) on every update on CUDA."""
        mine = [t.detach() for t in chain(self.module.parameters(), self.module.buffers())]
        theirs = [t.detach() for t in chain(model.parameters(), model.buffers())]
        if int(self.n_averaged) == 0:
            torch._foreach_copy_(mine, theirs)
        else:
            by_dtype: dict[torch.dtype, tuple[list, list]] = defaultdict(lambda: ([], []))
            for averaged, current in zip(mine, theirs):
                by_dtype[averaged.dtype][0].append(averaged)
                by_dtype[averaged.dtype][1].append(current)
            for averaged, current in by_dtype.values():
                self.multi_avg_fn(averaged, current, self.n_averaged)
        if epoch < self.warmup_epochs:
            self.n_averaged.zero_()
        else:
            self.n_averaged += 1
