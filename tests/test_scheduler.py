"""scheduler.warmup_epochs' Warmup on its edges: one warmup step, its exact end, a warmup that
outlasts its epochs, its state without an epoch scheduler, and with_warmup's count of steps
(test_recipes.py holds the common cases)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from config.schema import SchedulerOptions, TrainerConfig
from training.scheduler import Warmup, with_warmup

# These drive the schedule alone, with no optimizer step between, which torch's scheduler warns of.
NO_STEPS = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")


def _sgd(lr: float = 1.0) -> torch.optim.SGD:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


def _lr(optimizer: torch.optim.Optimizer) -> float:
    return optimizer.param_groups[0]["lr"]


def test_a_one_step_warmup_reaches_the_lr_after_that_step():
    optimizer = _sgd(0.4)
    warmup = Warmup(optimizer, None, start_factor=0.5, epochs=1, steps=1)
    assert _lr(optimizer) == pytest.approx(0.2)
    warmup.step_update(1)
    assert _lr(optimizer) == 0.4 and warmup.get_last_lr() == [0.4]


def test_the_warmup_ends_at_the_lr_exactly():
    # start + (1 - start) * k / k misses 1 by an ulp for some (start, k), 0.01 and 3 among them.
    optimizer = _sgd(0.3)
    Warmup(optimizer, None, start_factor=0.01, epochs=1, steps=3).step_update(3)
    assert _lr(optimizer) == 0.3


@NO_STEPS
def test_the_epoch_scheduler_starts_from_the_lr_not_from_a_warmup_cut_short():
    # A warmup of more steps than its epochs held (a resume with fewer batches an epoch): the epoch
    # scheduler (chainable: it multiplies the lr it finds) must take the lr warmup leads to.
    optimizer = _sgd()
    step_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    warmup = Warmup(optimizer, step_lr, start_factor=0.1, epochs=1, steps=100)
    warmup.step_update(1)
    warmup.step()
    warmup.step()  # warmup's epoch is behind it: StepLR halves the lr, still scaled by step 1's factor
    assert _lr(optimizer) == pytest.approx(0.5 * (0.1 + 0.9 / 100))


def test_a_warmup_without_an_epoch_scheduler_saves_and_restores_its_state():
    optimizer = _sgd()
    warmup = Warmup(optimizer, None, start_factor=0.5, epochs=2, steps=4)
    warmup.step_update(3)
    state = warmup.state_dict()
    assert state["after"] is None
    restored_optimizer = _sgd()
    Warmup(restored_optimizer, None, start_factor=0.5, epochs=2, steps=4).load_state_dict(state)
    assert _lr(restored_optimizer) == _lr(optimizer) == pytest.approx(0.875)


@pytest.mark.parametrize(
    "settings, batches, steps",
    [
        (TrainerConfig(limit_train_batches=3, accumulate_grad_batches=2), 10, 2 * 2),  # 3 micro-batches: 2 steps
        (TrainerConfig(limit_train_batches=30), 10, 2 * 10),  # a limit above the loader's length cuts nothing
        (TrainerConfig(overfit_batches=1, limit_train_batches=3), 10, 2 * 1),  # overfit_batches wins
    ],
)
def test_with_warmup_counts_the_steps_the_trainer_takes(settings, batches, steps):
    optimizer = _sgd()
    warmup = with_warmup(optimizer, None, SchedulerOptions(warmup_epochs=2, warmup_start_factor=0.5), settings, batches)
    warmup.step_update(1)
    assert _lr(optimizer) == pytest.approx(0.5 + 0.5 / steps)


@NO_STEPS
def test_with_warmup_hands_over_to_the_scheduler_it_was_given():
    optimizer = _sgd()
    step_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    assert with_warmup(optimizer, step_lr, SchedulerOptions(), TrainerConfig(), 4) is step_lr  # no warmup asked
    warmup = with_warmup(optimizer, step_lr, SchedulerOptions(warmup_epochs=1), TrainerConfig(), 1)
    warmup.step_update(1)
    warmup.step()
    warmup.step()
    assert _lr(optimizer) == pytest.approx(0.5)
