"""The uncertainty scores, each computed by one torch function (higher = more uncertain / more OOD).

`metrics` (numpy, chunked), `calibration` (the OOD threshold), `predict` (per-sample rows) and
training (the disagreement reward) all call these. `probs` is [..., C]; `member_probs` [M, ..., C].
"""

from __future__ import annotations

import torch

from compressor.core.errors import OptionError

EPS = 1e-12
OOD_SCORES = ("msp", "entropy", "mi", "mahalanobis")  # the names a recipe and an export use
ENSEMBLE_SCORES = ("mi",)  # need more than one member
FEATURE_SCORES = ("mahalanobis",)  # read pooled features, not probabilities (compressor.uq.posthoc)


def max_prob(probs: torch.Tensor) -> torch.Tensor:
    """Negative maximum softmax probability."""
    return -probs.amax(-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Predictive entropy in nats (probabilities clipped at EPS inside the log)."""
    return -(probs * probs.clamp(EPS, 1.0).log()).sum(-1)


def mutual_information(member_probs: torch.Tensor) -> torch.Tensor:
    """Epistemic part of the entropy: H(mean_m p_m) - mean_m H(p_m). Zero for a single model."""
    return entropy(member_probs.mean(0)) - entropy(member_probs).mean(0)


def energy(logits: torch.Tensor) -> torch.Tensor:
    """Energy score (Liu et al. 2020): -logsumexp of the logits (temperature 1)."""
    return -torch.logsumexp(logits, dim=-1)


def ood_score(member_probs: torch.Tensor, score: str, probs: torch.Tensor | None = None) -> torch.Tensor:
    """Per sample, the named OOD score: max-softmax or entropy of the ensemble prediction `probs`
    (default: the members' mean), or the members' mutual information."""
    p = member_probs.mean(0) if probs is None else probs
    if score == "msp":
        return max_prob(p)
    if score == "entropy":
        return entropy(p)
    if score == "mi":
        return mutual_information(member_probs)
    if score in FEATURE_SCORES:
        raise OptionError(f"ood score: '{score}' reads pooled features, not probabilities (see Calibrated.scored)")
    raise OptionError(f"ood score: expected one of {', '.join(OOD_SCORES)}, got '{score}'")
