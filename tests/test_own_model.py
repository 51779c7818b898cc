"""A user's own timm model, trained by hand with its own plain preprocessing (no crop), gives in
the evaluate step the accuracy plain torch gives on the same folder; a pretrained config's crop
is said in one line."""

import json

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

from compressor.data.images import image_transforms, resize_note
from compressor.run.cli import main

from .test_real_inputs import _image_folder

KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 4}


def _plain_inputs(paths, mean, std):
    """The user's own preprocessing: the PNG as it is, scaled to [0, 1] and normalised."""
    x = torch.stack([torch.tensor(np.array(Image.open(p).convert("RGB")), dtype=torch.float32) / 255 for p in paths])
    return (x.permute(0, 3, 1, 2) - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def test_evaluate_gives_the_accuracy_plain_torch_gives(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = _image_folder(tmp_path / "images")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=2, **KWARGS)
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]  # timm's default for the architecture
    train = sorted((root / "train").rglob("*.png"))
    x, y = _plain_inputs(train, mean, std), torch.tensor([p.parent.name == "vertical" for p in train]).long()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(15):  # a few steps: a model that is right on some images and wrong on others
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    save_file(model.state_dict(), str(tmp_path / "mine.safetensors"))
    test = sorted((root / "val").rglob("*.png"))
    labels = torch.tensor([p.parent.name == "vertical" for p in test]).long()
    with torch.no_grad():
        logits = model.eval()(_plain_inputs(test, mean, std)).double()
    expected = float((logits.argmax(-1) == labels).double().mean())
    expected_nll = float(torch.nn.functional.cross_entropy(logits, labels))
    recipe = {
        "name": "mine",
        "device": "cpu",
        "model": {"name": "vit_tiny_patch16_224", "kwargs": KWARGS, "checkpoint": str(tmp_path / "mine.safetensors")},
        "data": {"source": "image_folder", "root": str(root), "batch_size": 8, "augment": "none"},
        "steps": [{"evaluate": {"plots": False, "baselines": ["base"]}}],
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["apply", "--quiet", str(tmp_path / "r.yaml")]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "runs" / "mine" / "metrics.json").read_text())["summary"]
    assert summary["base"]["accuracy"] == pytest.approx(expected, abs=1e-9)
    assert summary["base"]["nll"] == pytest.approx(expected_nll, abs=1e-5)  # the same inputs, not just the same argmax
    assert "resizes" not in capsys.readouterr().err  # 32 px images, a 32 px model, no crop: nothing to say


def test_a_pretrained_config_crop_is_said_in_one_line(tmp_path):
    root = _image_folder(tmp_path / "images")
    model = timm.create_model("vit_tiny_patch16_224", num_classes=2, **KWARGS)
    _, _, mine = image_transforms(model, pretrained=False)
    _, _, theirs = image_transforms(model, pretrained=True)
    assert mine["crop_pct"] == 1.0 and theirs["crop_pct"] == model.pretrained_cfg["crop_pct"] < 1.0
    image = next((root / "val").rglob("*.png"))
    assert resize_note(str(image), mine, "the pretrained config") is None
    note = resize_note(str(image), theirs, "the pretrained config")
    assert note.startswith(f"data: images are 32x32 px (e.g. {image}); evaluation resizes them to 35 px (bicubic)")
    assert "centre-crops 32 px (crop_pct 0.9 from the pretrained config)" in note and "\n" not in note


def test_a_checkpoint_that_does_not_fit_is_refused_by_validate_in_one_line(tmp_path, capsys):
    """A 6-class checkpoint for a 2-class folder: validate names the keys and shapes (header only)."""
    root = _image_folder(tmp_path / "images")
    six = timm.create_model("vit_tiny_patch16_224", num_classes=6, **KWARGS)
    save_file(six.state_dict(), str(tmp_path / "six.safetensors"))
    recipe = {
        "name": "six",
        "device": "cpu",
        "model": {"name": "vit_tiny_patch16_224", "kwargs": KWARGS, "checkpoint": str(tmp_path / "six.safetensors")},
        "data": {"source": "image_folder", "root": str(root), "batch_size": 8},
        "steps": [{"evaluate": {"plots": False, "baselines": ["base"]}}],
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {path}: model.checkpoint: {tmp_path / 'six.safetensors'}: weights do not fit")
    assert "2 shapes differ: head.weight expected [2, 48] found [6, 48]; head.bias expected [2] found [6]" in err[0]
