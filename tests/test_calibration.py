"""Temperature scaling and the stored OOD threshold: fitted on held-out data, exported, reloaded."""

import copy

import pytest
import torch
from torch.utils.data import TensorDataset

import compressor
from compressor.calibration import Calibrated, fit_temperature, ood_scores, ood_threshold
from compressor.data import digits_bundle
from compressor.export import export_model
from compressor.inference import predict_logits
from compressor.masks import HeadMask
from compressor.metrics import accuracy, nll
from compressor.training import TrainConfig, train
from mergers.hydra import build_hydra

from .conftest import make_vit


@pytest.fixture(scope="module")
def overconfident():
    """A briefly trained ViT whose logits are scaled up 10x: deliberately over-confident."""
    data = digits_bundle()
    vit = make_vit("tiny_cls")
    train(vit, TensorDataset(*(t[:256] for t in data.train.tensors)), None, TrainConfig(steps=60, batch_size=64))
    with torch.no_grad():
        vit.head.weight.mul_(10)
        vit.head.bias.mul_(10)
    return vit, data


def test_temperature_lowers_heldout_nll_and_keeps_accuracy(overconfident):
    vit, data = overconfident
    logits, y = predict_logits(vit, data.val)
    t = fit_temperature(logits, y)
    assert t.shape == (1,) and t.item() > 2.0, "an over-confident model is cooled"
    before, after = logits.softmax(-1)[0], (logits / t).softmax(-1)[0]
    assert nll(after, y) < nll(before, y) - 0.05
    assert accuracy(after, y) == accuracy(before, y)
    # the fitted temperature is the NLL minimum: nudging it either way is worse
    for factor in (0.9, 1.1):
        assert nll((logits / (t * factor)).softmax(-1)[0], y) > nll(after, y)


def test_per_member_temperatures_and_ood_threshold(overconfident):
    vit, data = overconfident
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    fused = build_hydra(vit, masks, mlp_mode="grouped")
    logits, y = predict_logits(fused, data.val)
    t = fit_temperature(logits, y, per_member=True)
    assert t.shape == (2,)
    probs = (logits / t.view(-1, 1, 1)).softmax(-1)
    for score in ("msp", "entropy", "mi"):
        s = ood_scores(probs, score)
        thr = ood_threshold(s, 0.95)
        assert (s <= thr).float().mean() >= 0.95 and (s < thr).float().mean() < 0.95


def test_calibration_is_exported_and_applied_on_load(overconfident, tmp_path):
    vit, data = overconfident
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    fused = build_hydra(vit, masks, mlp_mode="pruned")
    calibrated = Calibrated(fused, torch.tensor([2.0, 3.0]), {"score": "msp", "tpr": 0.95, "threshold": -0.4})
    export_model(calibrated, tmp_path / "exp", masks)
    loaded = compressor.load(tmp_path / "exp")
    x = data.test.tensors[0][:5]
    assert isinstance(loaded, Calibrated) and loaded.ood["threshold"] == -0.4
    torch.testing.assert_close(loaded(x).probs, calibrated(x).probs)
    raw = copy.deepcopy(fused)(x).member_logits
    torch.testing.assert_close(loaded(x).member_logits, raw / torch.tensor([2.0, 3.0]).view(-1, 1, 1))
