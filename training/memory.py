"""What each rank holds for training, from its local shards: parameter, gradient and optimizer
state bytes. Under DDP every rank holds all of them; under FSDP about 1/N each.

Measured once, at the first optimizer step (hooks on the optimizer, removed after): gradients
just before it, when they are reduced and this rank's, and optimizer state just after, once it
exists. The gathered parameters of the block being computed (FSDP), activations and
communication buffers come on top; on CUDA, peak_memory_mb has all that torch's allocator gave out
(not the CUDA context, nor NCCL's own buffers).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from distributed.collectives import all_gather_object
from distributed.context import DistContext
from distributed.fsdp import local_bytes

log = logging.getLogger("train")


class MemoryProbe:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.params = sum(local_bytes(p) for p in model.parameters())
        self.grads: int | None = None
        self.optimizer_state: int | None = None
        self._hooks = [
            optimizer.register_step_pre_hook(self._measure_grads),
            optimizer.register_step_post_hook(self._measure_state),
        ]

    def _measure_grads(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.grads = sum(local_bytes(p.grad) for p in params)
        self._hooks[0].remove()

    def _measure_state(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.optimizer_state = sum(
            local_bytes(value)
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        )
        self._hooks[1].remove()

    def per_rank(self, ctx: DistContext, peak_memory_mb: list[float] | None) -> dict[str, list[int | None]]:
        """Every rank's figures, indexed by rank (every rank calls this); logged by rank 0."""
        ranks = all_gather_object((self.params, self.grads, self.optimizer_state), ctx)
        figures = {
            "param_bytes_per_rank": [r[0] for r in ranks],
            "grad_bytes_per_rank": [r[1] for r in ranks],
            "optimizer_bytes_per_rank": [r[2] for r in ranks],
        }
        peak = f", CUDA peak {max(peak_memory_mb):,.0f} MB" if peak_memory_mb else ""
        log.info(
            "memory per rank (largest): parameters %s, gradients %s, optimizer state %s%s",
            *(_mb(values) for values in figures.values()),
            peak,
        )
        return figures


def _mb(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{max(known) / 1e6:,.1f} MB" if known else "n/a"
