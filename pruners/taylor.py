"""First-order Taylor head importance (Michel et al. 2019, "Are Sixteen Heads Really Better
than One?"): |sum over calibration batches of dL/d gate_h|, with a gate of 1 on each head."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from compressor.core.distributed import all_reduce_sum
from compressor.core.errors import InputError
from compressor.families import Family
from compressor.plugins import Batch, Importance
from pruners.topk import TopKPruner


def taylor_scores(family: Family, calibration: Sequence[Batch]) -> list[torch.Tensor]:
    """Per block, |sum_batches dL/dg| for gates g at their current values (1 for kept heads).

    L is each batch's mean cross-entropy. Under torch.distributed each rank holds its shard of
    every batch: it differentiates its summed loss divided by the global batch size and the sums
    are all-reduced, which is the number one process computes on the whole batches.
    """
    if not calibration:
        raise InputError("taylor: needs calibration batches (labelled data)")
    global_sizes = all_reduce_sum(torch.tensor([float(len(b[1])) for b in calibration], dtype=torch.float64))
    with family.gates_restored(requires_grad=True) as gates:
        total = [torch.zeros(g.shape, dtype=torch.float64) for g in gates]
        for (x, y, *_), size in zip(calibration, global_sizes):
            if len(y) == 0:  # this rank's shard of the last batch can be empty
                continue
            logits = family.logits(x).float()
            loss = F.cross_entropy(logits, y.to(logits.device), reduction="sum") / float(size)
            for t, g in zip(total, torch.autograd.grad(loss, gates)):
                t += g.double().cpu()
    return [all_reduce_sum(t).abs().float() for t in total]


class TaylorImportance(Importance):
    """|sum dL/d gate_h| over labelled calibration batches (Michel et al. 2019)."""

    def __call__(
        self,
        family: Family,
        calibration: Sequence[Batch],
        heldout: Sequence[Batch] | None = None,
        outliers: Sequence[torch.Tensor] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        return taylor_scores(family, calibration)


class TaylorPruner(TopKPruner):
    """Keep heads with the largest first-order Taylor importance |sum dL/d gate| (needs labels)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(importance=TaylorImportance(), **kwargs)
