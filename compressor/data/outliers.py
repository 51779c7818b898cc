"""Validation outliers: inputs that are surely not in-distribution, used to choose heads by an
uncertainty objective and to reward member disagreement; never a test OOD set.

By default they are synthetic, made from in-distribution inputs whose structure is destroyed while
their pixel or token statistics stay: images cut into a grid of cells that are shuffled, sentences
whose tokens are shuffled (the first and last real tokens, [CLS]/[SEP] or BOS/EOS, kept). A recipe
may name its own instead (`data.ood_val_roots` for image folders, `data.ood_val_file` for text).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset, TensorDataset

OutlierMaker = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def shuffle_patches(x: torch.Tensor, generator: torch.Generator, grid: int = 4) -> torch.Tensor:
    """Images [B, C, H, W] with the cells of a `grid` x `grid` partition permuted, per image."""
    b, c, h, w = x.shape
    gh, gw = h // grid, w // grid
    cells = x[:, :, : gh * grid, : gw * grid].reshape(b, c, grid, gh, grid, gw).permute(0, 2, 4, 1, 3, 5)
    cells = cells.reshape(b, grid * grid, c, gh, gw)
    order = torch.argsort(torch.rand(b, grid * grid, generator=generator), dim=1).to(x.device)
    cells = cells[torch.arange(b, device=x.device)[:, None], order]
    out = cells.reshape(b, grid, grid, c, gh, gw).permute(0, 3, 1, 4, 2, 5).reshape(b, c, gh * grid, gw * grid)
    if (gh * grid, gw * grid) != (h, w):  # a margin the grid does not cover stays as it was
        full = x.clone()
        full[:, :, : gh * grid, : gw * grid] = out
        return full
    return out


def shuffle_tokens(ids: torch.Tensor, generator: torch.Generator, pad_id: int = 0) -> torch.Tensor:
    """Token ids [B, L] with each row's real tokens between its first and last one permuted."""
    out = ids.clone()
    for row in out:
        real = torch.nonzero(row != pad_id).flatten()
        if len(real) > 3:
            inner = real[1:-1]
            row[inner] = row[inner][torch.randperm(len(inner), generator=generator).to(row.device)]
    return out


def synthetic_outliers(inputs: torch.Tensor, make: OutlierMaker, seed: int = 0) -> Dataset:
    """An unlabelled dataset of `make`(inputs), seeded (the default validation outlier set)."""
    return TensorDataset(make(inputs, torch.Generator().manual_seed(seed)))
