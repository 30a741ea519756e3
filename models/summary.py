"""How big a model is: its parameters, the memory they and its buffers take, and the FLOPs of one
forward pass per sample, counted on the meta device (shapes only: no memory, no arithmetic; its
cost at start-up: BENCHMARKS.md, "Model summary")."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class ModelSummary:
    parameters: int
    trainable: int  # parameters that require gradients
    size_mb: float  # parameters and buffers, each in its dtype, in MB (10^6 bytes)
    flops_per_sample: int | None  # one forward, a multiply-add counted as 2; None: not counted

    def metrics(self) -> dict[str, int | float | None]:
        """For metrics.json and the HParams table."""
        return {
            "parameters": self.parameters,
            "trainable_parameters": self.trainable,
            "model_mb": round(self.size_mb, 3),
            "flops_per_sample": self.flops_per_sample,
        }

    def __str__(self) -> str:
        flops = (
            "FLOPs not counted"
            if self.flops_per_sample is None
            else f"{self.flops_per_sample / 1e6:,.2f} MFLOPs per sample"
        )
        return f"{self.parameters:,} parameters ({self.trainable:,} trainable), {self.size_mb:,.2f} MB, {flops}"


def summarize(model: nn.Module, sample_shape: tuple[int, ...]) -> ModelSummary:
    """`model` as built, before any wrapper; `sample_shape`: one input, (channels, height, width)."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    return ModelSummary(
        parameters=sum(p.numel() for p in model.parameters()),
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        size_mb=sum(t.numel() * t.element_size() for t in tensors) / 1e6,
        flops_per_sample=forward_flops(model, sample_shape),
    )


def forward_flops(model: nn.Module, sample_shape: tuple[int, ...]) -> int | None:
    """FLOPs of one sample's forward in evaluation mode, as torch.utils.flop_counter counts them
    (matrix products and convolutions), run with meta stand-ins for the model's own tensors: the
    model is neither copied nor run on its device. None where a forward needs real values (.item(),
    a data-dependent shape), which the meta device cannot give."""
    meta = {
        name: torch.empty_like(t, device="meta")
        for name, t in itertools.chain(model.named_parameters(), model.named_buffers())
    }
    training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            functional_call(model, meta, (torch.empty((1, *sample_shape), device="meta"),))
    except (NotImplementedError, RuntimeError) as e:
        if isinstance(e, NotImplementedError) or "meta" in str(e):
            return None
        raise
    finally:
        model.train(training)
    return counter.get_total_flops()
