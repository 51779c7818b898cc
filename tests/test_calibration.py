"""Temperature scaling and the stored OOD threshold: fitted on held-out data, exported, reloaded."""

import copy

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import compressor
from compressor.core.errors import MetricInputError
from compressor.core.masks import HeadMask
from compressor.data import digits_bundle
from compressor.deploy.export import export_model
from compressor.training.config import TrainConfig
from compressor.training.loop import train
from compressor.uq.calibrated import Calibrated
from compressor.uq.calibration import (
    calibrated_probs,
    checked_ood_threshold,
    ensemble_log_probs,
    fit_checked_temperature,
    fit_temperature,
    ood_threshold,
)
from compressor.uq.inference import predict_logits
from compressor.uq.metrics import accuracy, nll
from compressor.uq.scores import ood_score
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
        s = ood_score(probs, score)
        thr = ood_threshold(s, 0.95)
        assert (s <= thr).float().mean() >= 0.95 and (s < thr).float().mean() < 0.95


def test_calibration_is_exported_and_applied_on_load(overconfident, tmp_path):
    vit, data = overconfident
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    fused = build_hydra(vit, masks, mlp_mode="pruned")
    x = data.test.tensors[0][:5]
    raw = copy.deepcopy(fused)(x).member_logits.detach()
    per_member = Calibrated(fused, torch.tensor([2.0, 3.0]), {"score": "msp", "tpr": 0.95, "threshold": -0.4}, "member")
    export_model(per_member, tmp_path / "exp", masks)
    loaded = compressor.load(tmp_path / "exp")
    assert isinstance(loaded, Calibrated) and loaded.ood["threshold"] == -0.4 and loaded.scope == "member"
    torch.testing.assert_close(loaded(x).probs, per_member(x).probs)
    torch.testing.assert_close(loaded(x).member_logits, raw / torch.tensor([2.0, 3.0]).view(-1, 1, 1))
    # one temperature on the ensemble: members untouched, the prediction is softmax(log mean_m p_m / T)
    ensemble = Calibrated(fused, 2.5, {"score": "msp", "tpr": 0.95, "threshold": -0.4})
    export_model(ensemble, tmp_path / "exp2", masks)
    loaded = compressor.load(tmp_path / "exp2")
    assert loaded.scope == "ensemble" and loaded.temperature.tolist() == [2.5]
    with torch.no_grad():
        out = loaded(x)
    torch.testing.assert_close(out.member_logits, raw)
    mean = raw.double().softmax(-1).mean(0).numpy()
    by_hand = np.exp(np.log(mean) / 2.5) / np.exp(np.log(mean) / 2.5).sum(-1, keepdims=True)
    np.testing.assert_allclose(out.probs.numpy(), by_hand, rtol=1e-5, atol=1e-7)


