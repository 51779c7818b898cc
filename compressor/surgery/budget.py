"""Meet a FLOPs or parameter budget by removing heads and MLP units together.

Two allocations, as torch-pruning offers (`global_pruning=False`, its default, or True):

- `uniform` (default): every block keeps the same share of its heads and of its MLP units, each
  block's best by importance; the share is found by bisection on the budget measured on the
  physically pruned model, then the MLP share alone is raised to land just under the target.
- `global`: every candidate (a head, an MLP unit) gets its importance
normalised within its block (divided by the block's mean absolute score), and candidates are
removed in order of normalised importance per unit of cost (the FLOPs or parameters removing it
saves) across all blocks, never below a floor per block (one head, 10% of the MLP units). The
number removed is then found by bisection on the budget measured on the physically pruned model
(FLOPs counted by torch.utils.flop_counter.FlopCounterMode, parameters by count), so the result
lands within 2% under the target.

On the default ViT at 0.5x FLOPs, `global` removed nearly every head (heads save the most FLOPs
per unit of normalised importance) and lost 7-9 points of accuracy after the fine-tune, where
`uniform` lost none (benchmarks/structured.py): hence the default.

`iterative_budget_mask` reaches the target in several equal steps, re-scoring what is left on the
model pruned so far, as torch-pruning's `iterative_steps` does (no fine-tune between steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from compressor.core.errors import InputError
from compressor.core.masks import HeadMask
from compressor.families import Family
from compressor.surgery.physical import example_inputs, prune_physically
from compressor.uq.evaluate import flops_per_sample

UNIT_FLOOR = 0.1  # an MLP keeps at least this share of its units


def _normalised(scores: torch.Tensor) -> torch.Tensor:
    s = torch.nan_to_num(scores.double(), neginf=0.0, posinf=0.0)
    return s / s.abs().mean().clamp_min(1e-12)


def measure(model: torch.nn.Module, family: Family, kind: str) -> float:
    if kind == "params":
        return float(sum(p.numel() for p in model.parameters()))
    return flops_per_sample(model, example_inputs(family))


def _costs(family: Family, kind: str, tokens: int) -> tuple[list[float], list[float]]:
    """Per block, what removing one head and one MLP unit saves (FLOPs per sample, or parameters)."""
    heads, units = [], []
    for b in range(family.num_blocks):
        d = family.attention(b).o.get().out_features
        hd = family.head_dim(b)
        if kind == "params":
            heads.append(4.0 * d * hd + 3 * hd)
            units.append(2.0 * d + 1)
        else:  # four projections (2 FLOPs per MAC) per token, and QK^T and AV
            heads.append(tokens * 8.0 * d * hd + 4.0 * tokens * tokens * hd)
            units.append(tokens * 4.0 * d)
    return heads, units


ALLOCATIONS = ("uniform", "global")


def _best(scores: torch.Tensor, k: int) -> list[int]:
    s = torch.nan_to_num(scores.double(), nan=float("-inf"))
    return sorted(torch.topk(s, k).indices.tolist())


def _largest_share(kept_share, ratio: float, lo: float, hi: float, iters: int = 24) -> float:
    """The largest r in [lo, hi] with kept_share(r) <= ratio (kept_share grows with r)."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept_share(mid) <= ratio else (lo, mid)
    return lo


