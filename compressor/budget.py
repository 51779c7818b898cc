"""Meet a FLOPs or parameter budget by removing heads and MLP units together.

As torch-pruning's global pruning does: every candidate (a head, an MLP unit) gets its importance
normalised within its block (divided by the block's mean absolute score), and candidates are
removed in order of normalised importance per unit of cost (the FLOPs or parameters removing it
saves) across all blocks, never below a floor per block (one head, 10% of the MLP units). The
number removed is then found by bisection on the budget measured on the physically pruned model
(FLOPs counted by torch.utils.flop_counter.FlopCounterMode, parameters by count), so the result
lands within 2% under the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.errors import InputError
from compressor.evaluate import flops_per_sample
from compressor.families import Family
from compressor.masks import HeadMask
from compressor.surgery import example_inputs, prune_physically

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


def budget_mask(
    family: Family,
    head_scores: Sequence[torch.Tensor],
    unit_scores: Sequence[torch.Tensor],
    target: dict[str, float],
    tokens: int,
) -> HeadMask:
    """The mask (heads and MLP units) meeting `target` ({'flops': r} or {'params': r}, r the
    share of the unpruned model kept) with the least normalised importance removed."""
    ((kind, ratio),) = target.items()
    if kind not in ("flops", "params") or not 0 < ratio < 1:
        raise InputError(f"target: expected {{flops: r}} or {{params: r}} with r in (0, 1), got {target}")
    heads, widths = family.heads_per_block(), family.mlp_widths()
    head_cost, unit_cost = _costs(family, kind, tokens)
    candidates = []  # (importance per cost, block, kind, index)
    for b, (hs, us) in enumerate(zip(head_scores, unit_scores)):
        for h, s in enumerate(_normalised(hs).tolist()):
            candidates.append((s / head_cost[b], b, "head", h))
        for u, s in enumerate(_normalised(us).tolist()):
            candidates.append((s / unit_cost[b], b, "unit", u))
    candidates.sort()
    full = measure(family.model, family, kind)

    def mask_removing(n: int) -> HeadMask:
        keep_h = [set(range(h)) for h in heads]
        keep_u = [set(range(w)) for w in widths]
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
