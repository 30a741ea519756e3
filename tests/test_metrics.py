"""Validation's sums (one cross-entropy and one argmax over the whole set; test_recipes.py holds
top-5 and the split into shards), and where each rank puts its devices' peak memory."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distributed.context import make_context
from training.metrics import Accumulator, peak_memory_mb


def test_validation_sums_give_the_mean_loss_and_the_accuracy_of_the_whole_set():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0], [1.0, 4.0, 0.0], [0.3, 0.2, 0.1]])
    targets = torch.tensor([0, 1, 1, 2])
    sums = Accumulator(torch.device("cpu"), top5=True)
    sums.update_validation(logits, targets)
    figures = sums.averages()
    assert figures.loss == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-6)
    assert (figures.acc, figures.acc5, figures.samples) == (0.5, 1.0, 4)  # argmax per row: 0, 2, 1, 0


def test_each_rank_fills_its_own_devices_slots_of_the_jobs_peak_memory(monkeypatch):
    # Rank 1 of 2, driving two GPUs (dp within a rank): its peaks go to slots 2 and 3; the all-reduce
    # (none without a process group) sums the ranks' slots. CUDA's counters and tensors faked on the host.
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *shape, device=None, **kwargs: zeros(*shape, **kwargs))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: {0: 3e6, 1: 5e6}[device.index])
    ctx = make_context(1, 1, 2, 2, "gpu", use_process_group=False, devices_per_process=2)
    assert peak_memory_mb(ctx) == [0.0, 0.0, 3.0, 5.0]
    assert peak_memory_mb(make_context(0, 0, 1, 1, "cpu", use_process_group=False)) is None
