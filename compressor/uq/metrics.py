"""Accuracy, calibration, OOD-detection and ensemble-diversity metrics.

All functions take numpy arrays or tensors of probabilities and return floats. Every input is
checked by one set of validators before any work: probabilities finite, non-negative, rows summing
to 1 (logits are refused), labels integers in range with one per row, scores finite, nothing empty;
a failure is a one-line `MetricInputError` naming the function and the argument. Per-sample work
runs in chunks of a few MiB (`metric_inputs.CHUNK_VALUES`), so 1M samples x 1,000 classes fit in memory.
`probs` is [N, C]; ensemble functions take `member_probs` [M, N, C]. OOD scores follow the
convention "higher = more likely OOD" and the OOD set is the positive class for AUROC/AUPR.
"""

from __future__ import annotations

import numpy as np
import torch

from compressor.core.errors import MetricInputError
from compressor.uq import scores
from compressor.uq.metric_inputs import (
    check_labels,
    check_member_probs,
    check_probs,
    check_scores,
    chunk_rows,
    prob_rows,
    top_and_labels,
    top_label,
)

EPS = scores.EPS


def accuracy(probs, labels) -> float:
    _, pred, y = top_and_labels(probs, labels, "accuracy")
    return float((pred == y).mean())


def nll(probs, labels) -> float:
    """Mean negative log-likelihood of the true class (probabilities clipped at 1e-12)."""
    y = check_labels(labels, *check_probs(probs, "nll").shape, "nll")
    true = np.concatenate([c[np.arange(len(c)), y[s : s + len(c)]] for s, c in prob_rows(probs, "nll")])
    return _nll_of(true)


def _nll_of(p_true: np.ndarray) -> float:
    return float(-np.log(np.clip(p_true, EPS, 1.0)).mean())


def brier(probs, labels) -> float:
    """Mean over samples of sum over classes of (p - onehot)^2 (range 0..2), computed as
    sum_c p_c^2 - 2 p_y + 1 per sample (no one-hot matrix)."""
    y = check_labels(labels, *check_probs(probs, "brier").shape, "brier")
    parts = [(_squares(c), c[np.arange(len(c)), y[s : s + len(c)]]) for s, c in prob_rows(probs, "brier")]
    return _brier_of(np.concatenate([q for q, _ in parts]), np.concatenate([t for _, t in parts]))


