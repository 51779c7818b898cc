"""The Mahalanobis OOD score deployed: member features read from the fused model equal each member
run alone, the calibrate step fits it, the export stores it (checked on load), predict flags by it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file, save_file
from torch.utils.data import TensorDataset

import compressor
from compressor.core.errors import ExportError, WeightsError
from compressor.core.masks import HeadMask
from compressor.deploy.manifest import write_manifest
from compressor.run.cli import main
from compressor.uq.features import captured_features
from compressor.uq.inference import predict_with_features
from compressor.uq.outputs import DeepEnsemble
from compressor.uq.posthoc import logits_and_features
from mergers.hydra import build_hydra

from .conftest import make_vit, perturbed_members
from .helpers import SMALL, run_cli
from .test_predict import _digit_pngs

MASKS = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]


def _alone(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A single model's pooled features, read by posthoc's own hook on its family's classifier."""
    return torch.from_numpy(logits_and_features(model, TensorDataset(x), batch_size=len(x))[1])


@pytest.mark.parametrize("fine_tuned", [False, True], ids=["shared-head", "member-heads"])
def test_fused_features_equal_each_member_run_alone_in_chunks(fine_tuned):
    vit = make_vit("tiny_cls")
    members = perturbed_members(vit, MASKS, scale=0.05, seed=7) if fine_tuned else None
    fused = build_hydra(vit, MASKS, members=members, mlp_mode="grouped").eval()
    assert (len(fused.feature_layers()) == 2) == fine_tuned
    fused.inference_chunk_bytes = 1  # one sample per chunk: the hooks see 7 calls per layer
    x = torch.randn(7, 1, 16, 16)
    with torch.no_grad(), captured_features(fused) as capture:
        fused(x)
        feats = capture.take(2)
    family = compressor.families.family_of(vit)
    for i, mask in enumerate(MASKS):
        if fine_tuned:
            expected = _alone(members[i], x)
        else:
            with family.masked(mask):
                expected = _alone(vit, x)
        torch.testing.assert_close(feats[i], expected, atol=2e-5, rtol=1e-5)


