"""Validation's sums: loss and accuracy as one cross-entropy and one argmax over the whole set
(test_recipes.py holds top-5 and the split into shards)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.metrics import Accumulator


def test_validation_sums_give_the_mean_loss_and_the_accuracy_of_the_whole_set():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0], [1.0, 4.0, 0.0], [0.3, 0.2, 0.1]])
    targets = torch.tensor([0, 1, 1, 2])
    sums = Accumulator(torch.device("cpu"), top5=True)
    sums.update_validation(logits, targets)
    figures = sums.averages()
    assert figures.loss == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-6)
    assert (figures.acc, figures.acc5, figures.samples) == (0.5, 1.0, 4)  # argmax per row: 0, 2, 1, 0
