"""Post-hoc OOD scores of one trained classifier, what a user would pick at one model's cost instead
of an ensemble (higher = more OOD):

- energy (Liu et al. 2020): -logsumexp of the logits;
- Mahalanobis (Lee et al. 2018): the smallest Mahalanobis distance of a sample's pooled feature to
  a class mean, with one covariance shared by the classes, fitted on the train split (an ensemble:
  per member, averaged); the calibrate step deploys it (`ood_score: mahalanobis`);
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
from compressor.core.errors import MetricInputError
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


CHUNK_ELEMENTS = 1 << 23  # 64 MiB of float64 differences at a time


class Mahalanobis(nn.Module):
    """Class means and one covariance shared by the classes, per member, fitted on train features;
    score = the squared Mahalanobis distance to the nearest class mean, averaged over members
    (Lee et al. 2018; one member: the usual score). Buffers, float64: `means` [M, K, D] (the K
    classes seen in the fit) and `precision` [M, D, D] (the covariance's pseudo-inverse)."""

    def __init__(self, means: torch.Tensor, precision: torch.Tensor) -> None:
        super().__init__()
        m, _, d = means.shape
        if precision.shape != (m, d, d):
            raise MetricInputError(f"Mahalanobis: precision {tuple(precision.shape)} for means {tuple(means.shape)}")
        self.register_buffer("means", means.double().contiguous())
        self.register_buffer("precision", precision.double().contiguous())

    @classmethod
    def fit(cls, features: torch.Tensor, labels: torch.Tensor) -> Mahalanobis:
        """From member features [M, N, D] (or [N, D]: one member) and their labels [N]."""
        f = torch.as_tensor(features).double()
        f = f[None] if f.dim() == 2 else f
        y = torch.as_tensor(labels).long()
        if f.dim() != 3 or len(y) != f.shape[1] or not bool(torch.isfinite(f).all()):
            raise MetricInputError(f"Mahalanobis.fit: expected finite features [M, N, D] for {len(y)} labels")
        classes = torch.unique(y)
        if len(y) <= len(classes):
            raise MetricInputError(f"Mahalanobis.fit: {len(y)} samples for {len(classes)} classes; expected more")
        means = torch.stack([f[:, y == c].mean(1) for c in classes], dim=1)  # [M, K, D]
        centred = f - means[:, torch.searchsorted(classes, y)]
        covariance = centred.transpose(1, 2) @ centred / len(y)
        return cls(means, torch.linalg.pinv(covariance, hermitian=True))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Per sample [B], from member features [M, B, D] (or [B, D] for one member)."""
        f = features.to(self.means.device, torch.float64)
        f = f[None] if f.dim() == 2 else f
        if f.shape[0] != self.means.shape[0] or f.shape[-1] != self.means.shape[-1]:
            raise MetricInputError(f"Mahalanobis: features {tuple(f.shape)} for means {tuple(self.means.shape)}")
        m, b, d = f.shape
        k = self.means.shape[1]
        step = max(1, CHUNK_ELEMENTS // (k * d))  # samples per chunk: differences [step, K, D] in float64
        nearest = torch.empty(m, b, dtype=torch.float64, device=f.device)
        for i in range(m):  # (f - mu) P (f - mu) written out: the expanded form cancels badly
            for s in range(0, b, step):
                diff = f[i, s : s + step, None, :] - self.means[i][None]
                nearest[i, s : s + step] = ((diff @ self.precision[i]) * diff).sum(-1).amin(-1)
        return nearest.mean(0)  # nearest class per member, then the members' mean

    def score(self, features: np.ndarray) -> np.ndarray:
        """numpy in, numpy out (benchmarks): features [N, D] or [M, N, D]."""
        return self(torch.from_numpy(np.asarray(features))).numpy()


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
