"""Metrics against scikit-learn or hand-computed cases."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, brier_score_loss, log_loss, roc_auc_score, roc_curve

from compressor.uq import metrics as M


def rand_probs(n=200, c=5, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * 2
    p = np.exp(logits)
    return p / p.sum(1, keepdims=True), rng.integers(0, c, n)


def test_accuracy_nll_brier_against_sklearn():
    p, y = rand_probs()
    assert M.accuracy(p, y) == pytest.approx((p.argmax(1) == y).mean())
    assert M.nll(p, y) == pytest.approx(log_loss(y, p, labels=range(5)))
    # binary case: sklearn's Brier is the mean of (p1 - y)^2; ours sums both classes = 2x
    pb = np.stack([1 - p[:, 0], p[:, 0]], 1)
    yb = (y == 0).astype(int)
    assert M.brier(pb, yb) == pytest.approx(2 * brier_score_loss(yb, pb[:, 1]))


def test_ece_hand_computed():
    # 4 samples: conf 0.9 (correct), 0.9 (wrong), 0.6 (correct), 0.3-> top-label conf 0.7 (correct)
    p = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    y = np.array([0, 1, 0, 1])
    # bins of width 1/15: 0.9 -> bin 13, 0.6 -> bin 8, 0.7 -> bin 10
    expected = 0.5 * abs(0.5 - 0.9) + 0.25 * abs(1 - 0.6) + 0.25 * abs(1 - 0.7)
    assert M.ece(p, y) == pytest.approx(expected)
    # two equal-mass bins: {0.6, 0.7} and {0.9, 0.9}
    expected_a = 0.5 * abs(1 - 0.65) + 0.5 * abs(0.5 - 0.9)
    assert M.adaptive_ece(p, y, bins=2) == pytest.approx(expected_a)
    assert M.ece(np.eye(3), np.arange(3)) == 0.0


def test_ood_metrics_against_sklearn():
    rng = np.random.default_rng(1)
    s_in = rng.normal(0, 1, 300)
    s_out = rng.normal(1, 1, 200)
    s_in[:20] = s_out[:20]  # ties
    yt = np.r_[np.zeros(300), np.ones(200)]
    s = np.r_[s_in, s_out]
    assert M.auroc(s_in, s_out) == pytest.approx(roc_auc_score(yt, s))
    assert M.aupr(s_in, s_out) == pytest.approx(average_precision_score(yt, s))
    # FPR95 with ID as positive and "in-ness" = -score
    fpr, tpr, _ = roc_curve(1 - yt, -s)
    assert M.fpr_at_tpr(s_in, s_out) == pytest.approx(fpr[np.argmax(tpr >= 0.95)])


def test_uncertainty_scores_hand_computed():
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    assert M.entropy_score(p) == pytest.approx([np.log(2), 0.0])
    assert M.max_prob_score(p) == pytest.approx([-0.5, -1.0])
    members = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two confident members that disagree
    assert M.mutual_information_score(members) == pytest.approx([np.log(2)], abs=1e-6)
    assert M.mutual_information_score(members[:1]) == pytest.approx([0.0])


def test_disagreement_and_pairwise_kl():
    a = np.array([[0.9, 0.1], [0.2, 0.8]])
    b = np.array([[0.6, 0.4], [0.7, 0.3]])
    mp = np.stack([a, b])
    assert M.disagreement(mp) == pytest.approx(0.5)
    kl = lambda p, q: (p * np.log(p / q)).sum(-1).mean()  # noqa: E731
    assert M.pairwise_kl(mp) == pytest.approx((kl(a, b) + kl(b, a)) / 2)
    assert M.disagreement(mp[:1]) == 0.0


def test_reports_have_every_metric():
    p, y = rand_probs()
    mp = np.stack([p, rand_probs(seed=2)[0]])
    rep = M.classification_report(mp, y)
    assert set(rep) == {
        "accuracy",
        "nll",
        "brier",
        "ece",
        "adaptive_ece",
        "aurc",
        "augrc",
        "disagreement",
        "pairwise_kl",
        "member_accuracy",
    }
    ood = M.ood_report(mp, np.stack([rand_probs(50, seed=3)[0]] * 2))
    assert {"auroc_msp", "aupr_entropy", "fpr95_mi"} <= set(ood)


def _fpr_reference(s_in, s_out, tpr=0.95):
    """The definition, computed the slow way: every candidate threshold tried."""
    thresholds = np.unique(np.concatenate([s_in, s_out]))
    tprs = (s_in[None, :] <= thresholds[:, None]).mean(1)
    return float((s_out <= thresholds[np.argmax(tprs >= tpr)]).mean())


@pytest.mark.parametrize("n_in, n_out, tpr", [(20, 7, 0.95), (100, 50, 0.95), (333, 101, 0.9), (57, 3, 0.5)])
def test_fast_fpr_equals_the_definition(n_in, n_out, tpr):
    rng = np.random.default_rng(n_in)
    s_in = rng.integers(0, 30, n_in).astype(float)  # many ties
    s_out = rng.integers(5, 40, n_out).astype(float)
    assert M.fpr_at_tpr(s_in, s_out, tpr) == _fpr_reference(s_in, s_out, tpr)


def test_brier_without_one_hot_equals_the_definition():
    p, y = rand_probs(300, 7, seed=4)
    assert M.brier(p, y) == pytest.approx(((p - np.eye(7)[y]) ** 2).sum(-1).mean(), abs=1e-12)


def test_logits_are_refused_with_the_function_named():
    logits = np.array([[2.0, -1.0], [0.5, 3.0]])
    for fn in (M.nll, M.brier, M.ece):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: probs: expected probabilities .* logits\?"):
            fn(logits, np.array([0, 1]))


def test_selective_risks_hand_computed():
    # confidences 0.9 (right), 0.8 (wrong), 0.7 (right), 0.6 (wrong), accepted in that order
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    y = np.array([0, 0, 0, 0])
    # selective risk at coverage 1/4..4/4: 0, 1/2, 1/3, 2/4; generalized: 0, 1/4, 1/4, 2/4
    assert M.aurc(p, y) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    assert M.augrc(p, y) == pytest.approx((0 + 1 / 4 + 1 / 4 + 2 / 4) / 4)


def test_metrics_agree_with_torchmetrics():
    """ECE (continuous confidences never sit on a bin edge, where the conventions differ), AUROC
    and AUPR (OOD positive) equal torchmetrics' values."""
    import torch
    import torchmetrics.functional.classification as tm

    p, y = rand_probs(500, 6, seed=7)
    pt, yt = torch.tensor(p, dtype=torch.float64), torch.tensor(y)
    assert M.ece(p, y) == pytest.approx(float(tm.multiclass_calibration_error(pt, yt, 6, n_bins=15)), abs=1e-6)
    rng = np.random.default_rng(8)
    s_in, s_out = rng.normal(0, 1, 300), rng.normal(0.7, 1, 200)
    s = torch.tensor(np.r_[s_in, s_out])
    target = torch.tensor([0] * 300 + [1] * 200)
    assert M.auroc(s_in, s_out) == pytest.approx(float(tm.binary_auroc(s, target)), abs=1e-6)
    assert M.aupr(s_in, s_out) == pytest.approx(float(tm.binary_average_precision(s, target)), abs=1e-6)