def _squares(p: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", p, p)


def _brier_of(squares: np.ndarray, p_true: np.ndarray) -> float:
    return float((squares - 2 * p_true + 1).mean())


def _bin_index(conf: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bins closed on the right, (a, b] (Guo et al. 2017); 0 goes in the first bin.
    (torchmetrics and torch-uncertainty put a confidence on an edge in the upper bin instead.)"""
    edges = np.linspace(0.0, 1.0, bins + 1)
    return np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)


def ece(probs, labels, bins: int = 15) -> float:
    """Top-label expected calibration error with `bins` equal-width confidence bins (a, b]."""
    conf, pred, y = top_and_labels(probs, labels, "ece")
    return _ece_of(conf, (pred == y).astype(float), bins)


def _ece_of(conf: np.ndarray, correct: np.ndarray, bins: int) -> float:
    idx = _bin_index(conf, bins)
    gap = np.abs(np.bincount(idx, correct, bins) - np.bincount(idx, conf, bins))
    return float(gap.sum() / len(conf))


def adaptive_ece(probs, labels, bins: int = 15) -> float:
    """Top-label ECE with equal-mass bins (samples sorted by confidence, split into `bins`); samples
    of equal confidence share the bin where their run starts, so the value ignores sample order."""
    conf, pred, y = top_and_labels(probs, labels, "adaptive_ece")
    return _adaptive_ece_of(conf, (pred == y).astype(float), bins)


def _adaptive_ece_of(conf: np.ndarray, correct: np.ndarray, bins: int) -> float:
    order = np.argsort(conf, kind="stable")
    conf, correct = conf[order], correct[order]
    by_position = np.repeat(np.arange(bins), [len(c) for c in np.array_split(np.arange(len(conf)), bins)])
    _, first, group = np.unique(conf, return_index=True, return_inverse=True)
    idx = by_position[first][group]
    return float(np.abs(np.bincount(idx, correct, bins) - np.bincount(idx, conf, bins)).sum() / len(conf))


def reliability_bins(probs, labels, bins: int = 15) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin (a, b]: mean confidence, accuracy and sample count (for reliability diagrams)."""
    conf, pred, y = top_and_labels(probs, labels, "reliability_bins")
    correct = (pred == y).astype(float)
    idx = _bin_index(conf, bins)
    counts = np.bincount(idx, minlength=bins).astype(float)
    safe = np.maximum(counts, 1)
    return np.bincount(idx, conf, bins) / safe, np.bincount(idx, correct, bins) / safe, counts


# --- uncertainty scores (higher = more uncertain / more OOD) --------------------------------
def max_prob_score(probs) -> np.ndarray:
    """Negative maximum softmax probability (`compressor.uq.scores.max_prob`, row chunks)."""
    return -top_label(probs, "max_prob_score")[0]


def entropy_score(probs) -> np.ndarray:
    """Predictive entropy in nats (`compressor.uq.scores.entropy` on float64 row chunks)."""
    parts = [scores.entropy(torch.from_numpy(c)).numpy() for _, c in prob_rows(probs, "entropy_score")]
    return np.concatenate(parts) if parts else np.zeros(0)


def mutual_information_score(member_probs) -> np.ndarray:
    """H(mean_m p_m) - mean_m H(p_m) (`compressor.uq.scores.mutual_information`, float64)."""
    mp = check_member_probs(member_probs, "mutual_information_score")
    parts = [scores.mutual_information(torch.from_numpy(c)).numpy() for _, c in _member_chunks(mp)]
    return np.concatenate(parts)


def _member_chunks(mp: np.ndarray):
    """Yield (start, float64 chunk [M, n, C]) over the samples of `mp`, a few MiB at a time:
    never the whole input in float64."""
    step = chunk_rows(mp.shape[0], mp.shape[2])
    for start in range(0, mp.shape[1], step):
        yield start, np.asarray(mp[:, start : start + step], dtype=np.float64)


def _ensemble_chunks(mp: np.ndarray, probs, fn: str):
    """Yield (start, member chunk [M, n, C], ensemble-prediction chunk [n, C]) in float64: the
    ensemble prediction is `probs` (checked, one row per sample of `mp`) or the members' mean,
    computed chunk by chunk (the mean of 1M x 1,000 is never held whole)."""
    p = None if probs is None else check_probs(probs, fn)
    if p is not None and p.shape != mp.shape[1:]:
        raise MetricInputError(f"{fn}: probs: expected shape {tuple(mp.shape[1:])} (a member's), got {tuple(p.shape)}")
    for start, chunk in _member_chunks(mp):
        if p is None:
            yield start, chunk, chunk.mean(0)
        else:
            yield start, chunk, next(prob_rows(p[start : start + chunk.shape[1]], fn))[1]


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
    return _rank_auc(check_scores(score_out, "auroc", "score_out"), check_scores(score_in, "auroc", "score_in"))


def aupr(score_in, score_out) -> float:
    """Average precision with OOD as the positive class (AUPR-Out), step-wise like scikit-learn."""
    s_in, s_out = check_scores(score_in, "aupr", "score_in"), check_scores(score_out, "aupr", "score_out")
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


def tpr_threshold(score_in, tpr: float = 0.95) -> float:
    """The smallest ID score that accepts (score <= it) at least `tpr` of ID samples: the k-th
    smallest for the least k with k / N_id >= tpr (the threshold FPR95 and the stored OOD threshold use)."""
    if not 0.0 < tpr <= 1.0:
        raise MetricInputError(f"tpr_threshold: tpr: expected a share in (0, 1], got {tpr}")
    s_in = np.sort(check_scores(score_in, "tpr_threshold", "score_in"))
    n = len(s_in)
    k = max(1, int(np.floor(tpr * n)) - 1)
    while k < n and k / n < tpr:
        k += 1
    return float(s_in[k - 1])


def fpr_at_tpr(score_in, score_out, tpr: float = 0.95) -> float:
    """FPR95: share of OOD samples accepted as ID at the threshold that accepts `tpr` of ID.

    ID is the positive class here (as in the OOD literature): a sample is accepted as ID when its
    score is <= the threshold; the threshold is the smallest one accepting >= `tpr` of ID, i.e.
    the k-th smallest ID score for the least k with k / N_id >= tpr. (torch-uncertainty's routine
    and pytorch-ood's default take OOD as the positive class instead.) O(N log N) time, O(N) memory.
    """
    s_out = np.sort(check_scores(score_out, "fpr_at_tpr", "score_out"))
    return float(np.searchsorted(s_out, tpr_threshold(score_in, tpr), side="right") / len(s_out))


# --- selective prediction ----------------------------------------------------------------------
def risk_coverage(probs, labels, _fn: str = "risk_coverage") -> tuple[np.ndarray, np.ndarray]:
    """Coverage and selective risk (error rate of the accepted samples) at every distinct confidence
    threshold, from the most confident down. Samples with equal confidence are accepted together
    (one threshold), so the curve does not depend on the order of the samples."""
    conf, pred, y = top_and_labels(probs, labels, _fn)
    return _risk_coverage_of(conf, (pred != y).astype(float))


def _risk_coverage_of(conf: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-conf, kind="stable")
    conf, errors = conf[order], errors[order]
    last_of_tie = np.r_[conf[1:] != conf[:-1], True]
    accepted = np.arange(1, len(conf) + 1)[last_of_tie]
    return accepted / len(conf), np.cumsum(errors)[last_of_tie] / accepted


def aurc(probs, labels) -> float:
    """Area under the risk-coverage curve (Geifman & El-Yaniv 2017): the selective risk averaged
    over coverage, each threshold weighted by the share of samples it adds (1/N each without
    ties, so the mean over coverages 1/N..1). Lower is better; invariant to sample order."""
    return _aurc_of(*risk_coverage(probs, labels, "aurc"))


def _aurc_of(coverage: np.ndarray, risk: np.ndarray) -> float:
    return float((np.diff(coverage, prepend=0.0) * risk).sum())


def augrc(probs, labels) -> float:
    """Area under the generalized risk-coverage curve (Traub et al. 2024): the share of ALL samples
    that are accepted and wrong, averaged over coverage like `aurc`. Lower is better."""
    return _augrc_of(*risk_coverage(probs, labels, "augrc"))


def _augrc_of(coverage: np.ndarray, risk: np.ndarray) -> float:
    return float((np.diff(coverage, prepend=0.0) * risk * coverage).sum())


# --- ensemble diversity ------------------------------------------------------------------------
def disagreement(member_probs) -> float:
    """Mean over member pairs of the share of samples on which their top-1 predictions differ."""
    preds = check_member_probs(member_probs, "disagreement").argmax(-1)
    m = len(preds)
    if m < 2:
        return 0.0
    pairs = [(preds[i] != preds[j]).mean() for i in range(m) for j in range(i + 1, m)]
    return float(np.mean(pairs))


def pairwise_kl(member_probs) -> float:
    """Mean over ordered member pairs (i != j) of the mean KL(p_i || p_j)."""
    mp = check_member_probs(member_probs, "pairwise_kl")
    m, n = mp.shape[0], mp.shape[1]
    if m < 2:
        return 0.0
    total = 0.0
    for _, chunk in _member_chunks(mp):
        logp = np.log(np.clip(chunk, EPS, 1.0))
        p = np.clip(chunk, EPS, 1.0)
        total += sum(float((p[i] * (logp[i] - logp[j])).sum()) for i in range(m) for j in range(m) if i != j)
    return total / (n * m * (m - 1))


def classification_report(member_probs, labels, probs=None) -> dict[str, float]:
    """Accuracy, NLL, Brier, ECE, adaptive ECE, AURC and AUGRC of the ensemble prediction `probs`
    (default: the members' mean), plus member accuracy and diversity. One pass over row chunks
    keeps what those metrics need per sample (confidence, prediction, the true class's probability,
    the sum of squares), so the ensemble prediction is never materialised."""
    fn = "classification_report"
    mp = check_member_probs(member_probs, fn)
    y = check_labels(labels, mp.shape[1], mp.shape[2], fn)
    conf, pred, true, squares = [], [], [], []
    for start, _, p in _ensemble_chunks(mp, probs, fn):
        conf.append(p.max(-1))
        pred.append(p.argmax(-1))
        true.append(p[np.arange(len(p)), y[start : start + len(p)]])
        squares.append(_squares(p))
    conf, pred, true, squares = (np.concatenate(v) for v in (conf, pred, true, squares))
    correct = (pred == y).astype(float)
    rc = _risk_coverage_of(conf, 1.0 - correct)
    out = {
        "accuracy": float(correct.mean()),
        "nll": _nll_of(true),
        "brier": _brier_of(squares, true),
        "ece": _ece_of(conf, correct, 15),
        "adaptive_ece": _adaptive_ece_of(conf, correct, 15),
        "aurc": _aurc_of(*rc),
        "augrc": _augrc_of(*rc),
    }
    if len(mp) > 1:
        out["disagreement"] = disagreement(mp)
        out["pairwise_kl"] = pairwise_kl(mp)
        out["member_accuracy"] = float(np.mean([accuracy(q, labels) for q in mp]))
    return out


def ood_report(member_probs_in, member_probs_out, probs_in=None, probs_out=None) -> dict[str, float]:
    """AUROC, AUPR and FPR95 for every applicable score (`compressor.uq.scores.ood_score`: MSP and
    entropy of the ensemble prediction, by default the members' mean; MI of the members for
    ensembles), computed chunk by chunk."""
    mi, mo = check_member_probs(member_probs_in, "ood_report"), check_member_probs(member_probs_out, "ood_report")
    names = [
        n
        for n in scores.OOD_SCORES
        if n not in scores.FEATURE_SCORES and (n not in scores.ENSEMBLE_SCORES or len(mi) > 1)
    ]

    def per_sample(mp: np.ndarray, probs) -> dict[str, np.ndarray]:
        parts: dict[str, list] = {n: [] for n in names}
        for _, members, p in _ensemble_chunks(mp, probs, "ood_report"):
            m, q = torch.from_numpy(members), torch.from_numpy(p)
            for n in names:
                parts[n].append(scores.ood_score(m, n, q).numpy())
        return {n: np.concatenate(v) for n, v in parts.items()}

    s_in, s_out = per_sample(mi, probs_in), per_sample(mo, probs_out)
    out = {}
    for name in names:
        out[f"auroc_{name}"] = auroc(s_in[name], s_out[name])
        out[f"aupr_{name}"] = aupr(s_in[name], s_out[name])
        out[f"fpr95_{name}"] = fpr_at_tpr(s_in[name], s_out[name])
    return out
