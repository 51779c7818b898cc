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
from compressor.distributed import gather_cat, shard
from compressor.registry import register_pruner
from pruners.base import Batch
from pruners.scored import ScoredPruner


def _nll(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits, y))


def _brier(logits: torch.Tensor, y: torch.Tensor) -> float:
    p = logits.softmax(-1)
    return float(((p - F.one_hot(y, p.shape[-1]).to(p.dtype)) ** 2).sum(-1).mean())


def _error(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) != y).double().mean())


METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], float]] = {"nll": _nll, "brier": _brier, "error": _error}


@torch.no_grad()
def evaluate_metric(adapter: ModelAdapter, data: Sequence[Batch], metric: str = "nll") -> float:
    """The metric (lower is better) of the model as currently gated, over all of `data`.

    Under torch.distributed each rank runs its slice of every batch and the logits are gathered.
    """
    logits = torch.cat([gather_cat(adapter.logits(shard(b)[0]).float()) for b in data])
    y = torch.cat([b[1] for b in data])
    return METRICS[metric](logits, y)


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
