"""Accuracy, calibration, OOD-detection and ensemble-diversity metrics.

All functions take numpy arrays or tensors of probabilities (never logits) and return floats.
`probs` is [N, C]; ensemble functions take `member_probs` [M, N, C]. OOD scores follow the
convention "higher = more likely OOD" and the OOD set is the positive class for AUROC/AUPR.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def _np(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def accuracy(probs, labels) -> float:
    return float((_np(probs).argmax(-1) == _np(labels)).mean())


def nll(probs, labels) -> float:
    """Mean negative log-likelihood of the true class."""
    p, y = _np(probs), _np(labels).astype(int)
    return float(-np.log(np.clip(p[np.arange(len(y)), y], EPS, 1.0)).mean())


def brier(probs, labels) -> float:
    """Mean over samples of sum over classes of (p - onehot)^2 (range 0..2)."""
    p, y = _np(probs), _np(labels).astype(int)
    onehot = np.eye(p.shape[1])[y]
    return float(((p - onehot) ** 2).sum(-1).mean())


def ece(probs, labels, bins: int = 15) -> float:
    """Top-label expected calibration error with `bins` equal-width confidence bins (lo, hi]."""
    p, y = _np(probs), _np(labels).astype(int)
    conf, correct = p.max(-1), (p.argmax(-1) == y).astype(float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(total)


def adaptive_ece(probs, labels, bins: int = 15) -> float:
    """Top-label ECE with equal-mass bins (samples sorted by confidence, split into `bins`)."""
    p, y = _np(probs), _np(labels).astype(int)
    conf, correct = p.max(-1), (p.argmax(-1) == y).astype(float)
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, bins):
        if len(chunk):
            total += len(chunk) / len(conf) * abs(correct[chunk].mean() - conf[chunk].mean())
    return float(total)


def reliability_bins(probs, labels, bins: int = 15) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin: mean confidence, accuracy and sample count (for reliability diagrams)."""
    p, y = _np(probs), _np(labels).astype(int)
    conf, correct = p.max(-1), (p.argmax(-1) == y).astype(float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    counts = np.bincount(idx, minlength=bins).astype(float)
    safe = np.maximum(counts, 1)
    return np.bincount(idx, conf, bins) / safe, np.bincount(idx, correct, bins) / safe, counts


# --- uncertainty scores (higher = more uncertain / more OOD) --------------------------------
def max_prob_score(probs) -> np.ndarray:
    """Negative maximum softmax probability."""
    return -_np(probs).max(-1)


def entropy_score(probs) -> np.ndarray:
    """Predictive entropy in nats."""
    p = _np(probs)
    return -(p * np.log(np.clip(p, EPS, 1.0))).sum(-1)


def mutual_information_score(member_probs) -> np.ndarray:
    """Epistemic part of the entropy: H(mean_m p_m) - mean_m H(p_m). Zero for a single model."""
    mp = _np(member_probs)
    return entropy_score(mp.mean(0)) - np.stack([entropy_score(p) for p in mp]).mean(0)


# --- OOD detection ---------------------------------------------------------------------------
def _rank_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks for ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, counts)
    n_pos, n_neg = len(pos), len(neg)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auroc(score_in, score_out) -> float:
    """Area under the ROC curve for telling OOD (positive) from ID by `score` (Mann-Whitney U)."""
    return _rank_auc(_np(score_out), _np(score_in))


def aupr(score_in, score_out) -> float:
    """Average precision with OOD as the positive class (AUPR-Out), step-wise like scikit-learn."""
    s_in, s_out = _np(score_in), _np(score_out)
    scores = np.concatenate([s_out, s_in])
    is_pos = np.concatenate([np.ones(len(s_out)), np.zeros(len(s_in))])
    order = np.argsort(-scores, kind="mergesort")
    scores, is_pos = scores[order], is_pos[order]
    last_of_tie = np.r_[np.diff(scores) != 0, True]
    tp = np.cumsum(is_pos)[last_of_tie]
    fp = np.cumsum(1 - is_pos)[last_of_tie]
    precision = tp / (tp + fp)
    recall = tp / len(s_out)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def fpr_at_tpr(score_in, score_out, tpr: float = 0.95) -> float:
    """FPR95: share of OOD samples accepted as ID at the threshold that accepts `tpr` of ID.

    ID is the positive class here (as in the OOD literature): a sample is accepted as ID when its
    score is <= the threshold; the threshold is the smallest one accepting >= `tpr` of ID.
    """
    s_in, s_out = _np(score_in), _np(score_out)
    thresholds = np.unique(np.concatenate([s_in, s_out]))
    tprs = (s_in[None, :] <= thresholds[:, None]).mean(1)
    thr = thresholds[np.argmax(tprs >= tpr)]
    return float((s_out <= thr).mean())


# --- ensemble diversity ------------------------------------------------------------------------
def disagreement(member_probs) -> float:
    """Mean over member pairs of the share of samples on which their top-1 predictions differ."""
    preds = _np(member_probs).argmax(-1)
    m = len(preds)
    if m < 2:
        return 0.0
    pairs = [(preds[i] != preds[j]).mean() for i in range(m) for j in range(i + 1, m)]
    return float(np.mean(pairs))


def pairwise_kl(member_probs) -> float:
    """Mean over ordered member pairs (i != j) of the mean KL(p_i || p_j)."""
    mp = np.clip(_np(member_probs), EPS, 1.0)
    m = len(mp)
    if m < 2:
        return 0.0
    kls = [(mp[i] * (np.log(mp[i]) - np.log(mp[j]))).sum(-1).mean() for i in range(m) for j in range(m) if i != j]
    return float(np.mean(kls))


OOD_SCORES = {"msp": max_prob_score, "entropy": entropy_score}


def classification_report(member_probs, labels) -> dict[str, float]:
    """Accuracy, NLL, Brier, ECE, adaptive ECE of the ensemble mean, plus member diversity."""
    mp = _np(member_probs)
    p = mp.mean(0)
    out = {
        "accuracy": accuracy(p, labels),
        "nll": nll(p, labels),
        "brier": brier(p, labels),
        "ece": ece(p, labels),
        "adaptive_ece": adaptive_ece(p, labels),
    }
    if len(mp) > 1:
        out["disagreement"] = disagreement(mp)
        out["pairwise_kl"] = pairwise_kl(mp)
    return out


def ood_report(member_probs_in, member_probs_out) -> dict[str, float]:
    """AUROC, AUPR and FPR95 for every applicable score (MSP, entropy, and MI for ensembles)."""
    mi, mo = _np(member_probs_in), _np(member_probs_out)
    scores = {name: (f(mi.mean(0)), f(mo.mean(0))) for name, f in OOD_SCORES.items()}
    if len(mi) > 1:
        scores["mi"] = (mutual_information_score(mi), mutual_information_score(mo))
    out = {}
    for name, (s_in, s_out) in scores.items():
        out[f"auroc_{name}"] = auroc(s_in, s_out)
        out[f"aupr_{name}"] = aupr(s_in, s_out)
        out[f"fpr95_{name}"] = fpr_at_tpr(s_in, s_out)
    return out
