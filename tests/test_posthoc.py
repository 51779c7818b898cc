"""Post-hoc OOD scores against independent computations (scipy, scikit-learn, a hand-written
Mahalanobis), and the features they read from a real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from sklearn.neighbors import NearestNeighbors
from torch.utils.data import TensorDataset

from compressor.core.device import check_precision, cpu_has_native_bf16
from compressor.uq import posthoc
from compressor.uq.posthoc import KNearest, Mahalanobis, energy_score, logits_and_features


def test_energy_is_minus_logsumexp():
    logits = np.random.default_rng(0).normal(size=(50, 7)) * 30
    np.testing.assert_allclose(energy_score(logits), -logsumexp(logits, axis=1), rtol=1e-12)


def test_mahalanobis_against_a_hand_computation():
    rng = np.random.default_rng(1)
    feats, labels = rng.normal(size=(300, 5)), rng.integers(0, 3, 300)
    feats[labels == 1] += 3.0
    queries = rng.normal(size=(20, 5))
    means = [feats[labels == c].mean(0) for c in range(3)]
    centred = np.concatenate([feats[labels == c] - means[c] for c in range(3)])
    inv = np.linalg.inv(centred.T @ centred / len(feats))
    expected = [min((q - m) @ inv @ (q - m) for m in means) for q in queries]
    fitted = Mahalanobis.fit(torch.from_numpy(feats), torch.from_numpy(labels))
    np.testing.assert_allclose(fitted.score(queries), expected, rtol=1e-8)


def test_mahalanobis_of_an_ensemble_is_the_members_mean_against_scikit_learn(monkeypatch):
    """Two members with their own features: per member, scikit-learn's EmpiricalCovariance on the
    class-centred features gives the squared distances; the score is the nearest class's, averaged."""
    from sklearn.covariance import EmpiricalCovariance

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, 500)
    feats = rng.normal(size=(2, 500, 6)) + labels[None, :, None] * np.array([1.0, -2.0])[:, None, None]
    queries = rng.normal(size=(2, 30, 6)) * 2
    per_member = []
    for m in range(2):
        means = np.stack([feats[m, labels == c].mean(0) for c in range(4)])
        cov = EmpiricalCovariance(assume_centered=True).fit(feats[m] - means[labels])
        per_member.append(np.min([cov.mahalanobis(queries[m] - mu) for mu in means], axis=0))
    fitted = Mahalanobis.fit(torch.from_numpy(feats), torch.from_numpy(labels))
    np.testing.assert_allclose(fitted.score(queries), np.mean(per_member, axis=0), rtol=1e-7)
    monkeypatch.setattr(posthoc, "CHUNK_ELEMENTS", 1)  # one sample per chunk: the same scores
    np.testing.assert_allclose(fitted.score(queries), np.mean(per_member, axis=0), rtol=1e-7)
    with pytest.raises(Exception, match="features"):
        fitted(torch.zeros(3, 30, 6))  # three members' features for a two-member fit


@pytest.mark.parametrize("k", [1, 5])
def test_knn_against_scikit_learn(k):
    rng = np.random.default_rng(2)
    bank, queries = rng.normal(size=(400, 8)), rng.normal(size=(90, 8))
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    dist, _ = NearestNeighbors(n_neighbors=k).fit(unit(bank)).kneighbors(unit(queries))
    np.testing.assert_allclose(KNearest(bank, k).score(queries, chunk=32), dist[:, -1], rtol=1e-6, atol=1e-7)


def test_features_are_the_classifier_input(vit):
    x = torch.randn(10, 1, 16, 16)
    logits, feats = logits_and_features(vit, TensorDataset(x), batch_size=4)
    with torch.no_grad():
        np.testing.assert_allclose(vit.eval()(x).numpy(), logits, atol=1e-5)
        np.testing.assert_allclose(vit.head(torch.from_numpy(feats)).numpy(), logits, atol=1e-5)


def test_bf16_on_a_cpu_without_it_warns():
    assert cpu_has_native_bf16("flags\t: fpu sse avx2 avx512_bf16\n") is True
    assert cpu_has_native_bf16("flags\t: fpu sse avx2\n") is False
    with pytest.warns(UserWarning, match="without native bf16.*use precision: fp32"):
        check_precision("bf16", torch.device("cpu"), native_bf16=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_precision("bf16", torch.device("cpu"), native_bf16=True)
        check_precision("fp32", torch.device("cpu"), native_bf16=False)
