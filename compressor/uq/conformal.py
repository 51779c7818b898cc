"""Split-conformal prediction sets: a set of classes per input that holds the true class with a
probability of at least `coverage`, over exchangeable data, whatever the model.

Fitted on a held-out split: each sample's nonconformity score of its true class; the threshold is
the ceil((n + 1) * coverage)-th smallest (Vovk et al. 2005; Angelopoulos & Bates 2021). Two scores:
- `lac` (Sadinle et al. 2019): 1 - p(class); the set is every class with p >= 1 - threshold. The
  smallest sets on average; a set may be empty (no class is likely enough).
- `aps` (Romano et al. 2020), without randomisation: the probability mass of the classes ranked
  above a class plus its own; the set takes classes from the most probable down while that mass
  stays within the threshold, so its size follows how unsure the model is. A set that would be
  empty (the top class alone above the threshold: a very confident input) holds the top class,
  which adds coverage only there. (Keeping the class that crosses the threshold, MAPIE's
  `include_last_label=True`, over-covers: 0.967 for 0.9 on the synthetic test.)
Both cover at least `coverage` on average; with continuous scores, the exact rules (LAC, APS
without the top-class fill) at most coverage + 1/(n + 1).
"""

from __future__ import annotations

import math

import torch

from compressor.core.errors import MetricInputError
from compressor.uq.metric_inputs import check_labels, check_prob_values

CONFORMAL_METHODS = ("lac", "aps")
DEFAULT_COVERAGE = 0.9


def _check(probs: torch.Tensor, fn: str) -> torch.Tensor:
    """`probs` checked by the metrics' validator, as float64."""
    return torch.as_tensor(check_prob_values(probs, fn)).double()


def _check_method(method: str) -> None:
    if method not in CONFORMAL_METHODS:
        raise MetricInputError(f"conformal: method: expected one of {', '.join(CONFORMAL_METHODS)}, got {method!r}")


def _mass_above(p: torch.Tensor) -> torch.Tensor:
    """Per class, the probability mass of the classes ranked strictly above it (ties by index)."""
    order = p.argsort(dim=-1, descending=True, stable=True)
    sorted_p = p.gather(-1, order)
    above_sorted = sorted_p.cumsum(-1) - sorted_p
    return torch.empty_like(p).scatter_(-1, order, above_sorted)


def class_scores(probs: torch.Tensor, method: str) -> torch.Tensor:
    """[N, C] nonconformity score each class would have (lower = more conforming)."""
    _check_method(method)
    p = _check(probs, "class_scores")
    return 1.0 - p if method == "lac" else _mass_above(p) + p


def conformal_threshold(probs: torch.Tensor, labels: torch.Tensor, method: str, coverage: float = 0.9) -> float:
    """The split-conformal threshold for `coverage` from held-out `probs` [N, C] and `labels` [N]."""
    if not 0.0 < coverage < 1.0:
        raise MetricInputError(f"conformal_threshold: coverage: expected a share in (0, 1), got {coverage}")
    scores = class_scores(probs, method)
    n, classes = scores.shape
    labels = torch.from_numpy(check_labels(labels, n, classes, "conformal_threshold"))
    k = math.ceil((n + 1) * coverage)
    if k > n:
        raise MetricInputError(
            f"conformal_threshold: {n} held-out samples cannot certify coverage {coverage}: "
            f"needs at least {math.ceil(coverage / (1 - coverage))}"
        )
    true = scores[torch.arange(n), labels.long()]
    return float(true.sort().values[k - 1])


def prediction_sets(probs: torch.Tensor, threshold: float, method: str, never_empty: bool = True) -> torch.Tensor:
    """[N, C] boolean membership of each class in each input's set (`never_empty`: an APS set that
    would be empty, the top class alone above the threshold, holds the top class)."""
    p = _check(probs, "prediction_sets")
    if method == "lac":
        return class_scores(p, "lac") <= threshold
    _check_method(method)
    sets = class_scores(p, "aps") <= threshold
    if never_empty:
        sets |= torch.zeros_like(sets).scatter_(-1, p.argmax(-1, keepdim=True), True)
    return sets


def coverage_and_size(sets: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Share of inputs whose set holds the true class, and the mean set size."""
    covered = sets[torch.arange(len(labels)), labels.long()]
    return float(covered.double().mean()), float(sets.sum(-1).double().mean())


def fit_conformal(
    probs: torch.Tensor, labels: torch.Tensor, coverage: float = DEFAULT_COVERAGE, method: str = "lac"
) -> dict:
    """What an export records: the coverage, the method `predict` uses, and every method's threshold."""
    _check_method(method)
    thresholds = {m: conformal_threshold(probs, labels, m, coverage) for m in CONFORMAL_METHODS}
    return {"coverage": float(coverage), "method": method, **thresholds}
