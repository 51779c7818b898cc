"""Gradient-free "circuit" head importance: forward passes only, greedy, block by block.

For block l (blocks before it already pruned by the pruner's selection), mask each head in turn
and measure how much an objective on held-out data degrades; the score of a head is that
degradation. Objectives (lower is better):

- `nll`, `brier`, `error`: mean over held-out in-distribution samples (labels needed);
- `auroc`: 1 - AUROC of telling validation outliers from held-out in-distribution samples by the
  model's max-softmax probability (as currently gated); `fpr95`: the share of validation outliers
  accepted at the threshold that keeps 95% of held-out samples (the paper's uncertainty-aware
  circuit selection, with a validation outlier set that is never a test OOD set);
- `nll+auroc`, `nll+fpr95`: the sum of the two, equally weighted (NLL is ~0.1-1, the OOD terms 0-1).

Works zero-shot: nothing is differentiated and no weights change. A list of objectives gives
each member its own (a diversity lever).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from compressor.core.distributed import all_reduce_sum, gather_varlen
from compressor.core.errors import InputError, OptionError
from compressor.core.schema import Field
from compressor.families import Family
from compressor.plugins import Batch, Importance, checked_options
from compressor.uq.metrics import auroc, fpr_at_tpr
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
OOD_OBJECTIVES = ("auroc", "fpr95")
OBJECTIVES = (*METRICS, *OOD_OBJECTIVES, "nll+auroc", "nll+fpr95")


@torch.no_grad()
def heldout_logits(family: Family, data: Sequence[Batch]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) of every non-empty batch of `data`, for the model as currently gated."""
    out = []
    for x, y, *_ in data:
        if len(y):
            logits = family.logits(x).float()
            out.append((logits, y.to(logits.device)))
    return out


def metric_mean(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], metric: str) -> float:
    """A per-sample metric's mean over (logits, labels) pairs; all-reduced under torch.distributed."""
    total = torch.zeros(2, dtype=torch.float64)
    for logits, y in pairs:
        per_sample = METRICS[metric](logits, y).double().cpu()
        total += torch.stack([per_sample.sum(), torch.tensor(float(len(y)), dtype=torch.float64)])
    total = all_reduce_sum(total)
    return float(total[0] / total[1].clamp_min(1))


@torch.no_grad()
def evaluate_metric(family: Family, data: Sequence[Batch], metric: str = "nll") -> float:
    """The metric's mean over every sample of `data`, for the model as currently gated.

    Under torch.distributed each rank evaluates its shards; sums and counts are all-reduced.
    """
    return metric_mean(heldout_logits(family, data), metric)


def _max_softmax_ood(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    parts = [-x.float().softmax(-1).amax(-1).cpu() for x in logits]
    return gather_varlen(torch.cat(parts) if parts else torch.zeros(0))


@torch.no_grad()
def msp_ood_objective(
    family: Family,
    heldout: Sequence[Batch],
    outliers: Sequence[torch.Tensor],
    kind: str,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> float:
    """1 - AUROC, or FPR95, of separating `outliers` from `heldout` inputs by max-softmax
    probability (OOD positive, score = -max prob), for the model as currently gated. `pairs`: the
    held-out logits when already computed (they are then not recomputed)."""
    pairs = heldout_logits(family, heldout) if pairs is None else pairs
    s_in = _max_softmax_ood([logits for logits, _ in pairs])
    s_out = _max_softmax_ood([family.logits(x) for x in outliers if len(x)])
    if kind == "auroc":
        return 1.0 - auroc(s_in, s_out)
    return fpr_at_tpr(s_in, s_out)


def evaluate_objective(
    family: Family, heldout: Sequence[Batch], outliers: Sequence[torch.Tensor] | None, objective: str
) -> float:
    """One objective (see the module docstring) for the model as currently gated; lower is better.
    The held-out inputs go through the model once, whatever the number of parts."""
    parts = objective.split("+")
    if any(part not in METRICS for part in parts) and not outliers:
        raise InputError(f"gradient_free: objective '{objective}' needs validation outliers (none given)")
    pairs = heldout_logits(family, heldout)
    total = 0.0
    for part in parts:
        if part in METRICS:
            total += metric_mean(pairs, part)
        else:
            total += msp_ood_objective(family, heldout, outliers, part, pairs=pairs)
    return total


def _objectives(v: str | list) -> str | None:
    names = v if isinstance(v, list) else [v]
    ok = names and all(n in OBJECTIVES for n in names)
    return None if ok else f"one of {', '.join(OBJECTIVES)} (or a list of them, one per member)"


CIRCUIT_OPTIONS = {
    "metric": Field((str, list), "nll", check=_objectives, doc="the held-out objective heads are kept for"),
}


class CircuitImportance(Importance):
    """Per block, how much a held-out objective worsens when each head is masked (earlier blocks pruned)."""

    def __init__(self, metric: str = "nll") -> None:
        schema = {"metric": Field((str,), "nll", choices=OBJECTIVES)}
        self.metric = checked_options({"metric": metric}, schema)["metric"]

    def __call__(
        self,
        family: Family,
        calibration: Sequence[Batch],
        heldout: Sequence[Batch] | None = None,
        outliers: Sequence[torch.Tensor] | None = None,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        data = heldout or calibration
        if not data:
            raise InputError("gradient_free: needs held-out batches (labelled data)")
        objective = lambda: evaluate_objective(family, data, outliers, self.metric)  # noqa: E731
        scores = []
        with family.gates_restored() as gates:
            for block in range(family.num_blocks):
                ref = objective()
                s = torch.zeros(family.num_heads(block))
                for h in range(family.num_heads(block)):
                    if gates[block][h] == 0:
                        s[h] = float("-inf")
                        continue
                    saved = gates[block][h].clone()
                    gates[block][h] = 0
                    s[h] = objective() - ref
                    gates[block][h] = saved
                if keep is not None:
                    gates[block].mul_(keep(s).to(gates[block].dtype))
                scores.append(s)
        return scores


class GradientFreePruner(TopKPruner):
    """Circuit selection: per block, keep heads whose masking worsens a held-out objective most."""

    def __init__(self, metric: str | list[str] = "nll", **kwargs) -> None:
        metric = checked_options({"metric": metric}, CIRCUIT_OPTIONS)["metric"]
        metrics = metric if isinstance(metric, list) else [metric]
        super().__init__(importance=CircuitImportance(metrics[0]), **kwargs)
        if len(metrics) not in (1, self.members):
            raise OptionError(f"metric: expected one objective or a list of {self.members} (one per member)")
        self.importances = [CircuitImportance(m) for m in metrics]
