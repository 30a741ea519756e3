"""The per-epoch image summary: a grid of validation samples captioned predicted / true."""
from __future__ import annotations

import numpy as np
import torch

from training.reporting import sample_grid


def _caption_hues(grid: np.ndarray, index: int, tile: int = 96) -> set[str]:
    """'green' and/or 'red' if the caption under tile `index` has such pixels (the text is anti-aliased)."""
    row, column = divmod(index, 4)
    strip = grid[row * (tile + 14) + tile:(row + 1) * (tile + 14), column * (tile + 2):column * (tile + 2) + tile]
    r, g = strip[..., 0].astype(int), strip[..., 1].astype(int)
    return {hue for hue, present in (("green", (g > r + 80).any()), ("red", (r > g + 80).any())) if present}


def test_grid_has_a_tile_per_sample_and_colours_right_and_wrong():
    images = torch.randn(5, 1, 8, 8) * 3 + 7  # normalised or not: each tile is scaled to its own range
    grid = sample_grid(images, torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 0, 3, 0, 5]))
    assert grid.dtype == np.uint8 and grid.shape == (2 * (96 + 14), 4 * 98 - 2, 3)
    assert [_caption_hues(grid, i) for i in range(5)] == [{"green"}, {"red"}, {"green"}, {"red"}, {"green"}]
    first_tile = grid[:96, :96]
    assert first_tile.min() == 0 and first_tile.max() == 255


def test_colour_images_keep_their_colours():
    image = torch.zeros(1, 3, 4, 4)
    image[0, 0] = 1.0  # pure red
    grid = sample_grid(image, torch.tensor([0]), torch.tensor([0]))
    assert tuple(grid[10, 10]) == (255, 0, 0)
