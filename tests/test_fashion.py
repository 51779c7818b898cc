"""The committed Fashion-MNIST subset and its data source: checked file, splits, and inputs equal
to what the recorded preprocessing makes of an image file (what predict does)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import timm
import torch

from compressor.core.errors import InputError, RecipeError
from compressor.data import committed, image_transforms
from compressor.data.fashion import CLASSES, fashion_arrays, fashion_bundle
from compressor.run.recipe import validate_recipe

MODEL = {"source": "timm", "name": "vit_tiny_patch16_224"}


def test_the_subset_is_balanced_and_checked(monkeypatch, tmp_path):
    a = fashion_arrays()
    assert a["train_x"].shape == (3000, 28, 28) and a["test_x"].shape == (1000, 28, 28)
    assert np.bincount(a["train_y"]).tolist() == [300] * 10 and np.bincount(a["test_y"]).tolist() == [100] * 10
    folder = tmp_path / "datasets"
    shutil.copytree(committed.DATASETS, folder)
    (folder / "fashion_mnist.npz").write_bytes(b"edited")
    monkeypatch.setattr(committed, "DATASETS", folder)
    with pytest.raises(InputError, match=r"data.source 'fashion_mnist': .*sha256 differs from MANIFEST.json"):
        fashion_arrays()


def test_bundle_follows_the_model_and_matches_an_image_file(tmp_path):
    from PIL import Image

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3, depth=1).eval()
    tf_eval, _, cfg = image_transforms(model, {}, "none", pretrained=False)
    data = fashion_bundle(tf_eval, cfg, in_classes=[0, 5, 9], seed=0)
    assert data.class_names == [CLASSES[0], CLASSES[5], CLASSES[9]]
    assert len(data.train) + len(data.val) == 900 and len(data.test) == 300
    assert len(data.ood["held_out_classes"]) == 700 and {"digits", "photos"} <= set(data.ood)
    x, y = data.test[0]
    assert x.shape == (3, 32, 32) and 0 <= int(y) < 3
    # the export's recorded preprocessing, applied by timm to a PNG of the same image, gives the same input
    a = fashion_arrays()
    first_test = a["test_x"][np.isin(a["test_y"], [0, 5, 9])][0]
    Image.fromarray(first_test).save(tmp_path / "im.png")
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in data.preprocessing.items() if k != "kind"}
    again = timm.data.create_transform(**settings, is_training=False)(Image.open(tmp_path / "im.png").convert("RGB"))
    torch.testing.assert_close(again, x)


def test_in_classes_are_checked_before_any_work():
    raw = {"name": "t", "model": MODEL, "data": {"source": "fashion_mnist", "in_classes": [0, 0, 3]}}
    raw["steps"] = [{"evaluate": {}}]
    with pytest.raises(RecipeError, match="data.in_classes"):
        validate_recipe(raw, "r.yaml")


def test_an_evaluate_step_with_nothing_to_evaluate_is_refused():
    raw = {"name": "t", "model": MODEL, "steps": [{"evaluate": {"baselines": []}}]}
    with pytest.raises(RecipeError, match="'evaluate' has nothing to evaluate"):
        validate_recipe(raw, "r.yaml")


def test_the_resize_to_the_models_input_is_said_in_one_line():
    from compressor.data import load_bundle
    from compressor.run.recipe import DATA_SCHEMA

    cfg = {k: f.default for k, f in DATA_SCHEMA.items()} | {"source": "fashion_mnist"}
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3, depth=1).eval()
    data = load_bundle(cfg, "vit_tiny_patch16_224", model)
    assert data.notes == [
        "data: images are 28x28 px (Fashion-MNIST); evaluation resizes them to 32 px (bicubic); "
        "set data.img_size / data.crop_pct to change it"
    ]
