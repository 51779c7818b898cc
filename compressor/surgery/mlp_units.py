"""MLP hidden-unit importance, per member: which units a member keeps when its MLP is narrowed.

The same rule for every model family (the family layer finds the MLP): a unit's score is its mean
|activation| on calibration inputs, with the member's head mask applied, times the norm of its
output weights (without calibration data: the product of its input and output weight norms).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.core.distributed import all_reduce_sum
from compressor.core.errors import OptionError
from compressor.core.masks import HeadMask
from compressor.core.modes import evaluating
from compressor.families import Family


def top_units(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest-scored units, in increasing order (ties broken by index)."""
    return torch.sort(torch.argsort(-score.double(), stable=True)[:k]).values


@torch.no_grad()
def mlp_unit_scores(
    family: Family, mask: HeadMask, calibration: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Importance of each MLP hidden unit, per block, for the member that keeps `mask`'s heads
    (and only its units, when `mask` names them: an iterative prune re-scores a pruned model).

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
    try:
        with evaluating(family.model), family.masked(mask):  # the member's heads (and units, when named)
            for x in calibration:
                if len(x):
                    family.logits(x)
    finally:
        for h in hooks:
            h.remove()
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


def unit_scores(
    family: Family, mask: HeadMask, calibration: Sequence[tuple] | None, criterion: str = "activation"
) -> list[torch.Tensor]:
    """Per block, each MLP unit's importance for the member `mask` describes: `activation` (this
    project's rule, `mlp_unit_scores`) or torch-pruning's `taylor`, `magnitude`, `hessian`."""
    batches = list(calibration or [])
    if criterion == "activation":  # inputs only: (inputs, labels) batches or bare input tensors
        return mlp_unit_scores(family, mask, [b[0] if isinstance(b, (tuple, list)) else b for b in batches])
    if not all(isinstance(b, (tuple, list)) and len(b) > 1 for b in batches):
        raise OptionError(f"mlp_importance '{criterion}': needs labelled calibration batches")
    return tp_unit_scores(family, mask, batches, criterion)


def with_top_units(
    family: Family,
    masks: Sequence[HeadMask],
    keep_ratio: float,
    calibration: Sequence[tuple] | None,
    criterion: str = "activation",
) -> list[HeadMask]:
    """Each mask keeping, per block, the `keep_ratio` share of MLP units its member scores highest
    (`calibration`: (inputs, labels) batches, or input tensors for the activation rule).

    Units are scored with the member's heads only: a mask that already names units (one read back
    from a masks.json) gets the same choice as a fresh one, not one scored with its old units gated.
    """
    widths = family.mlp_widths()
    keeps = [max(1, int(round(keep_ratio * w))) for w in widths]
    out = []
    for mask in masks:
        scores = unit_scores(family, HeadMask(mask.blocks), calibration, criterion)
        out.append(mask.with_units([top_units(s, k).tolist() for s, k in zip(scores, keeps)], widths))
    return out


TP_CRITERIA = ("taylor", "magnitude", "hessian")  # torch-pruning's GroupTaylor / GroupMagnitude / GroupHessian


def tp_unit_scores(
    family: Family, mask: HeadMask, batches: Sequence[tuple], criterion: str = "taylor"
) -> list[torch.Tensor]:
    """Per block, torch-pruning's group importance of each MLP unit (the group rooted at fc1's
    output channels: fc1's rows and fc2's columns together), with the member's heads (and units,
    when the mask names them) gated.

    `taylor` and `hessian` differentiate the cross-entropy on labelled `batches` (hessian: per
    sample, on up to 64 samples); `magnitude` reads the weights only. torch-pruning's own
    normalisation (scores divided by their mean in each group) is kept.
    """
    import torch.nn.functional as F
    import torch_pruning as tp

    from compressor.surgery.physical import dependency_graph

    if criterion not in TP_CRITERIA:
        raise OptionError(f"mlp_importance: expected one of {', '.join(TP_CRITERIA)} or activation, got '{criterion}'")
    imp = {
        "taylor": tp.importance.GroupTaylorImportance,
        "magnitude": tp.importance.GroupMagnitudeImportance,
        "hessian": tp.importance.GroupHessianImportance,
    }[criterion]()
    model = family.model
    graph = dependency_graph(family)
    with family.masked(mask):
        model.zero_grad(set_to_none=True)
        if criterion == "taylor":
            for x, y, *_ in batches:
                logits = family.logits(x).float()
                F.cross_entropy(logits, y.to(logits.device), reduction="sum").div(len(y)).backward()
        elif criterion == "hessian":
            seen = 0
            for x, y, *_ in batches:
                for i in range(len(y)):
                    if seen >= 64:
                        break
                    model.zero_grad(set_to_none=True)
                    logits = family.logits(x[i : i + 1]).float()
                    F.cross_entropy(logits, y[i : i + 1].to(logits.device)).backward()
                    imp.accumulate_grad(model)
                    seen += 1
        scores = []
        for b in range(family.num_blocks):
            fc1 = family.mlp(b).fc1.get()
            group = graph.get_pruning_group(fc1, tp.prune_linear_out_channels, idxs=list(range(fc1.out_features)))
            scores.append(imp(group).detach().float().cpu())
    model.zero_grad(set_to_none=True)
    return scores
