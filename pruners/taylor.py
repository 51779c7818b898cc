"""First-order Taylor head importance (Michel et al. 2019, "Are Sixteen Heads Really Better
than One?"): |sum over calibration batches of dL/d gate_h|, with a gate of 1 on each head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from compressor.adapters import ModelAdapter
from compressor.distributed import all_reduce_sum, shard
from compressor.registry import register_pruner
from pruners.base import Batch
from pruners.scored import ScoredPruner


def taylor_scores(adapter: ModelAdapter, calibration: Sequence[Batch]) -> list[torch.Tensor]:
    """Per block, |sum_batches dL/dg| for gates g at their current values (1 for kept heads).

    L is each batch's mean cross-entropy. Under torch.distributed every rank differentiates its
    slice's summed loss divided by the global batch size and the sums are all-reduced: the same
    number one process computes.
    """
    if not calibration:
        raise ValueError("taylor: needs calibration batches (labelled data)")
    previous = [g.detach().clone() for g in adapter.install_gates()]
    gates = [g.clone().requires_grad_(True) for g in previous]
    adapter.set_gates(gates)
    total = [torch.zeros_like(g, dtype=torch.float64) for g in gates]
    try:
        for batch in calibration:
            x, y = shard(batch)[:2]
            loss = F.cross_entropy(adapter.logits(x), y, reduction="sum") / batch[1].shape[0]
            grads = torch.autograd.grad(loss, gates)
            for t, g in zip(total, grads):
                t += g.double()
    finally:
        adapter.set_gates(previous)
    return [all_reduce_sum(t).abs().float() for t in total]


@register_pruner("taylor")
class TaylorPruner(ScoredPruner):
    """Keep heads with the largest first-order Taylor importance |sum dL/d gate| (needs labels)."""

    def head_scores(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None
    ) -> list[torch.Tensor]:
        return taylor_scores(adapter, calibration)
