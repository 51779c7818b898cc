"""MLP hidden-unit importance, per member: which units a member keeps when its MLP is narrowed.

The same rule for every model family (the family layer finds the MLP): a unit's score is its mean
|activation| on calibration inputs, with the member's head mask applied, times the norm of its
output weights (without calibration data: the product of its input and output weight norms).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.distributed import all_reduce_sum
from compressor.families import Family
from compressor.masks import HeadMask


def top_units(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest-scored units, in increasing order (ties broken by index)."""
    return torch.sort(torch.argsort(-score.double(), stable=True)[:k]).values


@torch.no_grad()
def mlp_unit_scores(
    family: Family, mask: HeadMask, calibration: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Importance of each MLP hidden unit, per block, for the member that keeps `mask`'s heads.

    Under torch.distributed the activation sums of every rank's shard are all-reduced.
    """
    slots = [family.mlp(b) for b in range(family.num_blocks)]
    fc2_norms = [s.fc2.get().weight.norm(dim=0) for s in slots]
    if not calibration:
        return [s.fc1.get().weight.norm(dim=1) * n for s, n in zip(slots, fc2_norms)]
    sums = [torch.zeros_like(n) for n in fc2_norms]
    count = torch.zeros(1, dtype=torch.float64)
    hooks = []
    for i, s in enumerate(slots):

        def hook(_mod, _inp, out, i=i):
            flat = out.detach().abs().reshape(-1, out.shape[-1])
            sums[i] += flat.sum(0).to(sums[i])
            if i == 0:
                count[0] += flat.shape[0]

        hooks.append(s.act.register_forward_hook(hook))
    was_training = family.model.training
    family.model.eval()
    try:
        with family.masked(HeadMask(mask.blocks)):  # the member's heads, every MLP unit
            for x in calibration:
                if len(x):
                    family.logits(x)
    finally:
        for h in hooks:
            h.remove()
        family.model.train(was_training)
    total = float(all_reduce_sum(count)[0])
    return [all_reduce_sum(s) / max(total, 1.0) * n for s, n in zip(sums, fc2_norms)]


def with_disjoint_units(
    family: Family, masks: Sequence[HeadMask], calibration: Sequence[torch.Tensor] | None
) -> list[HeadMask]:
    """Each block's MLP units dealt out round-robin by the full model's unit importance: member m
    keeps the units ranked m, m + M, m + 2M, ... (every unit to exactly one member, equally strong
    shares), so the members' MLPs are different functions of the same stream."""
    widths, m = family.mlp_widths(), len(masks)
    full = HeadMask.full(family.heads_per_block())
    ranks = [torch.argsort(-s.double(), stable=True) for s in mlp_unit_scores(family, full, calibration)]
    return [mask.with_units([sorted(r[i::m].tolist()) for r in ranks], widths) for i, mask in enumerate(masks)]


def with_top_units(
    family: Family, masks: Sequence[HeadMask], keep_ratio: float, calibration: Sequence[torch.Tensor] | None
) -> list[HeadMask]:
    """Each mask keeping, per block, the `keep_ratio` share of MLP units its member scores highest."""
    widths = family.mlp_widths()
    keeps = [max(1, int(round(keep_ratio * w))) for w in widths]
    out = []
    for mask in masks:
        scores = mlp_unit_scores(family, mask, calibration)
        out.append(mask.with_units([top_units(s, k).tolist() for s, k in zip(scores, keeps)], widths))
    return out
