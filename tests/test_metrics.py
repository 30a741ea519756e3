"""The sums behind every reported loss and accuracy: validation's (one cross-entropy and one argmax
over the whole set, in float64; test_recipes.py holds top-5 and the split into shards), a training
window's, the device they stay on, and where each rank puts its devices' peak memory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from distributed.context import make_context
from training.loss import CrossEntropy
from training.metrics import Accumulator, Averages, Window, peak_memory_mb, samples_per_s


def test_validation_sums_give_the_mean_loss_and_the_accuracy_of_the_whole_set():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0], [1.0, 4.0, 0.0], [0.3, 0.2, 0.1]])
    targets = torch.tensor([0, 1, 1, 2])
    sums = Accumulator(torch.device("cpu"), validation=True)
    sums.update_validation(logits, targets, CrossEntropy())
    figures = sums.averages()
    assert figures.loss == figures.ce == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-6)
    assert (figures.acc, figures.acc5, figures.samples) == (0.5, 1.0, 4)  # argmax per row: 0, 2, 1, 0


def test_each_rank_fills_its_own_devices_slots_of_the_jobs_peak_memory(monkeypatch):
    # Rank 1 of 2, driving two GPUs (dp within a rank): its peaks go to slots 2 and 3; the all-reduce
    # (none without a process group) sums the ranks' slots. CUDA's counters and tensors faked on the host.
    zeros, placed = torch.zeros, []

    def host_zeros(*shape, device=None, **kwargs):
        placed.append(device)
        return zeros(*shape, **kwargs)

    monkeypatch.setattr(torch, "zeros", host_zeros)
    peaks = {0: 123456789, 1: 987654321}  # bytes: more digits than float32 holds
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks[device.index])
    for rank, slots in ((0, [123.456789, 987.654321, 0.0, 0.0]), (1, [0.0, 0.0, 123.456789, 987.654321])):
        ctx = make_context(rank, rank, 2, 2, "gpu", use_process_group=False, devices_per_process=2)
        assert peak_memory_mb(ctx) == pytest.approx(slots, rel=1e-12, abs=0) and placed[-1] == ctx.device
    assert peak_memory_mb(make_context(0, 0, 1, 1, "cpu", use_process_group=False)) is None


def test_the_loss_is_summed_in_float64():
    # One huge loss beside small ones: float32 sums would drop the small ones (its ulp at 1e8 is 8).
    logits = torch.tensor([[0.0, 1e8], [0.0, 0.0], [0.0, 0.0]])
    targets = torch.tensor([0, 0, 1])
    sums = Accumulator(torch.device("cpu"), validation=True)
    sums.update_validation(logits, targets, CrossEntropy())
    assert sums.averages().loss == pytest.approx((1e8 + 2 * math.log(2)) / 3, rel=1e-15)


def test_a_window_averages_its_finite_micro_batches_and_names_the_first_non_finite_step():
    window = Window()
    assert window.first_nonfinite() is None
    batches = [  # (loss, logits, targets, optimizer step)
        (2.0, [[1.0, 0.0], [0.0, 2.0]], [0, 0], 1),  # one of two right, by the argmax of each row
        (float("nan"), [[0.0, 1.0]] * 3, [1, 1, 1], 2),  # left out of the averages
        (4.0, [[0.0, 1.0]], [1], 2),
        (float("inf"), [[0.0, 1.0]], [1], 3),
    ]
    for loss, logits, targets, step in batches:
        window.update(torch.tensor(loss), torch.tensor(logits), torch.tensor(targets), step)
    assert window.first_nonfinite() == 2
    figures = window.drain(torch.device("cpu")).averages()
    assert (figures.loss, figures.acc, figures.samples) == ((2.0 * 2 + 4.0) / 3, 2 / 3, 3)
    assert window.first_nonfinite() is None  # drained
    window.update(torch.tensor(1.0), torch.tensor([[0.0, 1.0]]), torch.tensor([0]), 4)
    epoch = Accumulator(torch.device("cpu"))
    epoch.add(window.drain(torch.device("cpu")))
    epoch.add(Accumulator(torch.device("cpu")))  # an empty window adds nothing, and replaces nothing
    assert epoch.averages() == Averages(1.0, 0.0, 1)
    one = Window()
    one.update(torch.tensor(0.5), torch.tensor([[0.0, 1.0]]), torch.tensor([1]), 1)
    assert one.drain(torch.device("cpu")).averages() == Averages(0.5, 1.0, 1)  # one sample: not halved


def test_sums_stay_on_the_device_of_the_batches():
    # The meta device stands for a GPU: a sum kept elsewhere would fail to mix with its tensors.
    meta = torch.device("meta")
    sums = Accumulator(meta, validation=True)
    logits, targets = torch.empty(4, 10, device=meta), torch.zeros(4, dtype=torch.long, device=meta)
    sums.update_validation(logits, targets, CrossEntropy())
    window = Window()
    window.update(torch.empty((), device=meta), torch.empty(4, 10, device=meta), torch.zeros(4, device=meta), 1)
    assert sums.sums.device == window.drain(meta).sums.device == meta


def test_a_runs_samples_per_s_is_the_median_of_its_epochs_after_the_first():
    assert samples_per_s([10.0, 40.0, 20.0, 30.0]) == 30.0  # the warm-up's 10 left out
    assert samples_per_s([10.0]) == 10.0
