"""Random head subsets: the baseline every informed selection must beat."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.core.masks import HeadMask
from compressor.families import Family
from compressor.plugins import Batch, Pruner
from pruners.base import make_distinct


class RandomPruner(Pruner):
    """Seeded random heads per block and member (reproducible; members differ)."""

    def prune(
        self, family: Family, calibration: Sequence[Batch] = (), heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        g = torch.Generator().manual_seed(self.seed)
        scores = [[torch.rand(h, generator=g) for h in family.heads_per_block()] for _ in range(self.members)]
        self.last_scores = scores
        masks = [self.select(s, m) for m, s in enumerate(scores)]
        if self.distinct and self.members > 1:
            masks = make_distinct(masks, scores)
        return self.check(masks, family)
