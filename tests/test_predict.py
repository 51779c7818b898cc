"""`compressor predict`: per-sample predictions from an export, on image files and text."""

import csv
import json

import numpy as np
import torch
from PIL import Image

import compressor
from compressor.core.masks import HeadMask
from compressor.data import digits_bundle, digits_preprocessing
from compressor.deploy.export import export_model
from compressor.uq.calibrated import Calibrated
from mergers.hydra import build_hydra

from .conftest import make_vit
from .helpers import run_cli


def _digit_pngs(folder, n=6):
    """Real digits written as 16x16 grey PNGs (pixel = value / 16 * 255), and their model inputs."""
    from sklearn.datasets import load_digits

    images = load_digits().images[:n]
    folder.mkdir()
    for i, img in enumerate(images):
        up = torch.nn.functional.interpolate(torch.tensor(img)[None, None] / 16.0, size=(16, 16), mode="bilinear")
        Image.fromarray((up[0, 0].clamp(0, 1) * 255).round().byte().numpy(), mode="L").save(folder / f"d{i}.png")
    return sorted(folder.glob("*.png"))


def test_predict_images_matches_the_model_and_flags_by_the_stored_threshold(tmp_path):
    vit = make_vit("tiny_cls")
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    fused = Calibrated(
        build_hydra(vit, masks, mlp_mode="grouped"), 1.5, {"score": "msp", "tpr": 0.95, "threshold": -0.2}
    )
    names = [str(c) for c in range(8)]
    export_model(fused, tmp_path / "exp", masks, names, preprocessing=digits_preprocessing(16))
    paths = _digit_pngs(tmp_path / "imgs")
    out = run_cli(
        ["predict", str(tmp_path / "exp"), str(tmp_path / "imgs"), "--out", str(tmp_path / "p.csv")], tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert [r["input"] for r in rows] == [str(p) for p in paths]
    # independent computation: the same pixels through the digits preprocessing, by hand
    x = torch.stack([torch.tensor(np.array(Image.open(p)), dtype=torch.float32)[None] / 255.0 for p in paths])
    with torch.no_grad():
        out_ = fused((x - 0.3) / 0.4)
    probs = out_.probs
    for r, p, members in zip(rows, probs, out_.member_logits.argmax(-1).t()):
        assert r["prediction"] == names[int(p.argmax())]
        assert float(r["probability"]) == np.float32(p.max()).round(6)
        assert r["ood"] == str(bool(-p.max() > -0.2))
        assert r["member_predictions"] == ";".join(names[int(c)] for c in members)
        assert {"top_k", "entropy", "mutual_information", "disagreement", "max_softmax"} <= set(r)
    # the Python call returns the same fields; JSONL keeps lists as lists
    jsonl = tmp_path / "p.jsonl"
    assert (
        run_cli(["predict", str(tmp_path / "exp"), str(tmp_path / "imgs"), "--out", str(jsonl)], tmp_path).returncode
        == 0
    )
    first = json.loads(jsonl.read_text().splitlines()[0])
    assert first == compressor.predict_inputs(tmp_path / "exp", tmp_path / "imgs")[0]
    assert len(first["top_k"]) == 3 and isinstance(first["ood"], bool)


def test_predict_refuses_missing_inputs_in_one_line(tmp_path):
    vit = make_vit("tiny_cls")
    export_model(vit, tmp_path / "exp", preprocessing=digits_preprocessing(16))
    out = run_cli(["predict", str(tmp_path / "exp"), str(tmp_path / "nothing")], tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nothing'}: no such file or folder"
    ]
    (tmp_path / "empty").mkdir()
    out = run_cli(["predict", str(tmp_path / "exp"), str(tmp_path / "empty")], tmp_path)
    assert out.returncode == 2 and "no image files" in out.stderr


def test_loaded_image_export_describes_its_inputs_to_timm(tmp_path):
    import timm.data

    vit = make_vit("tiny_cls")
    export_model(vit, tmp_path / "exp", preprocessing=digits_bundle().preprocessing)
    cfg = timm.data.resolve_data_config({}, model=compressor.load(tmp_path / "exp"))
    assert cfg["input_size"] == (1, 16, 16) and cfg["mean"] == (0.3,) and cfg["std"] == (0.4,)


def test_predict_refuses_an_unknown_output_format_before_predicting(tmp_path):
    out = run_cli(["predict", str(tmp_path / "no-export"), str(tmp_path), "--out", str(tmp_path / "p.txt")], tmp_path)
    assert out.returncode == 2
    assert (
        out.stderr.strip() == f"error: --out {tmp_path / 'p.txt'}: expected a file ending in .csv or .jsonl, got '.txt'"
    )
    assert not (tmp_path / "p.txt").exists()


def test_predict_never_overwrites_or_writes_into_the_export_unasked(tmp_path):
    """--out refuses an existing file (unless --overwrite), a file inside the export, a folder and a
    missing folder, each in one line before any prediction; the refused paths stay untouched."""
    vit = make_vit("tiny_cls")
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4])] * 2
    export_model(build_hydra(vit, masks, mlp_mode="grouped"), tmp_path / "exp", masks, [str(c) for c in range(8)],
                 preprocessing=digits_preprocessing(16))  # fmt: skip
    _digit_pngs(tmp_path / "imgs", n=2)
    existing = tmp_path / "old.csv"
    existing.write_text("a user's file")
    weights = (tmp_path / "exp" / "model.safetensors").read_bytes()
    cases = [
        (existing, f"--out {existing}: exists; pass --overwrite to replace it"),
        (
            tmp_path / "exp" / "p.csv",
            f"--out {tmp_path / 'exp' / 'p.csv'}: inside the export {tmp_path / 'exp'}; write predictions elsewhere",
        ),
        (tmp_path / "d.csv", f"--out {tmp_path / 'd.csv'}: is a folder; expected a file name"),
        (tmp_path / "no" / "p.csv", f"--out {tmp_path / 'no' / 'p.csv'}: no folder {tmp_path / 'no'}; create it first"),
    ]
    (tmp_path / "d.csv").mkdir()
    for out, message in cases:
        got = run_cli(["predict", str(tmp_path / "exp"), str(tmp_path / "imgs"), "--out", str(out)], tmp_path)
        assert got.returncode == 2 and got.stderr.strip() == f"error: {message}", got.stderr
    assert existing.read_text() == "a user's file" and not (tmp_path / "exp" / "p.csv").exists()
    assert (tmp_path / "exp" / "model.safetensors").read_bytes() == weights
    args = ["predict", str(tmp_path / "exp"), str(tmp_path / "imgs"), "--out", str(existing), "--overwrite"]
    assert run_cli(args, tmp_path).returncode == 0 and existing.read_text().startswith("input,")
