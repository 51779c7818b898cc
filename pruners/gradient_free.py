"""Gradient-free "circuit" head selection: forward passes only, greedy, layer by layer.

For block l (blocks before it already pruned), mask each head in turn and measure how much a
metric on held-out data degrades; keep the heads whose removal hurts most. Works zero-shot: no
labels are differentiated, no weights change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from compressor.adapters import ModelAdapter
from compressor.distributed import all_reduce_sum
from compressor.registry import register_pruner
from pruners.base import Batch
from pruners.scored import ScoredPruner


def _nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def _brier(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = logits.softmax(-1)
    return ((p - F.one_hot(y, p.shape[-1]).to(p.dtype)) ** 2).sum(-1)


def _error(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) != y).to(logits.dtype)


# per-sample metrics (lower is better); the score of a set is their mean
METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "nll": _nll,
    "brier": _brier,
    "error": _error,
}


@torch.no_grad()
def evaluate_metric(adapter: ModelAdapter, data: Sequence[Batch], metric: str = "nll") -> float:
    """The metric's mean over every sample of `data`, for the model as currently gated.

    Under torch.distributed each rank evaluates its shards; sums and counts are all-reduced.
    """
    total = torch.zeros(2, dtype=torch.float64)
    for x, y, *_ in data:
        if len(y):
            per_sample = METRICS[metric](adapter.logits(x).float(), y)
            total += torch.stack([per_sample.double().sum(), torch.tensor(float(len(y)), dtype=torch.float64)])
    total = all_reduce_sum(total)
    return float(total[0] / total[1].clamp_min(1))


@register_pruner("gradient_free")
class GradientFreePruner(ScoredPruner):
    """Circuit selection: per block, keep heads whose masking raises a held-out metric most."""

    def __init__(self, metric: str = "nll", **kwargs) -> None:
        super().__init__(**kwargs)
        if metric not in METRICS:
            raise ValueError(f"metric: expected one of {', '.join(METRICS)}, got '{metric}'")
        self.metric = metric
        self._member = 0

    def member_scores(self, adapter, calibration, heldout, member):
        self._member = member
        return super().member_scores(adapter, calibration, heldout, member)

    def head_scores(
        self, adapter: ModelAdapter, calibration: Sequence[Batch], heldout: Sequence[Batch] | None
    ) -> list[torch.Tensor]:
        data = heldout or calibration
        if not data:
            raise ValueError("gradient_free: needs held-out batches (labelled data)")
        previous = [g.detach().clone() for g in adapter.install_gates()]
        gates = [g.clone() for g in previous]
        adapter.set_gates(gates)
        scores = []
        try:
            for block in range(adapter.num_blocks):
                ref = evaluate_metric(adapter, data, self.metric)
                s = torch.zeros(adapter.num_heads(block))
                for h in range(adapter.num_heads(block)):
                    if gates[block][h] == 0:
                        s[h] = float("-inf")
                        continue
                    saved = gates[block][h].clone()
                    gates[block][h] = 0
                    s[h] = evaluate_metric(adapter, data, self.metric) - ref
                    gates[block][h] = saved
                keep = self.select([s], self._member).blocks[0]
                gates[block].mul_(keep.to(gates[block].dtype))
                scores.append(s)
        finally:
            adapter.set_gates(previous)
        return scores
