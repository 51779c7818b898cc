"""Helpers the in-tree pruners share; the Pruner interface itself is `compressor.plugins.Pruner`
(importable from here too, for plugin authors)."""

from __future__ import annotations

import torch

from compressor.core.errors import MaskError
from compressor.core.masks import HeadMask
from compressor.plugins import Batch, Importance, Pruner

__all__ = ["Batch", "Importance", "Pruner", "jitter", "make_distinct"]


def make_distinct(masks: list[HeadMask], scores: list[list[torch.Tensor]]) -> list[HeadMask]:
    """Make every mask differ from the earlier ones by the cheapest swaps.

    A duplicate member swaps, in the block where it costs least, its weakest kept head for its
    strongest dropped head (by that member's scores), until it matches no earlier member.
    """
    out: list[HeadMask] = []
    for m, mask in enumerate(masks):
        blocks = [b.clone() for b in mask.blocks]
        tried: set[tuple[int, int, int]] = set()
        while HeadMask(tuple(blocks)) in out:
            best = None
            for bi, (keep, s) in enumerate(zip(blocks, scores[m])):
                if keep.all() or not keep.any():
                    continue
                for i in torch.nonzero(keep).flatten().tolist():
                    for j in torch.nonzero(~keep).flatten().tolist():
                        if (bi, i, j) in tried:
                            continue
                        cost = float(s[i] - s[j])
                        if best is None or cost < best[0]:
                            best = (cost, bi, i, j)
            if best is None:
                raise MaskError(f"member {m}: cannot be made different from the earlier members")
            _, bi, i, j = best
            tried.add((bi, i, j))
            blocks[bi][i], blocks[bi][j] = False, True
        out.append(HeadMask(tuple(blocks)))
    return out


def jitter(scores: list[torch.Tensor], seed: int, scale: float = 0.1) -> list[torch.Tensor]:
    """Multiply scores by seeded log-normal noise (diversity for data-free scores)."""
    g = torch.Generator().manual_seed(seed)
    return [s * torch.exp(scale * torch.randn(s.shape, generator=g, dtype=torch.float64)).to(s.dtype) for s in scores]
