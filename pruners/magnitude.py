"""Magnitude importance: a head's score is the L2 norm of its Q/K/V rows and output columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from compressor.families import Family
from compressor.plugins import Batch, Importance
from pruners.topk import TopKPruner


def head_magnitudes(family: Family, block: int, p: float = 2.0) -> torch.Tensor:
    """Norm over each head's parameters: q/k/v rows (weights and biases) and proj columns.

    This is torch-pruning's group magnitude importance (`GroupMagnitudeImportance`, p-norm summed
    over every coupled parameter of a channel group) with the head as the group.
    """
    w = family.head_weights(block)
    parts = [w.q, w.k, w.v, w.o.permute(1, 2, 0)]
    parts += [b for b in (w.q_bias, w.k_bias, w.v_bias) if b is not None]
    total = sum(t.detach().abs().pow(p).flatten(1).sum(1) for t in parts)
    return total.pow(1.0 / p)


class MagnitudeImportance(Importance):
    """Data-free: the p-norm of each head's Q/K/V rows and output-projection columns."""

    needs_data = False

    def __init__(self, p: float = 2.0) -> None:
        self.p = p

    def __call__(
        self,
        family: Family,
        calibration: Sequence[Batch] = (),
        heldout: Sequence[Batch] | None = None,
        outliers: Sequence[torch.Tensor] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        return [head_magnitudes(family, b, self.p) for b in range(family.num_blocks)]


class MagnitudePruner(TopKPruner):
    """Data-free: keep the heads with the largest Q/K/V and output-projection weight norms."""

    diversity_choices = ("jitter", "none")

    def __init__(self, **kwargs) -> None:
        super().__init__(importance=MagnitudeImportance(), **kwargs)
