"""Top-k selection over any importance: score every head, keep each block's best heads per member.

Members are made to differ by the `diversity` option (`bootstrap`: each member scores a
bootstrap resample of the data; `jitter`: seeded noise on the scores) and, as a last resort, by
swapping the closest-scored kept/dropped pair until no two members coincide.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from compressor.core.errors import OptionError
from compressor.core.masks import HeadMask
from compressor.core.modes import evaluating
from compressor.core.registry import resolve
from compressor.core.schema import Field
from compressor.data.bundle import bootstrap
from compressor.families import Family
from compressor.plugins import Batch, Importance, Pruner, checked_options
from pruners.base import jitter, make_distinct

TOPK_OPTIONS = {
    "importance": Field((str, Importance), "taylor", doc="a registered importance name, or 'package.module:Class'"),
    "importance_options": Field((dict, type(None)), None, doc="keyword arguments of the importance"),
}


def make_importance(importance: str | Importance, options: dict | None = None) -> Importance:
    """An Importance instance from a registered name (or import path) and its options."""
    if isinstance(importance, Importance):
        return importance
    cls = resolve("importance", importance)
    try:
        return cls(**(options or {}))
    except TypeError as e:
        raise OptionError(f"importance_options: {e}") from e


class TopKPruner(Pruner):
    """Keep each block's top heads by any registered importance (`importance:` names it)."""

    diversity_choices = ("bootstrap", "jitter", "none")

    def __init__(
        self, importance: str | Importance = "taylor", importance_options: dict | None = None, **kwargs
    ) -> None:
        opts = checked_options({"importance": importance, "importance_options": importance_options}, TOPK_OPTIONS)
        self.importances = [make_importance(opts["importance"], opts["importance_options"])]
        if not self.importances[0].needs_data and kwargs.get("diversity") == "bootstrap":
            raise OptionError("diversity: 'bootstrap' needs a data-driven importance; use jitter or none")
        kwargs.setdefault("diversity", "bootstrap" if self.importances[0].needs_data else "jitter")
        super().__init__(**kwargs)

    def importance_for(self, member: int) -> Importance:
        """The importance member `member` is scored by (one for all, or one per member)."""
        return self.importances[member % len(self.importances)]

    def member_scores(
        self, family: Family, calibration: Sequence[Batch], heldout: Sequence[Batch] | None, member: int
    ) -> list[torch.Tensor]:
        """Member `member`'s head scores (on its bootstrap resample, or jittered)."""
        seed = self.seed * 1000 + member
        outliers = self.outliers
        if self.diversity == "bootstrap" and self.members > 1:
            calibration = bootstrap(calibration, seed) if calibration else calibration
            heldout = bootstrap(heldout, seed + 500) if heldout else heldout
            outliers = [b[0] for b in bootstrap([(o,) for o in outliers], seed + 900)] if outliers else outliers
        keep = partial(self.keep_block, member=member)
        scores = self.importance_for(member)(family, calibration, heldout, outliers=outliers, keep=keep)
        if self.diversity == "jitter" and self.members > 1:
            scores = jitter(scores, seed)
        return scores

    def prune(
        self, family: Family, calibration: Sequence[Batch], heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        with evaluating(family.model):
            scores = [self.member_scores(family, calibration, heldout, m) for m in range(self.members)]
        self.last_scores = scores
        masks = [self.select(s, m) for m, s in enumerate(scores)]
        if self.distinct and self.members > 1:
            masks = make_distinct(masks, scores)
        return self.check(masks, family)
