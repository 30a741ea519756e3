"""BatchNorm with statistics over the global batch. CUDA uses torch's SyncBatchNorm; torch's
refuses CPU tensors, so CPU ranks (gloo) use GlooSyncBatchNorm: the same math from two
differentiable all-reduces, so a sync_batchnorm job rehearses on CPU as it runs on GPUs."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def convert_sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """Replace every BatchNorm*d in `model`, keeping its weights and running statistics."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if isinstance(model, _BatchNorm) and not isinstance(model, GlooSyncBatchNorm):
        sync = GlooSyncBatchNorm(
            model.num_features,
            model.eps,
            model.momentum,
            model.affine,
            model.track_running_stats,
            device=device,
        )
        sync.load_state_dict(model.state_dict())
        sync.train(model.training)
        return sync
    for name, child in model.named_children():
        model.add_module(name, convert_sync_batchnorm(child, device))
    return model


class GlooSyncBatchNorm(_BatchNorm):
    """Training-mode BatchNorm over every rank's batch; in eval mode, plain BatchNorm."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, -1] + [1] * (x.dim() - 2)
        # Statistics in fp32 whatever autocast handed us, as BatchNorm's kernels keep them.
        # Sum and count first, then squared deviations from the global mean: stable, and the
        # all-reduces' backward sums the gradient over ranks as SyncBatchNorm's does.
        x32 = x.float()
        count = torch.full((1,), x.numel() // x.shape[1], dtype=torch.float32, device=x.device)
        totals = funcol.all_reduce(torch.cat([x32.sum(dims), count]), "sum", dist.group.WORLD)
        n = totals[-1]
        mean = totals[:-1] / n
        centred = x32 - mean.view(shape)
        var = funcol.all_reduce((centred * centred).sum(dims), "sum", dist.group.WORLD) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_((var * n / (n - 1)).to(self.running_var.dtype), momentum)
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)
