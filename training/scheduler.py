"""scheduler.warmup_epochs: a linear warmup stepped every optimizer step, in front of any epoch
scheduler (cosine, step, or none), which starts when warmup ends: torchvision's
SequentialLR([LinearLR, main], milestones=[warmup_epochs]), but smooth within the epochs."""

from __future__ import annotations

import math
from typing import Any

import torch

from config.schema import SchedulerOptions, TrainerConfig


class Warmup:
    """Owns the epoch scheduler; the Trainer calls `step()` at each epoch's end, as it would the
    scheduler's, and `step_update(step)` after every optimizer step."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, after: Any, start_factor: float, epochs: int, steps: int
    ) -> None:
        """`after`: the epoch scheduler (None: a constant lr); `steps`: optimizer steps of warmup."""
        self.optimizer, self.after = optimizer, after
        self.start_factor, self.epochs, self.steps = start_factor, epochs, max(1, steps)
        self.target = [group["lr"] for group in optimizer.param_groups]  # the lr warmup leads to
        self.epoch = 0
        self.step_update(0)

    def factor(self, step: int) -> float:
        if step >= self.steps:
            return 1.0
        return self.start_factor + (1.0 - self.start_factor) * step / self.steps

    def step_update(self, step: int) -> None:
        """`step` optimizer steps are done: set the next one's lr. A function of `step` alone,
        so a resumed run continues with the lr an unbroken one has."""
        factor = self.factor(step)
        for group, lr in zip(self.optimizer.param_groups, self.target):
            group["lr"] = lr * factor
        self.last_step = step

    def step(self) -> None:
        """An epoch ended: the epoch scheduler advances once warmup's epochs are behind it."""
        self.epoch += 1
        if self.after is not None and self.epoch > self.epochs:
            for group, lr in zip(self.optimizer.param_groups, self.target):
                group["lr"] = lr  # chainable schedulers (cosine, step) compute from the lr they set last
            self.after.step()
            self.target = [group["lr"] for group in self.optimizer.param_groups]
        self.step_update(self.last_step)

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "epoch": self.epoch,
            "last_step": self.last_step,
            "after": self.after.state_dict() if self.after is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target, self.epoch = list(state["target"]), state["epoch"]
        if self.after is not None:
            self.after.load_state_dict(state["after"])
        self.step_update(state["last_step"])


def with_warmup(
    optimizer: torch.optim.Optimizer, scheduler: Any, schedule: SchedulerOptions, settings: TrainerConfig, batches: int
) -> Any:
    """`scheduler` behind a warmup of scheduler.warmup_epochs (none: `scheduler` itself). `batches`:
    the training loader's length, cut as the Trainer cuts it (overfit/limit_train_batches)."""
    if not schedule.warmup_epochs:
        return scheduler
    limit = settings.overfit_batches or settings.limit_train_batches
    per_epoch = math.ceil((batches if limit is None else min(batches, limit)) / settings.accumulate_grad_batches)
    epochs = schedule.warmup_epochs
    return Warmup(optimizer, scheduler, schedule.warmup_start_factor, epochs, epochs * per_epoch)