def _only_kept(scores: Sequence[torch.Tensor], kept: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`scores` with what `kept` excludes set to -inf (never among a block's best)."""
    return [s.double().masked_fill(~k.bool(), float("-inf")) for s, k in zip(scores, kept)]


def _uniform_mask(
    family: Family,
    head_scores: Sequence[torch.Tensor],
    unit_scores: Sequence[torch.Tensor],
    kind: str,
    ratio: float,
    within: HeadMask,
) -> HeadMask:
    heads, widths = family.heads_per_block(), family.mlp_widths()
    full = measure(family.model, family, kind)
    head_scores, unit_scores = _only_kept(head_scores, within.blocks), _only_kept(unit_scores, within.units)
    alive_h, alive_u = within.num_kept(), [int(u.sum()) for u in within.units]
    floors = [max(1, int(UNIT_FLOOR * w)) for w in widths]

    def mask_at(r_heads: float, r_units: float) -> HeadMask:
        keep_h = [_best(s, min(a, max(1, round(r_heads * h)))) for s, h, a in zip(head_scores, heads, alive_h)]
        keep_u = [
            _best(s, min(a, max(f, round(r_units * w)))) for s, w, f, a in zip(unit_scores, widths, floors, alive_u)
        ]
        return HeadMask.from_kept(keep_h, heads).with_units(keep_u, widths)

    def share(r_heads: float, r_units: float) -> float:
        return measure(prune_physically(family.model, mask_at(r_heads, r_units)), family, kind) / full

    smallest = share(0.0, 0.0)
    if smallest > ratio:
        raise InputError(f"target: {kind} {ratio} is below what the per-block floors allow ({smallest:.3f})")
    r = _largest_share(lambda v: share(v, v), ratio, 0.0, 1.0)
    r_units = _largest_share(lambda v: share(r, v), ratio, r, 1.0)  # fill what the head rounding left
    return mask_at(r, r_units)


def budget_mask(
    family: Family,
    head_scores: Sequence[torch.Tensor],
    unit_scores: Sequence[torch.Tensor],
    target: dict[str, float],
    tokens: int,
    allocation: str = "uniform",
    within: HeadMask | None = None,
) -> HeadMask:
    """The mask (heads and MLP units) meeting `target` ({'flops': r} or {'params': r}, r the
    share of the unpruned model kept): the same share in every block (`uniform`), or the least
    normalised importance removed across blocks (`global`). With `within` (a mask with units),
    only what it keeps can be kept: the rest counts as removed already."""
    ((kind, ratio),) = target.items()
    if kind not in ("flops", "params") or not 0 < ratio < 1:
        raise InputError(f"target: expected {{flops: r}} or {{params: r}} with r in (0, 1), got {target}")
    if allocation not in ALLOCATIONS:
        raise InputError(f"allocation: expected one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    heads, widths = family.heads_per_block(), family.mlp_widths()
    within = within or HeadMask.full(heads).with_units([range(w) for w in widths], widths)
    if allocation == "uniform":
        return _uniform_mask(family, head_scores, unit_scores, kind, ratio, within)
    head_cost, unit_cost = _costs(family, kind, tokens)
    candidates = []  # (importance per cost, block, kind, index)
    for b, (hs, us) in enumerate(zip(head_scores, unit_scores)):
        hs, us = hs[within.blocks[b]], us[within.units[b]]
        for h, s in zip(within.kept_indices(b), _normalised(hs).tolist()):
            candidates.append((s / head_cost[b], b, "head", h))
        for u, s in zip(within.kept_units(b), _normalised(us).tolist()):
            candidates.append((s / unit_cost[b], b, "unit", u))
    candidates.sort()
    full = measure(family.model, family, kind)

    def mask_removing(n: int) -> HeadMask:
        keep_h = [set(within.kept_indices(b)) for b in range(len(heads))]
        keep_u = [set(within.kept_units(b)) for b in range(len(widths))]
        removed = 0
        for _, b, what, i in candidates:
            if removed >= n:
                break
            pool, floor = (keep_h[b], 1) if what == "head" else (keep_u[b], max(1, int(UNIT_FLOOR * widths[b])))
            if len(pool) > floor:
                pool.discard(i)
                removed += 1
        return HeadMask.from_kept([sorted(k) for k in keep_h], heads).with_units([sorted(k) for k in keep_u], widths)

    def kept_share(n: int) -> float:
        return measure(prune_physically(family.model, mask_removing(n)), family, kind) / full

    lo, hi = 0, len(candidates)
    if kept_share(hi) > ratio:
        raise InputError(f"target: {kind} {ratio} is below what the per-block floors allow ({kept_share(hi):.3f})")
    while hi - lo > 1:  # the least removal that gets under the target
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if kept_share(mid) > ratio else (lo, mid)
    return mask_removing(hi)


Scores = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]


def iterative_budget_mask(
    family: Family,
    scores_of: Callable[[HeadMask | None], Scores],
    target: dict[str, float],
    tokens: int,
    allocation: str = "uniform",
    steps: int = 1,
) -> HeadMask:
    """`budget_mask` reached in `steps` equal steps (kept share 1 - (1 - r) j / steps at step j),
    each scoring heads and units with `scores_of(mask so far)` (None: the unpruned model), so that
    a unit's importance is measured without the ones already removed; what a step removed stays
    removed."""
    ((kind, ratio),) = target.items()
    if steps < 1:
        raise InputError(f"iterative_steps: expected an integer >= 1, got {steps}")
    mask: HeadMask | None = None
    for j in range(1, steps + 1):
        heads, units = scores_of(mask)
        share = ratio if j == steps else 1 - (1 - ratio) * j / steps
        mask = budget_mask(family, heads, units, {kind: share}, tokens, allocation, within=mask)
    return mask
