"""Post-hoc OOD scores of one trained classifier, what a user would pick at one model's cost instead
of an ensemble (higher = more OOD):

- energy (Liu et al. 2020): -logsumexp of the logits;
- Mahalanobis (Lee et al. 2018): the smallest Mahalanobis distance of a sample's pooled feature to
  a class mean, with one covariance shared by the classes, fitted on the train split;
- kNN (Sun et al. 2022): the distance of a sample's L2-normalised pooled feature to its k-th
  nearest L2-normalised train feature.

Pooled features are the classifier's input, read with a forward hook on the family's classifier.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from compressor.core.device import model_device
from compressor.core.modes import evaluating
from compressor.data.bundle import loader
from compressor.uq.scores import energy


@torch.no_grad()
def logits_and_features(model: nn.Module, dataset: Dataset, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Logits [N, C] and pooled features [N, D] (the classifier's input) of a single model."""
    from compressor.families import family_of

    captured: list[torch.Tensor] = []
    hook = family_of(model).classifier().register_forward_hook(lambda m, args, out: captured.append(args[0]))
    logits = []
    try:
        with evaluating(model):
            for batch in loader(dataset, batch_size):
                logits.append(model(batch[0].to(model_device(model))).float().cpu())
    finally:
        hook.remove()
    return torch.cat(logits).numpy(), torch.cat([c.float().cpu() for c in captured]).numpy()


def energy_score(logits: np.ndarray) -> np.ndarray:
    """-logsumexp over classes (`scores.energy`, in float64)."""
    return energy(torch.from_numpy(np.asarray(logits, dtype=np.float64))).numpy()


class Mahalanobis:
    """Class means and one shared covariance of train features; score = min over classes of the
    squared Mahalanobis distance."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        f = features.astype(np.float64)
        classes = np.unique(labels)
        self.means = np.stack([f[labels == c].mean(0) for c in classes])
        centred = f - self.means[np.searchsorted(classes, labels)]
        self.precision = np.linalg.pinv(centred.T @ centred / len(f), hermitian=True)

    def score(self, features: np.ndarray) -> np.ndarray:
        d = features.astype(np.float64)[:, None, :] - self.means[None]
        return np.einsum("ncd,de,nce->nc", d, self.precision, d).min(1)


class KNearest:
    """Distance of normalised features to their k-th nearest normalised train feature."""

    def __init__(self, features: np.ndarray, k: int = 10) -> None:
        self.bank, self.k = _normalised(features), k

    def score(self, features: np.ndarray, chunk: int = 1024) -> np.ndarray:
        out = []
        for start in range(0, len(features), chunk):
            q = _normalised(features[start : start + chunk])
            sq = np.clip(2.0 - 2.0 * q @ self.bank.T, 0.0, None)  # squared distance of unit vectors
            out.append(np.sqrt(np.partition(sq, self.k - 1, axis=1)[:, self.k - 1]))
        return np.concatenate(out)


def _normalised(features: np.ndarray) -> np.ndarray:
    f = features.astype(np.float64)
    return f / np.clip(np.linalg.norm(f, axis=1, keepdims=True), 1e-12, None)
