"""Input validation for the metrics: one checker per kind of argument (probabilities, member
probabilities, labels, scores), each failure a one-line `MetricInputError` naming the function and
the argument; probabilities are read in chunks of at most CHUNK_VALUES values, so that no check copies a whole
input (or a large part of it) to float64."""

from __future__ import annotations

import numpy as np
import torch

from compressor.core.errors import MetricInputError

CHUNK_VALUES = 1 << 24  # values per chunk (128 MiB in float64): per-sample work holds no more at a time


def chunk_rows(*row_shape: int) -> int:
    """Rows per chunk for rows of `row_shape` values ([C], or [M, C] across members)."""
    return max(1, CHUNK_VALUES // max(1, int(np.prod(row_shape))))


def as_float64(a) -> np.ndarray:
    """`a` as a float64 numpy array (for 1-D inputs such as scores and labels)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def as_array(a) -> np.ndarray:
    """`a` as a numpy array without a float64 copy (a tensor becomes a view of its data)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        return (a.float() if a.dtype == torch.bfloat16 else a).numpy()  # numpy has no bfloat16
    return np.asarray(a)


def check_probs(probs, fn: str, name: str = "probs") -> np.ndarray:
    """`probs` as a non-empty [N, C] array (no copy); its values are checked chunk by chunk in `prob_rows`."""
    p = as_array(probs)
    if p.ndim != 2:
        raise MetricInputError(f"{fn}: {name}: expected probabilities [N, C], got shape {tuple(p.shape)}")
    if p.shape[0] == 0 or p.shape[1] == 0:
        raise MetricInputError(f"{fn}: {name}: empty (shape {tuple(p.shape)}); expected at least one sample")
    return p


def check_member_probs(member_probs, fn: str) -> np.ndarray:
    """`member_probs` as a non-empty [M, N, C] array of probabilities (every member's rows checked)."""
    mp = as_array(member_probs)
    if mp.ndim != 3 or 0 in mp.shape:
        raise MetricInputError(f"{fn}: member_probs: expected probabilities [M, N, C], got shape {tuple(mp.shape)}")
    for m in mp:
        check_prob_values(m, fn, "member_probs")
    return mp


def check_prob_values(probs, fn: str, name: str = "probs") -> np.ndarray:
    """`probs` as a non-empty [N, C] array (no copy) whose every row is a probability vector."""
    p = check_probs(probs, fn, name)
    for _ in prob_rows(p, fn, dtype=None, name=name):
        pass
    return p


def check_member_logits(member_logits: torch.Tensor, fn: str) -> None:
    """`member_logits` must be a finite [M, N, C] tensor with N >= 1 (what calibration fits on)."""
    if member_logits.ndim != 3 or 0 in member_logits.shape:
        raise MetricInputError(
            f"{fn}: member_logits: expected [M, N, C] logits, got shape {tuple(member_logits.shape)}"
        )
    if not bool(torch.isfinite(member_logits).all()):
        raise MetricInputError(f"{fn}: member_logits: NaN or infinite values; expected finite logits")


def check_labels(labels, n: int, classes: int, fn: str) -> np.ndarray:
    """`labels` as int64 [N]: one class index in [0, classes) per row of the probabilities, of an
    integer type (float labels are refused, as torch's losses and torchmetrics refuse them)."""
    y = as_array(labels)
    if y.ndim != 1 or len(y) != n:
        raise MetricInputError(f"{fn}: labels: expected {n} labels (one per row of probs), got shape {tuple(y.shape)}")
    if not np.issubdtype(y.dtype, np.integer):
        raise MetricInputError(
            f"{fn}: labels: expected integer class indices, got {y.dtype} (cast whole numbers with .astype(int))"
        )
    y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= classes:
        raise MetricInputError(f"{fn}: labels: expected class indices in [0, {classes}), got {y.min()}..{y.max()}")
    return y


def check_scores(score, fn: str, name: str) -> np.ndarray:
    """`score` as a non-empty, finite float64 vector [N] (one OOD score per sample)."""
    s = as_float64(score)
    if s.ndim != 1 or len(s) == 0:
        raise MetricInputError(f"{fn}: {name}: expected a non-empty vector of scores, got shape {tuple(s.shape)}")
    if not np.all(np.isfinite(s)):
        bad = int((~np.isfinite(s)).sum())
        raise MetricInputError(f"{fn}: {name}: {bad} of {len(s)} scores are NaN or infinite; expected finite scores")
    return s


def prob_rows(probs, fn: str, dtype: type | None = np.float64, name: str = "probs"):
    """Yield chunks of the rows of `probs` [N, C] (as `dtype`; None keeps the input's), checking
    that they are probabilities."""
    p = check_probs(probs, fn, name)
    step = chunk_rows(p.shape[1])
    for start in range(0, len(p), step):
        chunk = np.asarray(p[start : start + step], dtype=dtype)
        if not np.all(np.isfinite(chunk)):
            raise MetricInputError(f"{fn}: {name}: NaN or infinite values; expected probabilities")
        sums = chunk.sum(-1, dtype=np.float64)
        if chunk.min() < -1e-6 or np.abs(sums - 1).max() > 1e-3:
            raise MetricInputError(
                f"{fn}: {name}: expected probabilities (rows in [0, 1] summing to 1); got rows summing to "
                f"{sums.min():.3g}..{sums.max():.3g}: logits? apply softmax first"
            )
        yield start, chunk


def top_label(probs, fn: str) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, the top-label confidence and the predicted class."""
    conf, pred = [], []
    for _, c in prob_rows(probs, fn, dtype=None):  # max and argmax need no float64 copy
        conf.append(c.max(-1).astype(np.float64))
        pred.append(c.argmax(-1))
    return np.concatenate(conf), np.concatenate(pred)


def top_and_labels(probs, labels, fn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(confidence, prediction, labels) per sample, every argument checked."""
    y = check_labels(labels, *check_probs(probs, fn).shape, fn)
    conf, pred = top_label(probs, fn)
    return conf, pred, y
