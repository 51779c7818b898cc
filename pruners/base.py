"""The Pruner interface and the helpers every head-selection method shares.

A Pruner takes a model (through its adapter) and calibration data and returns M head masks, one
per ensemble member. Importance-based pruners compute one score per head and block and keep the
top heads; members are made to differ by the `diversity` option and, as a last resort, by
swapping the closest-scored kept/dropped pair until no two members coincide.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.adapters import ModelAdapter
from compressor.masks import HeadMask, MaskError

Batch = tuple[torch.Tensor, ...]


class Pruner:
    """Base class: subclasses implement `prune` (or `scores` for the importance-based ones)."""

    plugin_name = "base"
    diversity_choices: tuple[str, ...] = ("none",)

    def __init__(
        self,
        members: int = 3,
        keep_ratio: float | list[float] = 0.5,
        keep_heads: int | None = None,
        seed: int = 0,
        diversity: str | None = None,
        distinct: bool = True,
        allow_empty_blocks: bool = False,
    ) -> None:
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        if keep_heads is not None and (isinstance(keep_heads, bool) or not isinstance(keep_heads, int)):
            raise ValueError(f"keep_heads: expected an integer or null, got {keep_heads!r}")
        ratios = keep_ratio if isinstance(keep_ratio, list) else [keep_ratio] * members
        if len(ratios) != members:
            raise ValueError(f"keep_ratio: expected one ratio or a list of {members} (one per member)")
        for r in ratios:
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise ValueError(f"keep_ratio: expected a number in [0, 1], got {r!r}")
        self.members = members
        self.keep_ratios = [float(r) for r in ratios]
        self.keep_heads = keep_heads
        self.seed = seed
        self.diversity = diversity or self.diversity_choices[0]
        if self.diversity not in self.diversity_choices:
            raise ValueError(f"diversity: expected one of {', '.join(self.diversity_choices)}, got '{self.diversity}'")
        self.distinct = distinct
        self.allow_empty_blocks = allow_empty_blocks
        self.last_scores: list[list[torch.Tensor]] | None = None

    # --- what a subclass provides ---------------------------------------------------------
    def prune(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        """Return `members` head masks for the model behind `adapter`."""
        raise NotImplementedError

    # --- shared helpers -------------------------------------------------------------------
    def num_keep(self, heads: int, member: int) -> int:
        """How many heads member `member` keeps in a block of `heads` heads."""
        if self.keep_heads is not None:
            k = int(self.keep_heads)
        else:
            k = int(round(self.keep_ratios[member] * heads))
        if k <= 0 and not self.allow_empty_blocks:
            raise MaskError(
                f"keep_ratio {self.keep_ratios[member]} keeps no head of {heads} in a block; "
                "raise keep_ratio/keep_heads or set allow_empty_blocks: true"
            )
        if k > heads:
            raise MaskError(f"keep_heads {k} is more than the {heads} heads of a block")
        return max(k, 0)

    def select(self, scores: Sequence[torch.Tensor], member: int) -> HeadMask:
        """Keep the highest-scored heads of every block (ties broken by head index)."""
        blocks = []
        for s in scores:
            k = self.num_keep(s.numel(), member)
            keep = torch.zeros(s.numel(), dtype=torch.bool)
            keep[torch.argsort(-s.double(), stable=True)[:k]] = True
            blocks.append(keep)
        return HeadMask(tuple(blocks))

    def check(self, masks: list[HeadMask], adapter: ModelAdapter) -> list[HeadMask]:
        for i, m in enumerate(masks):
            m.validate(adapter.heads_per_block(), self.allow_empty_blocks, where=f"{self.plugin_name} member {i}")
        return masks


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
                kept = torch.nonzero(keep).flatten()
                dropped = torch.nonzero(~keep).flatten()
                for i in kept.tolist():
                    for j in dropped.tolist():
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
