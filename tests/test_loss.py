"""The criterion (training/loss.py): hard and soft targets, focal against cross-entropy, label
smoothing under autocast, and the loss group's options reaching it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from preflight import check_and_plan
from tests.configs import job_config, typed_config
from tests.test_train_step import _trainer
from training.loss import CrossEntropy, FocalLoss

LOGITS = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [-1.0, 2.5, 0.0]])
LABELS = torch.tensor([0, 1, 1])


def _smoothed(labels: torch.Tensor, s: float, classes: int = 3) -> torch.Tensor:
    return F.one_hot(labels, classes).float() * (1 - s) + s / classes


@pytest.mark.parametrize(
    "criterion",
    [CrossEntropy(), CrossEntropy(0.2), FocalLoss(2.0), FocalLoss(0.5, 0.1)],
    ids=["ce", "ce_smoothed", "focal", "focal_smoothed"],
)
def test_hard_targets_are_their_one_hot_soft_targets_and_none_keeps_one_loss_per_sample(criterion):
    hard = criterion(LOGITS, LABELS)
    assert hard.shape == () and hard.dtype == torch.float32
    assert torch.allclose(criterion(LOGITS, F.one_hot(LABELS, 3).float()), hard)
    per_sample = criterion(LOGITS, LABELS, reduction="none")
    assert per_sample.shape == (3,) and torch.allclose(per_sample.mean(), hard)


def test_focal_with_gamma_zero_is_cross_entropy_for_hard_soft_and_smoothed_targets():
    soft = torch.softmax(torch.randn(3, 3), dim=1)
    for targets in (LABELS, soft):
        for s in (0.0, 0.3):
            expected = CrossEntropy(s)(LOGITS, targets, reduction="none")
            assert torch.allclose(FocalLoss(0.0, s)(LOGITS, targets, reduction="none"), expected)


def test_focal_weighs_each_sample_by_one_minus_its_probability_to_the_gamma():
    p = torch.softmax(LOGITS, dim=1)[torch.arange(3), LABELS]
    expected = -((1 - p) ** 2) * p.log()
    assert torch.allclose(FocalLoss(2.0)(LOGITS, LABELS, reduction="none"), expected)
    assert (expected < -p.log()).all()  # below cross-entropy, most for the confident ones


def test_label_smoothing_is_in_the_loss_under_bf16_autocast_on_the_cpu(tmp_path):
    identity = nn.Linear(3, 3, bias=False)
    nn.init.eye_(identity.weight)  # logits = inputs (rounded to bfloat16 by autocast)
    trainer = _trainer(identity, tmp_path, precision="bf16-mixed", label_smoothing=0.3)
    logits, loss = trainer.step(LOGITS, LABELS, group_size=1, sync=True)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    log_p = torch.log_softmax(logits.float(), dim=1)
    expected = -(_smoothed(LABELS, 0.3) * log_p).sum(dim=1).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss.item() != pytest.approx(F.cross_entropy(logits.float(), LABELS).item(), rel=1e-3)


@pytest.mark.parametrize("loss", ["cross_entropy", "focal"])
def test_trainer_label_smoothing_reaches_either_loss(tmp_path, loss):
    criterion = job_config(tmp_path, f"loss={loss}", "trainer.label_smoothing=0.2").loss()
    assert isinstance(criterion, {"cross_entropy": CrossEntropy, "focal": FocalLoss}[loss])
    assert criterion.label_smoothing == 0.2


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["loss=focal", "loss.gamma=-1"], ["loss: training.loss.FocalLoss refuses", "gamma=-1", "loss.* keys"]),
        (["+loss.weight=2"], ["loss: training.loss.CrossEntropy refuses", "'weight'"]),
    ],
)
def test_an_option_the_loss_refuses_is_one_line_before_launch(overrides, words):
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config("trainer.accelerator=cpu", *overrides))
    assert "\n" not in str(error.value)
    for word in words:
        assert word in str(error.value), error.value


def test_focal_under_bf16_autocast_computes_in_float32():
    """Under trainer.precision=bf16-mixed the logits come in bfloat16; the loss of those very logits
    must be float32's, not bfloat16's (its log-softmax alone, in bfloat16, moves it by ~3e-4)."""
    torch.manual_seed(0)
    linear, x, y = torch.nn.Linear(16, 10), torch.randn(64, 16) * 4, torch.randint(0, 10, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = linear(x)
        loss = FocalLoss(gamma=2.0)(logits, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    exact = FocalLoss(gamma=2.0)(logits.double(), y).item()  # the same bfloat16 logits, in float64
    assert loss.item() == pytest.approx(exact, rel=1e-6)
