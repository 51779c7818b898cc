"""Disjoint subsets: every head of every block goes to exactly one member."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.core.masks import HeadMask
from compressor.core.modes import evaluating
from compressor.core.schema import Field
from compressor.families import Family
from compressor.plugins import Batch, Pruner, checked_options
from pruners.topk import make_importance

DISJOINT_OPTIONS = {
    "rank_by": Field((str, type(None)), None, doc="an importance that orders the heads dealt out (default: random)"),
    "rank_options": Field((dict, type(None)), None, doc="keyword arguments of that importance"),
}


class DisjointPruner(Pruner):
    """Partition each block's heads across members, round-robin by rank (random, or any importance)."""

    keep_ratio_selects_heads = False  # keep_ratio is a share of its own heads (or unused)

    def __init__(self, rank_by: str | None = None, rank_options: dict | None = None, **kwargs) -> None:
        kwargs.setdefault("keep_ratio", 1.0)
        super().__init__(**kwargs)
        opts = checked_options({"rank_by": rank_by, "rank_options": rank_options}, DISJOINT_OPTIONS)
        self.rank_by = None if opts["rank_by"] is None else make_importance(opts["rank_by"], opts["rank_options"])

    def block_ranks(
        self, family: Family, calibration: Sequence[Batch], heldout: Sequence[Batch] | None
    ) -> list[torch.Tensor]:
        """Head order per block, most important first (a seeded permutation without rank_by)."""
        if self.rank_by is None:
            g = torch.Generator().manual_seed(self.seed)
            return [torch.randperm(h, generator=g) for h in family.heads_per_block()]
        with evaluating(family.model):
            scores = self.rank_by(family, calibration, heldout, outliers=self.outliers)
        self.last_scores = [scores] * self.members
        return [torch.argsort(-s.double(), stable=True) for s in scores]

    def prune(
        self, family: Family, calibration: Sequence[Batch] = (), heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        ranks = self.block_ranks(family, calibration, heldout)
        masks = []
        for m in range(self.members):
            blocks = []
            for order in ranks:
                share = order[m :: self.members]  # round-robin: members get equally strong heads
                k = len(share) if self.keep_ratios[m] >= 1.0 else max(1, int(round(self.keep_ratios[m] * len(share))))
                keep = torch.zeros(order.numel(), dtype=torch.bool)
                keep[share[:k]] = True
                blocks.append(keep)
            masks.append(HeadMask(tuple(blocks)))
        return self.check(masks, family)
