"""models.summary: parameters, size and FLOPs per sample, counted on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.summary import forward_flops, summarize


def test_a_linear_layer_is_2_in_out_flops_a_sample_and_its_parameters_and_bytes_are_counted():
    layer = nn.Linear(16, 4)
    layer.bias.requires_grad_(False)
    summary = summarize(layer, (16,))
    assert (summary.parameters, summary.trainable, summary.flops_per_sample) == (16 * 4 + 4, 16 * 4, 2 * 16 * 4)
    assert summary.size_mb == pytest.approx((16 * 4 + 4) * 4 / 1e6)
    assert str(summary) == "68 parameters (64 trainable), 0.00 MB, 0.00 MFLOPs per sample"


def test_a_convolution_counts_every_output_position_and_buffers_count_in_the_size():
    # BatchNorm1d refuses one sample in training mode: the count runs the forward in evaluation mode
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 6 * 6, 10), nn.BatchNorm1d(10)
    )
    net.train()
    summary = summarize(net, (3, 8, 8))
    assert summary.flops_per_sample == 2 * (8 * 3 * 3 * 3) * 6 * 6 + 2 * 8 * 6 * 6 * 10
    parameters = (8 * 27 + 8) + (8 + 8) + (288 * 10 + 10) + (10 + 10)  # conv, BatchNorm2d, linear, BatchNorm1d
    buffers = (8 + 8 + 10 + 10) * 4 + 2 * 8  # the BatchNorms' running means and variances, batches tracked (int64)
    assert summary.size_mb == pytest.approx((parameters * 4 + buffers) / 1e6)
    assert net.training and net[0].weight.device.type == "cpu"  # left as it was: mode and device


def test_a_forward_that_needs_values_has_no_flop_count():
    class ReadsAValue(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.sum().item()

    assert forward_flops(ReadsAValue(), (4,)) is None
    assert summarize(ReadsAValue(), (4,)).metrics() == {
        "parameters": 0,
        "trainable_parameters": 0,
        "model_mb": 0.0,
        "flops_per_sample": None,
    }
    assert str(summarize(ReadsAValue(), (4,))) == "0 parameters (0 trainable), 0.00 MB, FLOPs not counted"


def test_the_default_model_built_on_the_meta_device_is_summarized_without_memory():
    from models.mnist_net import MnistNet

    with torch.device("meta"):
        net = MnistNet(1, 10, 8)
    summary = summarize(net, (1, 8, 8))
    # conv 1 -> 32 (6x6 out), conv 32 -> 64 (4x4 out), fc 64*2*2 -> 128, fc 128 -> 10
    assert summary.flops_per_sample == 2 * (32 * 9 * 36 + 64 * 32 * 9 * 16 + 256 * 128 + 128 * 10)
    assert summary.parameters == (32 * 9 + 32) + (64 * 32 * 9 + 64) + (256 * 128 + 128) + (128 * 10 + 10)
