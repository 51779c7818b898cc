"""Split-conformal prediction sets: hand-computed thresholds and sets, and coverage within the
finite-sample bound on a large synthetic set, for a calibrated and an overconfident model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from compressor.core.errors import MetricInputError
from compressor.uq.conformal import (
    class_scores,
    conformal_threshold,
    coverage_and_size,
    fit_conformal,
    prediction_sets,
)


def test_lac_hand_computed():
    """True-class probabilities 0.9 .. 0.1: LAC scores 0.1 .. 0.9; coverage 0.8 with n = 9 takes the
    ceil(10 * 0.8) = 8th smallest score, 0.8; a class is in the set when p >= 0.2."""
    p_true = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    probs = torch.stack([p_true, 1 - p_true], dim=1)
    labels = torch.zeros(9, dtype=torch.long)
    assert conformal_threshold(probs, labels, "lac", 0.8) == pytest.approx(0.8)
    sets = prediction_sets(torch.tensor([[0.85, 0.15], [0.6, 0.4], [0.1, 0.9]]), 0.8, "lac")
    assert sets.tolist() == [[True, False], [True, True], [False, True]]


def test_aps_hand_computed():
    """Row [0.5, 0.3, 0.2]: APS score of class 0 is 0.5, of class 1 0.5 + 0.3, of class 2 1.0; the
    set takes classes down the ranking while that score stays within the threshold, the top class always."""
    row = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    assert class_scores(row, "aps")[0].tolist() == pytest.approx([0.5, 0.8, 1.0])
    assert prediction_sets(row, 0.85, "aps").tolist() == [[True, True, False]]
    assert prediction_sets(row, 0.6, "aps").tolist() == [[True, False, False]]
    assert prediction_sets(row, 0.2, "aps").tolist() == [[True, False, False]]  # never empty
    assert prediction_sets(row, 1.0, "aps").tolist() == [[True, True, True]]
    # held-out rows all [0.5, 0.3, 0.2] with labels 0, 1, 2, 1: scores 0.5, 0.8, 1.0, 0.8;
    # coverage 0.5, n = 4: the ceil(5 * 0.5) = 3rd smallest, 0.8
    held = row.repeat(4, 1)
    assert conformal_threshold(held, torch.tensor([0, 1, 2, 1]), "aps", 0.5) == pytest.approx(0.8)


def synthetic(n: int, classes: int, generator: torch.Generator, sharpen: float = 1.0):
    """Labels drawn from softmax(logits); the model reports softmax(sharpen * logits)."""
    logits = 2 * torch.randn(n, classes, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
    return (sharpen * logits).softmax(-1), labels


@pytest.mark.parametrize("method", ["lac", "aps"])
@pytest.mark.parametrize("sharpen", [1.0, 3.0], ids=["calibrated", "overconfident"])
def test_coverage_within_the_finite_sample_bound(method, sharpen):
    """Mean coverage over 200 calibration draws of the exact rule lies in [0.9, 0.9 + 1/(n+1)], up to
    4 standard errors; APS's top-class fill of empty sets adds exactly the inputs it fills and gets right."""
    g = torch.Generator().manual_seed(0)
    n, trials, coverage = 200, 200, 0.9
    covered, sizes = [], []
    for _ in range(trials):
        cal_p, cal_y = synthetic(n, 10, g, sharpen)
        test_p, test_y = synthetic(500, 10, g, sharpen)
        q = conformal_threshold(cal_p, cal_y, method, coverage)
        exact = prediction_sets(test_p, q, method, never_empty=False)
        filled = prediction_sets(test_p, q, method)
        c, s = coverage_and_size(exact, test_y)
        covered.append(c)
        sizes.append(s)
        empty_and_right = (exact.sum(-1) == 0) & (test_p.argmax(-1) == test_y)
        if method == "aps":
            assert coverage_and_size(filled, test_y)[0] == pytest.approx(c + empty_and_right.double().mean().item())
        else:
            assert torch.equal(filled, exact)  # LAC sets are never filled (an empty one says: no class is likely)
    mean = sum(covered) / trials
    se = torch.tensor(covered).std().item() / math.sqrt(trials)
    assert coverage - 4 * se <= mean <= coverage + 1 / (n + 1) + 4 * se
    assert 1.0 < sum(sizes) / trials < 10.0  # informative: neither a single class nor every class


