"""Metrics off the clean path: every bad input is one `MetricInputError` naming the function and the
argument (never a silent number), and the risk-coverage metrics do not depend on sample order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compressor.core.errors import MetricInputError
from compressor.uq import metric_inputs
from compressor.uq import metrics as M


def probs_and_labels(n: int = 50, c: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(c), n)
    return p, rng.integers(0, c, n)


LABELLED = [M.accuracy, M.nll, M.brier, M.ece, M.adaptive_ece, M.reliability_bins, M.aurc, M.augrc, M.risk_coverage]


@pytest.mark.parametrize("fn", LABELLED, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "case, labels, message",
    [
        ("negative label", lambda y: np.r_[-1, y[1:]], r"labels: expected class indices in \[0, 4\), got -1"),
        ("label past the classes", lambda y: np.r_[4, y[1:]], r"labels: expected class indices in \[0, 4\)"),
        ("one label short", lambda y: y[:-1], r"labels: expected 50 labels \(one per row of probs\)"),
        ("one label too many", lambda y: np.r_[y, 0], r"labels: expected 50 labels"),
        ("fractional labels", lambda y: y + 0.5, r"labels: expected integer class indices"),
        ("NaN label", lambda y: np.r_[np.nan, y[1:]], r"labels: expected integer class indices"),
        ("whole-number floats", lambda y: y.astype(float), r"labels: expected integer class indices, got float64"),
        ("booleans", lambda y: y > 1, r"labels: expected integer class indices, got bool"),
        ("2-D labels", lambda y: y[:, None], r"labels: expected 50 labels"),
    ],
)
def test_bad_labels_are_refused(fn, case, labels, message):
    p, y = probs_and_labels()
    with pytest.raises(MetricInputError, match=rf"^{fn.__name__}: {message}"):
        fn(p, labels(y))


@pytest.mark.parametrize("fn", LABELLED, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "case, damage, message",
    [
        ("NaN probability", lambda p: np.where(np.arange(p.size).reshape(p.shape) == 5, np.nan, p), "NaN or infinite"),
        ("infinite probability", lambda p: np.where(np.arange(p.size).reshape(p.shape) == 0, np.inf, p), "NaN or inf"),
        ("logits", lambda p: np.log(p), r"expected probabilities .* logits\?"),
        ("empty", lambda p: p[:0], r"empty \(shape \(0, 4\)\)"),
        ("1-D", lambda p: p[:, 0], r"expected probabilities \[N, C\]"),
    ],
)
def test_bad_probabilities_are_refused(fn, case, damage, message):
    p, y = probs_and_labels()
    with pytest.raises(MetricInputError, match=rf"^{fn.__name__}: probs: .*{message}"):
        fn(damage(p), y[: len(damage(p))] if damage(p).ndim == 2 else y)


@pytest.mark.parametrize("fn", [M.auroc, M.aupr, M.fpr_at_tpr], ids=lambda f: f.__name__)
@pytest.mark.parametrize("side", ["score_in", "score_out"])
@pytest.mark.parametrize(
    "bad, message",
    [
        (np.nan, "1 of 30 scores are NaN or infinite"),
        (np.inf, "1 of 30 scores are NaN or infinite"),
        (None, "non-empty"),
    ],
)
def test_bad_ood_scores_are_refused(fn, side, bad, message):
    """A NaN score used to give AUROC 1.0 without complaint."""
    rng = np.random.default_rng(1)
    scores = {"score_in": rng.normal(0, 1, 30), "score_out": rng.normal(1, 1, 30)}
    if bad is None:
        scores[side] = scores[side][:0]
    else:
        scores[side][7] = bad
    where = "tpr_threshold" if fn is M.fpr_at_tpr and side == "score_in" else fn.__name__
    with pytest.raises(MetricInputError, match=rf"^{where}: {side}: .*{message}"):
        fn(scores["score_in"], scores["score_out"])


@pytest.mark.parametrize("fn", [M.disagreement, M.pairwise_kl, M.mutual_information_score], ids=lambda f: f.__name__)
def test_ensemble_metrics_refuse_logits_and_bad_shapes(fn):
    """disagreement and pairwise_kl used to take logits and return a number."""
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (3, 20, 5))
    with pytest.raises(MetricInputError, match=rf"^{fn.__name__}: member_probs: expected probabilities .* logits\?"):
        fn(logits)
    with pytest.raises(MetricInputError, match=rf"^{fn.__name__}: member_probs: expected probabilities \[M, N, C\]"):
        fn(rng.dirichlet(np.ones(5), 20))


def test_tpr_outside_zero_one_is_refused():
    with pytest.raises(MetricInputError, match=r"^tpr_threshold: tpr: expected a share in \(0, 1\], got 95"):
        M.fpr_at_tpr(np.zeros(10), np.ones(10), tpr=95)


def tied_case() -> tuple[np.ndarray, np.ndarray]:
    """Confidences 0.9, 0.9 (one right, one wrong) then 0.6, 0.6 (one right, one wrong)."""
    p = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    return p, np.array([0, 1, 0, 1])


def test_tied_confidences_hand_computed():
    """Equal confidences are one threshold: coverage 2/4 at risk 1/2, then 4/4 at risk 2/4.
    (Sample by sample, this order gave AURC (0 + 1/2 + 1/3 + 1/2) / 4 = 0.333, the reverse 0.667.)"""
    p, y = tied_case()
    coverage, risk = M.risk_coverage(p, y)
    np.testing.assert_allclose(coverage, [0.5, 1.0])
    np.testing.assert_allclose(risk, [0.5, 0.5])
    assert M.aurc(p, y) == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)
    assert M.augrc(p, y) == pytest.approx(0.5 * (0.5 * 0.5) + 0.5 * (0.5 * 1.0))
    assert M.aurc(p[::-1], y[::-1]) == M.aurc(p, y)


@pytest.mark.parametrize("seed", range(5))
def test_every_metric_is_invariant_to_sample_order(seed):
    """A model with many identical confidences (rounded probabilities): any shuffle, same values."""
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0, 1.5, (400, 3)), 0)  # few distinct rows: many ties
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    y = rng.integers(0, 3, 400)
    members = np.stack([p, np.roll(p, 1, axis=-1), p])
    perm = rng.permutation(400)
    base = M.classification_report(members, y)
    shuffled = M.classification_report(members[:, perm], y[perm])
    for key, value in base.items():
        assert shuffled[key] == pytest.approx(value, abs=1e-12), key
    s_in, s_out = M.max_prob_score(p[:200]), M.max_prob_score(p[200:])
    for fn in (M.auroc, M.aupr, M.fpr_at_tpr):
        assert fn(s_in[perm[perm < 200]], s_out) == pytest.approx(fn(s_in, s_out), abs=1e-12)


@pytest.mark.parametrize("fit", ["fit_temperature", "fit_checked_temperature"])
@pytest.mark.parametrize(
    "case, logits, labels, message",
    [
        ("NaN logit", lambda z: z.index_fill(1, torch.tensor([3]), float("nan")), None, "member_logits: NaN or inf"),
        ("2-D logits", lambda z: z[0], None, r"member_logits: expected \[M, N, C\] logits"),
        ("no samples", lambda z: z[:, :0], lambda y: y[:0], r"member_logits: expected \[M, N, C\]"),
        ("label out of range", None, lambda y: y + 5, r"labels: expected class indices in \[0, 4\)"),
        ("labels short", None, lambda y: y[:-1], "labels: expected 40 labels"),
        ("float labels", None, lambda y: y.double(), "labels: expected integer class indices"),
    ],
)
def test_temperature_fits_refuse_bad_inputs(fit, case, logits, labels, message):
    """A temperature fitted on NaN logits or mislabelled data is refused before any optimisation."""
    from compressor.uq import calibration

    z, y = torch.randn(3, 40, 4, generator=torch.Generator().manual_seed(0)), torch.arange(40) % 4
    z, y = (logits or (lambda a: a))(z), (labels or (lambda a: a))(y)
    with pytest.raises(MetricInputError, match=rf"^{fit}: {message}"):
        getattr(calibration, fit)(z, y)


def test_ood_threshold_refuses_nan_scores():
    from compressor.uq.calibration import checked_ood_threshold

    with pytest.raises(MetricInputError, match=r"^tpr_threshold: score_in: 1 of 20 scores are NaN"):
        checked_ood_threshold(torch.tensor([float("nan")] + [0.1] * 19), 0.95)


def test_chunked_ensemble_metrics_equal_the_whole_array(monkeypatch):
    """Mutual information, pairwise KL and the reports run in float64 chunks (never the whole input
    copied, the ensemble mean never held whole): tiny chunks give a whole-array computation's values."""
    rng = np.random.default_rng(5)
    mp = rng.dirichlet(np.ones(6), (3, 101)).astype(np.float32)
    p64 = np.clip(mp.astype(np.float64), M.EPS, 1.0)
    mean = p64.mean(0)
    mi = -(mean * np.log(mean)).sum(-1) + (p64 * np.log(p64)).sum(-1).mean(0)
    kl = np.mean(
        [(p64[i] * (np.log(p64[i]) - np.log(p64[j]))).sum(-1).mean() for i in range(3) for j in range(3) if i != j]
    )
    y = rng.integers(0, 6, 101)
    single = {f.__name__: f(mean, y) for f in (M.accuracy, M.nll, M.brier, M.ece, M.adaptive_ece, M.aurc, M.augrc)}
    out = rng.dirichlet(np.ones(6), (3, 37)).astype(np.float32)
    p_out = np.clip(out.astype(np.float64), M.EPS, 1.0).mean(0)
    msp_auroc = M.auroc(-mean.max(-1), -p_out.max(-1))
    monkeypatch.setattr(metric_inputs, "CHUNK_VALUES", 7)
    np.testing.assert_allclose(M.mutual_information_score(mp), mi, atol=1e-9)
    assert M.pairwise_kl(mp) == pytest.approx(kl, abs=1e-9)
    report = M.classification_report(mp, y)  # the mean taken chunk by chunk, never whole
    for name, value in single.items():
        assert report[name] == pytest.approx(value, abs=1e-6), name
    assert M.ood_report(mp, out)["auroc_msp"] == pytest.approx(msp_auroc, abs=1e-12)
