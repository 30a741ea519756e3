"""A Vision Transformer (Dosovitskiy et al., 2021) small enough for 8-32 px images: square patches
embedded by a strided convolution, a class token, learned positions, pre-norm encoder blocks
(nn.TransformerEncoder), and a linear head on the class token."""

from __future__ import annotations

import torch
from torch import nn

from errors import ConfigError


class TinyViT(nn.Module):
    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        patch_size: int = 4,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: int = 2,
    ) -> None:
        super().__init__()
        self.patches = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.positions = nn.Parameter(torch.randn(1, (image_size // patch_size) ** 2 + 1, dim) * 0.02)
        block = nn.TransformerEncoderLayer(
            dim, heads, dim * mlp_ratio, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        # The nested-tensor fast path skips pre-norm blocks anyway; saying so keeps torch's warning away.
        self.encoder = nn.TransformerEncoder(block, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)  # N x patches x dim
        # shape[0], not len(): torch.export reads len() as a constant, and the batch must stay dynamic
        tokens = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), tokens], dim=1) + self.positions
        return self.head(self.encoder(tokens)[:, 0])


def check(image_size: int, patch_size: int, dim: int, heads: int, **_: object) -> None:
    """Before launch: patches that tile the image, heads that split the width. The pre-flight gives
    every argument TinyViT gets, its defaults included; this looks at four."""
    if patch_size < 1 or image_size % patch_size:
        raise ConfigError(
            f"model.patch_size={patch_size} must tile dataset.image_size={image_size}; give a divisor of it"
        )
    if heads < 1 or dim % heads:
        raise ConfigError(f"model.heads={heads} must split model.dim={dim} evenly; give a divisor of it")
