"""Post-hoc calibration and the deployed OOD threshold.

- Temperature scaling (Guo et al. 2017). By default ONE temperature for the ensemble, applied to
  the log of its averaged member probabilities: softmax(log mean_m p_m / T). The argmax never
  changes and the members' own probabilities (mutual information, disagreement) are untouched.
  A recipe may ask for one temperature per member instead (`scope="member"`: each member's logits
  divided by its own temperature before averaging; this reweights members and may move the argmax).
- A guarded fit (`fit_checked_temperature`): temperatures are bounded; the fit is judged by
  cross-fitting (each fold scored with a temperature fitted on the other folds) and kept only when
  it lowers the held-out NLL beyond noise; a held-out split with few errors holds no evidence for
  a temperature below 1, so only T >= 1 is fitted there. A nearly all-correct, small held-out
  split otherwise drives the temperature to 0 and every probability to 1.
- An OOD threshold: the score (max-softmax, entropy or, for ensembles, mutual information) that
  keeps `tpr` (default 95%) of held-out in-distribution samples; `predict` flags samples above it.
  A threshold that accepts every held-out and every validation-outlier input is refused.

`compressor.uq.calibrated.Calibrated` wraps any model with both; the export stores them and
`compressor.load` restores them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from compressor.core.errors import MetricInputError
from compressor.uq.metric_inputs import check_labels, check_member_logits
from compressor.uq.metrics import tpr_threshold
from compressor.uq.outputs import EnsembleOutput

TEMPERATURE_SCOPES = ("ensemble", "member")
TEMPERATURE_BOUNDS = (0.05, 20.0)
MIN_ERRORS_BELOW_ONE = 20  # fewer held-out errors than this: no evidence for a temperature below 1
SATURATION_SHARE = 0.05  # warn when more than this share of held-out scores tie at the most confident value
CHECK_FOLDS = 5
NOISE_SE = 2.0  # a temperature is kept when its cross-fitted NLL gain exceeds this many standard errors


def ensemble_log_probs(member_logits: torch.Tensor) -> torch.Tensor:
    """log mean_m softmax(logits_m): the ensemble's log-probabilities, [N, C] from [M, N, C]."""
    m = member_logits.shape[0]
    return torch.logsumexp(member_logits.log_softmax(-1), dim=0) - math.log(m)


def calibrated_probs(member_logits: torch.Tensor, temperature: torch.Tensor, scope: str = "ensemble") -> torch.Tensor:
    """The ensemble's probabilities [N, C] under `temperature` ([1] for scope 'ensemble', [M] or [1] for 'member')."""
    t = temperature.to(member_logits.device, member_logits.dtype)
    if scope == "member":
        return (member_logits / t.view(-1, 1, 1)).softmax(-1).mean(0)
    return (ensemble_log_probs(member_logits) / t.view(())).softmax(-1)


def apply_temperature(member_logits: torch.Tensor, temperature: torch.Tensor, scope: str) -> EnsembleOutput:
    """What a calibrated model outputs: its member logits (divided by their temperatures for scope
    'member', untouched for 'ensemble') and its ensemble prediction, in float64 so that scores do
    not saturate at 1.0 (the calibrate step and `predict` score exactly this)."""
    if scope == "member":
        member_logits = member_logits / temperature.to(member_logits.device, member_logits.dtype).view(-1, 1, 1)
        return EnsembleOutput(member_logits, member_logits.double().softmax(-1).mean(0))
    return EnsembleOutput(member_logits, calibrated_probs(member_logits.double(), temperature, "ensemble"))


