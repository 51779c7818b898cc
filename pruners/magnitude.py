"""Magnitude pruning: a head's importance is the L2 norm of its Q/K/V rows and output columns."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compressor.adapters import ModelAdapter
from compressor.registry import register_pruner
from pruners.base import Batch
from pruners.scored import ScoredPruner


def head_magnitudes(adapter: ModelAdapter, block: int, p: float = 2.0) -> torch.Tensor:
    """Norm over each head's parameters: q/k/v rows (weights and biases) and proj columns.

    This is torch-pruning's group magnitude importance (`GroupMagnitudeImportance`, p-norm summed
    over every coupled parameter of a channel group) with the head as the group.
    """
    w = adapter.head_weights(block)
    parts = [w.q, w.k, w.v, w.o.permute(1, 2, 0)]
    parts += [b for b in (w.q_bias, w.k_bias, w.v_bias) if b is not None]
    total = sum(t.detach().abs().pow(p).flatten(1).sum(1) for t in parts)
    return total.pow(1.0 / p)


@register_pruner("magnitude")
class MagnitudePruner(ScoredPruner):
    """Data-free: keep the heads with the largest Q/K/V and output-projection weight norms."""

    diversity_choices = ("jitter", "none")
    needs_data = False

    def head_scores(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None
    ) -> list[torch.Tensor]:
        return [head_magnitudes(adapter, b) for b in range(adapter.num_blocks)]