def test_fit_conformal_records_every_method():
    g = torch.Generator().manual_seed(1)
    p, y = synthetic(100, 4, g)
    fitted = fit_conformal(p, y, 0.9, "aps")
    assert fitted["coverage"] == 0.9 and fitted["method"] == "aps"
    assert fitted["lac"] == conformal_threshold(p, y, "lac", 0.9)
    assert fitted["aps"] == conformal_threshold(p, y, "aps", 0.9)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p, y: conformal_threshold(p[:8], y[:8], "lac", 0.9), "8 held-out samples cannot certify coverage 0.9"),
        (lambda p, y: conformal_threshold(p, y, "lac", 1.0), r"coverage: expected a share in \(0, 1\)"),
        (lambda p, y: conformal_threshold(p, y + 4, "lac", 0.9), r"labels: expected class indices in \[0, 4\)"),
        (lambda p, y: conformal_threshold(p.log(), y, "lac", 0.9), r"probs: expected probabilities .*logits\?"),
        (lambda p, y: conformal_threshold(p, y.double(), "lac", 0.9), "labels: expected integer class indices"),
        (lambda p, y: prediction_sets(p * float("nan"), 0.5, "lac"), "prediction_sets: probs: NaN or infinite"),
        (lambda p, y: conformal_threshold(p, y, "raps", 0.9), "method: expected one of lac, aps, got 'raps'"),
        (lambda p, y: fit_conformal(p, y, 0.9, "top1"), "method: expected one of lac, aps"),
    ],
)
def test_bad_inputs_are_refused(call, message):
    p, y = synthetic(50, 4, torch.Generator().manual_seed(2))
    with pytest.raises(MetricInputError, match=message):
        call(p, y)


def test_export_carries_the_sets_and_predict_writes_them(tmp_path):
    """Thresholds survive export and load; predict's sets equal a hand computation from the probabilities."""
    import compressor
    from compressor.core.masks import HeadMask
    from compressor.data import digits_preprocessing
    from compressor.deploy.export import export_model
    from compressor.uq.calibrated import Calibrated
    from mergers.hydra import build_hydra

    from .conftest import make_vit
    from .test_predict import _digit_pngs

    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    conformal = {"coverage": 0.9, "method": "aps", "lac": 0.93, "aps": 0.35}
    fused = Calibrated(build_hydra(make_vit("tiny_cls"), masks, mlp_mode="grouped"), 1.0, {}, conformal=conformal)
    names = [f"c{c}" for c in range(8)]
    export_model(fused, tmp_path / "exp", masks, names, preprocessing=digits_preprocessing(16))
    loaded = compressor.load(tmp_path / "exp")
    assert loaded.conformal == conformal
    paths = _digit_pngs(tmp_path / "imgs")
    rows = compressor.predict_inputs(tmp_path / "exp", tmp_path / "imgs")
    x = torch.stack([torch.tensor(np.array(Image.open(p)), dtype=torch.float32)[None] / 255.0 for p in paths])
    with torch.no_grad():
        probs = fused((x - 0.3) / 0.4).probs.double()
    sizes = []
    for row, p in zip(rows, probs):
        ranked = p.argsort(descending=True).tolist()
        mass = p[ranked].cumsum(0)
        expected = [names[c] for c, m in zip(ranked, mass) if m <= 0.35] or [names[ranked[0]]]
        assert row["prediction_set"] == expected and row["set_size"] == len(expected)
        sizes.append(len(expected))
    assert max(sizes) > 1  # the check covers sets of more than one class


def test_a_tampered_coverage_is_refused_on_load(tmp_path):
    import json

    import compressor
    from compressor.core.errors import ExportError
    from compressor.core.masks import HeadMask
    from compressor.deploy.export import export_model
    from compressor.deploy.manifest import write_manifest
    from compressor.uq.calibrated import Calibrated
    from mergers.hydra import build_hydra

    from .conftest import make_vit

    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4])] * 2
    conformal = {"coverage": 0.9, "method": "lac", "lac": 0.9, "aps": 0.9}
    fused = Calibrated(build_hydra(make_vit("tiny_cls"), masks, mlp_mode="grouped"), 1.0, {}, conformal=conformal)
    export_model(fused, tmp_path / "exp", masks, [str(c) for c in range(8)])
    cfg_path = tmp_path / "exp" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["calibration"]["conformal"]["coverage"] = 1.5
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=r"config.json: sha256 differs from manifest.json"):
        compressor.load(tmp_path / "exp")
    write_manifest(tmp_path / "exp")  # re-hashed by whoever edited it: the value is still checked
    with pytest.raises(ExportError, match=r"calibration\.conformal: .*a coverage in \(0, 1\)"):
        compressor.load(tmp_path / "exp")