def _members(n: int, classes: int = 5, members: int = 3, scale: float = 4.0, seed: int = 0) -> torch.Tensor:
    """Synthetic member logits [M, N, C] that mostly agree, each with its own noise."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, classes, generator=g) * scale
    return torch.stack([shared + torch.randn(n, classes, generator=g) for _ in range(members)])


def test_ensemble_temperature_is_the_scipy_optimum_and_never_moves_the_argmax():
    from scipy.optimize import minimize_scalar

    logits = _members(400, scale=2.0)
    labels = torch.randint(0, 5, (400,), generator=torch.Generator().manual_seed(1))
    labels[:250] = ensemble_log_probs(logits)[:250].argmax(-1)  # a mix of right and wrong: a finite optimum
    t = fit_temperature(logits, labels)
    log_p = ensemble_log_probs(logits.double()).numpy()
    y = labels.numpy()

    def nll_at(temp: float) -> float:
        z = log_p / temp
        z = z - z.max(-1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]))

    ref = minimize_scalar(nll_at, bounds=(0.05, 20), method="bounded", options={"xatol": 1e-9}).x
    assert t.shape == (1,) and abs(t.item() - ref) < 1e-4 * ref
    members_argmax = logits.softmax(-1).mean(0).argmax(-1)
    for temp in (0.1, t.item(), 7.0):
        assert torch.equal(calibrated_probs(logits, torch.tensor([temp])).argmax(-1), members_argmax)


def test_an_all_correct_heldout_split_cannot_collapse_the_temperature():
    """The failure of issue 26: a small held-out split the model gets 100% right drove the
    temperature to 0 and every probability to 1. Now: T >= 1, within bounds, test NLL no worse."""
    logits = _members(2000, scale=1.5, seed=3)
    p = ensemble_log_probs(logits).exp()
    labels = torch.multinomial(p, 1, generator=torch.Generator().manual_seed(4)).flatten()  # calibrated labels
    heldout = (ensemble_log_probs(logits[:, :200]).argmax(-1) == labels[:200]).nonzero().flatten()[:150]
    h_logits, h_labels = logits[:, heldout], labels[heldout]  # every held-out sample right
    with pytest.raises(MetricInputError, match="the ensemble gets all 97 samples right"):
        fit_temperature(h_logits, h_labels, bounds=(1e-4, 20))  # the building block refuses to collapse
    assert fit_temperature(h_logits, h_labels, bounds=(1.0, 20)).item() >= 1.0
    fit = fit_checked_temperature(h_logits, h_labels)
    assert fit.errors == 0 and 1.0 <= fit.temperature.item() <= 20
    assert any("no evidence for a temperature below 1" in n for n in fit.notes)
    test_logits, test_labels = logits[:, 200:], labels[200:]
    before = nll(calibrated_probs(test_logits, torch.ones(1)), test_labels)
    after = nll(calibrated_probs(test_logits, fit.temperature), test_labels)
    assert after <= before + 1e-9


def test_a_temperature_that_does_not_help_beyond_noise_is_not_kept():
    logits = _members(300, scale=1.5, seed=5)
    labels = torch.multinomial(ensemble_log_probs(logits).exp(), 1, generator=torch.Generator().manual_seed(6))
    fit = fit_checked_temperature(logits, labels.flatten())  # the labels follow the model: nothing to fix
    assert not fit.kept and fit.temperature.tolist() == [1.0]
    assert any("1.0 kept" in n for n in fit.notes)
    hot = fit_checked_temperature(logits * 4, labels.flatten())  # the same model 4x over-confident
    assert hot.kept and 3.0 < hot.temperature.item() < 5.5 and hot.nll_after < hot.nll_before


def test_a_saturated_ood_threshold_is_refused():
    tied = torch.full((100,), -1.0)
    threshold, notes = checked_ood_threshold(tied, 0.95, torch.full((50,), -1.0))
    assert threshold is None and any("refused" in n for n in notes) and any("saturated" in n for n in notes)
    spread = torch.linspace(-1, -0.5, 100)
    threshold, notes = checked_ood_threshold(spread, 0.95, torch.linspace(-0.9, -0.1, 50))
    assert threshold is not None and (spread <= threshold).float().mean() >= 0.95 and not notes


def test_the_fit_reports_a_bound_hit_and_a_perfect_member():
    """Diagnostics as fields: an underconfident model's fit hits the lower bound (at_bound), and
    with one temperature per member a member without held-out errors is fitted at T >= 1 only."""
    logits = _members(1000, scale=1.5, seed=5)
    labels = torch.multinomial(ensemble_log_probs(logits).exp(), 1, generator=torch.Generator().manual_seed(6))
    labels = labels.flatten()
    fit = fit_checked_temperature(logits * 0.05, labels, bounds=(0.5, 20))  # far too flat: wants T << 0.5
    assert fit.at_bound and fit.fitted == pytest.approx([0.5], rel=1e-3) and fit.errors >= 20
    perfect = logits.clone()
    perfect[0] = torch.nn.functional.one_hot(labels, logits.shape[-1]).double() * 5  # member 0 never wrong
    fit = fit_checked_temperature(perfect, labels, per_member=True)
    assert "a member makes no held-out error: only T >= 1 fitted" in fit.notes
    assert min(fit.fitted) >= 1.0 - 1e-6