def test_deep_ensemble_features_are_each_model_s_own():
    models = [make_vit("tiny_cls", seed=s).eval() for s in (0, 1)]
    x = torch.randn(5, 1, 16, 16)
    predictions, feats = predict_with_features(DeepEnsemble(models), TensorDataset(x), batch_size=2)
    assert predictions.labels is None and feats.shape[:2] == (2, 5)
    for i, m in enumerate(models):
        torch.testing.assert_close(feats[i], _alone(m, x), atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def mahalanobis_run(tmp_path_factory):
    """The default recipe, CI-sized, with the calibrate step deploying the Mahalanobis score."""
    root = tmp_path_factory.mktemp("maha")
    args = [
        "apply",
        str(Path(compressor.__path__[0]).parent / "recipes" / "vit_hydra.yaml"),
        "--out",
        str(root / "run"),
        *SMALL,
        "--set",
        "steps.2.finetune.steps=2",
        "--set",
        "steps.3.calibrate.ood_score=mahalanobis",
        "--set",
        "steps.4.evaluate.plots=false",
    ]
    out = run_cli(args, root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_calibrate_fits_mahalanobis_and_predict_flags_by_it(mahalanobis_run, tmp_path):
    export = mahalanobis_run / "run" / "export"
    model = compressor.load(export)
    assert model.ood["score"] == "mahalanobis" and model.feature_score is not None
    assert model.feature_score.means.shape[:2] == (3, 8)  # 3 members, digits 0-7
    assert "OOD threshold (mahalanobis, keeps 95% of held-out)" in (mahalanobis_run / "run" / "report.md").read_text()
    summary = json.loads((mahalanobis_run / "run" / "metrics.json").read_text())["summary"]
    assert 0 <= summary["hydra"]["auroc_mahalanobis"] <= 1 and "auroc_mahalanobis" not in summary["base"]
    imgs = _digit_pngs(tmp_path / "imgs", n=9)
    rows = compressor.predict_inputs(export, tmp_path / "imgs")
    # independent: the members' features, then the distance written out per class and member
    x = torch.stack([torch.tensor(np.array(Image.open(p)), dtype=torch.float32) for p in imgs])
    x = ((x[:, None] / 255.0) - 0.3) / 0.4
    feats = predict_with_features(model.model, TensorDataset(x), batch_size=len(x))[1]  # as predict batches
    means, precision = model.feature_score.means.numpy(), model.feature_score.precision.numpy()
    f = feats.double().numpy()
    expected = np.mean(
        [[min((v - mu) @ precision[m] @ (v - mu) for mu in means[m]) for v in f[m]] for m in range(3)], axis=0
    )
    np.testing.assert_allclose([r["ood_score"] for r in rows], expected.round(6), rtol=1e-5, atol=2e-6)
    threshold = model.ood["threshold"]
    assert [r["ood"] for r in rows] == [bool(e > threshold) for e in expected]


def _tamper(export, change) -> None:
    tensors = load_file(str(export / "ood_features.safetensors"))
    change(tensors)
    save_file(tensors, str(export / "ood_features.safetensors"))
    write_manifest(export)  # an editor who knows the manifest: the checks behind it must hold


@pytest.mark.parametrize(
    "case",
    [
        ("shape", lambda t: t.__setitem__("means", t["means"][:, :, :5].contiguous()), ExportError, "expected means"),
        ("members", lambda t: t.__setitem__("precision", t["precision"][:2].contiguous()), ExportError, "precision"),
        ("nan", lambda t: t["precision"].__setitem__((0, 0, 0), float("nan")), WeightsError, "NaN or inf"),
        ("extra", lambda t: t.__setitem__("evil", torch.zeros(1)), ExportError, "expected means"),
    ],
    ids=lambda c: c[0],
)
def test_a_tampered_feature_score_is_refused_in_one_line(mahalanobis_run, tmp_path, capsys, case):
    import shutil

    _, change, error, text = case
    export = tmp_path / "exp"
    shutil.copytree(mahalanobis_run / "run" / "export", export)
    _tamper(export, change)
    with pytest.raises(error, match="ood_features.safetensors"):
        compressor.load(export)
    (tmp_path / "in").mkdir()
    code = main(["predict", str(export), str(tmp_path / "in"), "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "ood_features.safetensors" in err[0] and text in err[0], err
    assert not (tmp_path / "p.csv").exists()


def test_a_missing_feature_score_file_is_refused(mahalanobis_run, tmp_path):
    import shutil

    export = tmp_path / "exp"
    shutil.copytree(mahalanobis_run / "run" / "export", export)
    (export / "ood_features.safetensors").unlink()
    with pytest.raises(ExportError, match="ood_features.safetensors: missing"):
        compressor.load(export)
    write_manifest(export)  # even with a manifest that no longer lists it
    with pytest.raises(ExportError, match="ood_features.safetensors: missing; calibration.ood.score 'mahalanobis'"):
        compressor.load(export)


def test_a_plain_single_model_deploys_mahalanobis_too(tmp_path):
    """One member: the score is the usual Mahalanobis distance of the plain model's features."""
    recipe = yaml.safe_load((Path(compressor.__path__[0]).parent / "recipes" / "vit_prune.yaml").read_text())
    recipe["steps"].insert(3, {"calibrate": {"ood_score": "mahalanobis"}})  # after prune, merge, finetune
    (tmp_path / "prune.yaml").write_text(yaml.safe_dump(recipe))
    args = ["apply", str(tmp_path / "prune.yaml"), "--out", str(tmp_path / "run"), *SMALL]
    args += ["--set", "steps.2.finetune.steps=2"]
    out = run_cli(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    model = compressor.load(tmp_path / "run" / "export")
    assert model.members == 1 and model.ood["score"] == "mahalanobis"
    x = torch.randn(4, 1, 16, 16)
    _, score = model.scored(x)
    f = _alone(model.model, x).double().numpy()
    means, precision = model.feature_score.means[0].numpy(), model.feature_score.precision[0].numpy()
    expected = [min((v - mu) @ precision @ (v - mu) for mu in means) for v in f]
    np.testing.assert_allclose(score.numpy(), expected, rtol=1e-6)


def test_predict_csv_has_the_score(mahalanobis_run, tmp_path):
    _digit_pngs(tmp_path / "imgs", n=3)
    out = run_cli(
        ["predict", str(mahalanobis_run / "run" / "export"), str(tmp_path / "imgs"), "--out", str(tmp_path / "p.csv")],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert all(float(r["ood_score"]) >= 0 and r["ood"] in ("True", "False") for r in rows)