def _nll_per_sample(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return -probs[torch.arange(len(labels)), labels].clamp_min(1e-12).log()


def _fit_ensemble(log_probs: torch.Tensor, labels: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """The T in [lo, hi] minimising the NLL of softmax(log_probs / T): golden-section search on
    1/T, over which the NLL is convex (a one-parameter logistic model)."""
    x = log_probs.double()
    y = labels

    def loss(beta: float) -> float:
        z = x * beta
        return float((torch.logsumexp(z, -1) - z[torch.arange(len(y)), y]).mean())

    a, b = 1.0 / hi, 1.0 / lo
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    beta = min([(loss(1.0 / hi), 1.0 / hi), (loss(1.0 / lo), 1.0 / lo), (loss((a + b) / 2), (a + b) / 2)])[1]
    return torch.tensor([1.0 / beta], dtype=torch.float32)


def _fit_members(logits: torch.Tensor, labels: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """One temperature per member (L-BFGS on log T, clamped to [lo, hi])."""
    logits = logits.double()
    log_t = torch.zeros(logits.shape[0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        t = log_t.clamp(math.log(lo), math.log(hi)).exp()
        loss = _nll_per_sample(calibrated_probs(logits, t, "member"), labels).mean()
        loss.backward()
        return loss

    opt.step(closure)
    return log_t.detach().exp().clamp(lo, hi).float()


def check_logits_and_labels(member_logits: torch.Tensor, labels: torch.Tensor, fn: str) -> torch.Tensor:
    """One-line `MetricInputError` unless `member_logits` is a finite [M, N, C] tensor with N >= 1
    and `labels` holds N integer class indices in [0, C) (the metrics' validators); the labels as int64."""
    check_member_logits(member_logits, fn)
    _, n, classes = member_logits.shape
    return torch.from_numpy(check_labels(labels, n, classes, fn)).to(member_logits.device)


def fit_temperature(
    member_logits: torch.Tensor,
    labels: torch.Tensor,
    per_member: bool = False,
    bounds: tuple[float, float] = TEMPERATURE_BOUNDS,
) -> torch.Tensor:
    """The temperature(s) in `bounds` minimising the held-out NLL of the calibrated ensemble:
    [1] on the ensemble's log-probabilities, or [M] per member (`per_member`). Refused when a
    temperature below 1 is allowed and the predictions it scales make no error on `labels`: the
    NLL then falls all the way to the lower bound (every probability pushed to 1)."""
    labels = check_logits_and_labels(member_logits, labels, "fit_temperature")
    logits = member_logits.detach()
    lo, hi = bounds
    if lo < 1.0:
        preds = logits.argmax(-1) if per_member else ensemble_log_probs(logits.double()).argmax(-1)[None]
        if bool((preds == labels).all(-1).any()):
            raise MetricInputError(
                f"fit_temperature: labels: {'a member' if per_member else 'the ensemble'} gets all {len(labels)} "
                "samples right, so the NLL falls with the temperature down to its bound; fit only T >= 1 "
                "(bounds=(1, ...)) or use fit_checked_temperature"
            )
    if per_member:
        return _fit_members(logits, labels, lo, hi)
    return _fit_ensemble(ensemble_log_probs(logits.double()), labels, lo, hi)


@dataclass
class TemperatureFit:
    """What `fit_checked_temperature` decided and why (the calibrate step reports it)."""

    temperature: torch.Tensor
    scope: str
    errors: int  # held-out samples the uncalibrated ensemble gets wrong
    samples: int
    nll_before: float  # cross-fitted held-out NLL at T = 1 (data the fit did not see)
    nll_after: float  # cross-fitted held-out NLL with temperatures fitted on the other folds
    fitted: list[float]  # the fit on the whole held-out split, before the check
    kept: bool  # the fitted temperature is used (else 1.0)
    notes: list[str] = field(default_factory=list)
    at_bound: bool = False  # the fit hit a bound of the allowed range


def fit_checked_temperature(
    member_logits: torch.Tensor,
    labels: torch.Tensor,
    per_member: bool = False,
    bounds: tuple[float, float] = TEMPERATURE_BOUNDS,
    folds: int = CHECK_FOLDS,
    seed: int = 0,
) -> TemperatureFit:
    """A temperature that cannot overfit a small, nearly all-correct held-out split.

    Fitted within `bounds`; only T >= 1 when the ensemble makes fewer than MIN_ERRORS_BELOW_ONE
    held-out errors; judged by `folds`-fold cross-fitting and kept only when the cross-fitted NLL
    gain exceeds NOISE_SE standard errors of the per-sample gains; otherwise 1.0.
    """
    labels = check_logits_and_labels(member_logits, labels, "fit_checked_temperature")
    logits = member_logits.detach().double()
    scope = "member" if per_member else "ensemble"
    ones = torch.ones(logits.shape[0] if per_member else 1)
    n = len(labels)
    errors = int((ensemble_log_probs(logits).argmax(-1) != labels).sum())
    notes: list[str] = []
    lo, hi = bounds
    if errors < MIN_ERRORS_BELOW_ONE:
        lo = max(lo, 1.0)
        notes.append(
            f"{errors} held-out errors (< {MIN_ERRORS_BELOW_ONE}): no evidence for a temperature below 1, "
            "only T >= 1 fitted"
        )
    before = _nll_per_sample(calibrated_probs(logits, ones, scope), labels)
    if n < 2 * folds:
        notes.append(f"{n} held-out samples: too few to check a fit, temperature 1.0 kept")
        nll = float(before.mean())
        return TemperatureFit(ones, scope, errors, n, nll, nll, ones.tolist(), False, notes)
    if per_member and lo < 1.0 and bool((logits.argmax(-1) == labels).all(-1).any()):
        lo = 1.0
        notes.append("a member makes no held-out error: only T >= 1 fitted")
    fold_of = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) % folds
    after = torch.empty_like(before)
    for k in range(folds):
        test, train = fold_of == k, fold_of != k
        t = fit_temperature(logits[:, train], labels[train], per_member, (lo, hi))
        after[test] = _nll_per_sample(calibrated_probs(logits[:, test], t, scope), labels[test])
    gain = before - after
    noise = NOISE_SE * float(gain.std()) / math.sqrt(n)
    fitted = fit_temperature(logits, labels, per_member, (lo, hi))
    kept = float(gain.mean()) > noise and float(gain.mean()) > 0
    if not kept and lo >= 1.0 and all(math.isclose(v, 1.0, rel_tol=1e-3) for v in fitted.tolist()):
        notes.append("the held-out NLL is lowest at a temperature <= 1: temperature 1.0 kept")
    elif not kept:
        notes.append(
            f"fitted temperature {_fmt(fitted)} does not lower the cross-fitted NLL beyond noise "
            f"(gain {float(gain.mean()):+.4f}, needs > {noise:.4f}): temperature 1.0 kept"
        )
    at_bound = [
        v
        for v in fitted.tolist()
        if math.isclose(v, bounds[0], rel_tol=1e-3) or math.isclose(v, bounds[1], rel_tol=1e-3)
    ]
    if at_bound:
        notes.append(f"WARNING: the fitted temperature {_fmt(fitted)} hit the bound {bounds}")
    t = fitted if kept else ones
    share = saturated_share(calibrated_probs(logits, t, scope).amax(-1))
    if share > SATURATION_SHARE:
        notes.append(f"WARNING: {share:.0%} of held-out confidences tie at the most confident value (saturated)")
    nll_before, nll_after = float(before.mean()), float(after.mean())
    return TemperatureFit(t, scope, errors, n, nll_before, nll_after, fitted.tolist(), kept, notes, bool(at_bound))


def _fmt(t: torch.Tensor) -> str:
    return ", ".join(f"{v:.3g}" for v in t.tolist())


def saturated_share(confidence: torch.Tensor) -> float:
    """Share of samples whose confidence ties at its most confident value (1.0 when saturated)."""
    if len(confidence) == 0:
        return 0.0
    return float((confidence == confidence.max()).double().mean())


def ood_threshold(scores_in: torch.Tensor, tpr: float = 0.95) -> float:
    """The smallest score that accepts (score <= it) at least `tpr` of in-distribution samples:
    the same threshold FPR95 is measured at (`compressor.uq.metrics.tpr_threshold`)."""
    return tpr_threshold(scores_in, tpr)


def checked_ood_threshold(
    scores_in: torch.Tensor, tpr: float, scores_outliers: torch.Tensor | None = None
) -> tuple[float | None, list[str]]:
    """The OOD threshold keeping `tpr` of held-out scores, or None when it would accept every
    held-out and every validation-outlier input (it would flag nothing); with notes on why."""
    notes = []
    threshold = ood_threshold(scores_in, tpr)
    share = saturated_share(-scores_in)  # ties at the most in-distribution (lowest) score
    if share > SATURATION_SHARE:
        notes.append(f"WARNING: {share:.0%} of held-out OOD scores tie at the most in-distribution value (saturated)")
    everything = [scores_in] + ([scores_outliers] if scores_outliers is not None and len(scores_outliers) else [])
    if all(threshold >= float(s.max()) for s in everything):
        notes.append(
            f"WARNING: the threshold {threshold:.4g} accepts every held-out"
            + (" and every validation-outlier" if len(everything) > 1 else "")
            + " input: refused, no OOD threshold stored"
        )
        return None, notes
    return threshold, notes
