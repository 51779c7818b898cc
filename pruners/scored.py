"""Importance-based pruning: score every head, keep the top ones per block, per member."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.adapters import ModelAdapter
from compressor.data import bootstrap
from compressor.masks import HeadMask
from pruners.base import Batch, Pruner, jitter, make_distinct


class ScoredPruner(Pruner):
    """Subclasses implement `head_scores`; members differ by bootstrap, jitter or both."""

    diversity_choices = ("bootstrap", "jitter", "none")
    needs_data = True

    def head_scores(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None
    ) -> list[torch.Tensor]:
        """One importance score per head, per block (higher = more important)."""
        raise NotImplementedError

    def member_scores(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None, member: int
    ) -> list[torch.Tensor]:
        seed = self.seed * 1000 + member
        if self.diversity == "bootstrap" and self.needs_data and self.members > 1:
            calibration = bootstrap(calibration, seed) if calibration else calibration
            heldout = bootstrap(heldout, seed + 500) if heldout else heldout
        scores = self.head_scores(adapter, calibration, heldout)
        if self.diversity == "jitter" and self.members > 1:
            scores = jitter(scores, seed)
        return scores

    def prune(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        was_training = adapter.model.training
        adapter.model.eval()
        try:
            scores = [self.member_scores(adapter, calibration, heldout, m) for m in range(self.members)]
        finally:
            adapter.model.train(was_training)
        self.last_scores = scores
        masks = [self.select(s, m) for m, s in enumerate(scores)]
        if self.distinct and self.members > 1:
            masks = make_distinct(masks, scores)
        return self.check(masks, adapter)
