"""Gradient-free "circuit" head importance: forward passes only, greedy, block by block.

For block l (blocks before it already pruned by the pruner's selection), mask each head in turn
and measure how much a metric on held-out data degrades; the score of a head is that
degradation. Works zero-shot: no labels are differentiated, no weights change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from compressor.distributed import all_reduce_sum
from compressor.errors import InputError, OptionError
from compressor.families import Family
from compressor.plugins import Batch, Importance
from pruners.topk import TopKPruner


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
def evaluate_metric(family: Family, data: Sequence[Batch], metric: str = "nll") -> float:
    """The metric's mean over every sample of `data`, for the model as currently gated.

    Under torch.distributed each rank evaluates its shards; sums and counts are all-reduced.
    """
    total = torch.zeros(2, dtype=torch.float64)
    for x, y, *_ in data:
        if len(y):
            per_sample = METRICS[metric](family.logits(x).float(), y)
            total += torch.stack([per_sample.double().sum(), torch.tensor(float(len(y)), dtype=torch.float64)])
    total = all_reduce_sum(total)
    return float(total[0] / total[1].clamp_min(1))


class CircuitImportance(Importance):
    """Per block, how much a held-out metric rises when each head is masked (earlier blocks pruned)."""

    def __init__(self, metric: str = "nll") -> None:
        if metric not in METRICS:
            raise OptionError(f"metric: expected one of {', '.join(METRICS)}, got '{metric}'")
        self.metric = metric

    def __call__(
        self,
        family: Family,
        calibration: Sequence[Batch],
        heldout: Sequence[Batch] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        data = heldout or calibration
        if not data:
            raise InputError("gradient_free: needs held-out batches (labelled data)")
        previous = [g.detach().clone() for g in family.install_gates()]
        gates = [g.clone() for g in previous]
        family.set_gates(gates)
        scores = []
        try:
            for block in range(family.num_blocks):
                ref = evaluate_metric(family, data, self.metric)
                s = torch.zeros(family.num_heads(block))
                for h in range(family.num_heads(block)):
                    if gates[block][h] == 0:
                        s[h] = float("-inf")
                        continue
                    saved = gates[block][h].clone()
                    gates[block][h] = 0
                    s[h] = evaluate_metric(family, data, self.metric) - ref
                    gates[block][h] = saved
                if keep is not None:
                    gates[block].mul_(keep(s).to(gates[block].dtype))
                scores.append(s)
        finally:
            family.set_gates(previous)
        return scores


class GradientFreePruner(TopKPruner):
    """Circuit selection: per block, keep heads whose masking raises a held-out metric most."""

    def __init__(self, metric: str = "nll", **kwargs) -> None:
        super().__init__(importance=CircuitImportance(metric), **kwargs)
