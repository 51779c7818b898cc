"""`data.source: dataset`: a user's CSV / JSON Lines / Parquet files or save_to_disk folders, read
with Hugging Face `datasets`. Checked against independent reads (pandas, the tokenizer itself, timm's
transform on the PIL image), every bad-data case as a one-line `validate` error, and predict on a table."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from compressor.data import load_bundle
from compressor.data.text import minilm_path
from compressor.run.cli import main
from compressor.run.recipe import load_recipe

datasets.disable_progress_bars()  # the tables these tests write would print bars into captured stderr

WORDS = ["apple", "river", "engine", "poem"]
CLASSES = ["fruit", "water", "machine", "verse"]


def text_rows(n_per_class: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(n_per_class):
        for word, label in zip(WORDS, CLASSES):
            rows.append({"text": f"a {word} text number {i + offset} about {label}", "label": label})
    return rows


def write_table(rows: list[dict], path: Path) -> None:
    """Write rows with `datasets` in the format the suffix names."""
    table = datasets.Dataset.from_list(rows)
    {".csv": table.to_csv, ".jsonl": table.to_json, ".parquet": table.to_parquet}[path.suffix](str(path))


def text_recipe(folder: Path, suffix: str = ".csv", **data) -> Path:
    builder = {".csv": "csv", ".jsonl": "json", ".parquet": "parquet"}[suffix]
    write_table(text_rows(6), folder / f"train{suffix}")
    write_table(text_rows(3, offset=100), folder / f"test{suffix}")
    write_table([{"text": f"une phrase {i} en français"} for i in range(8)], folder / "ood.jsonl")
    recipe = {
        "name": "own",
        "model": {"source": "hf", "name": "minilm", "train_base": {"steps": 3, "batch_size": 8, "eval_every": 3}},
        "data": {
            "source": "dataset",
            "path": builder,
            "data_files": {"train": f"train{suffix}", "test": f"test{suffix}"},
            "text_column": "text",
            "label_column": "label",
            "ood": [{"path": "json", "data_files": "ood.jsonl", "name": "french"}],
            "max_length": 16,
            "batch_size": 16,
            "calibration_samples": 16,
            **data,
        },
        "steps": [{"evaluate": {"baselines": ["base"], "plots": False}}],
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_text_files_load_as_pandas_reads_them_and_tokenize_as_the_tokenizer_does(tmp_path, suffix):
    from transformers import AutoTokenizer

    recipe = load_recipe(text_recipe(tmp_path, suffix))
    data = load_bundle(recipe.data, "minilm", base=tmp_path)
    read = pd.read_csv if suffix == ".csv" else pd.read_parquet if suffix == ".parquet" else None
    test = read(tmp_path / f"test{suffix}") if read else pd.read_json(tmp_path / "test.jsonl", lines=True)
    assert data.class_names == sorted(CLASSES)
    labels = [data.class_names.index(v) for v in test["label"]]
    assert data.test.tensors[1].tolist() == labels
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    ids = tok(list(test["text"]), padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    assert torch.equal(data.test.tensors[0], ids["input_ids"])
    assert len(data.train) + len(data.val) == 24 and len(data.val) == round(0.1 * 24)
    assert list(data.ood) == ["french"] and len(data.ood["french"]) == 8


def test_save_to_disk_text_with_a_classlabel_and_a_validation_split(tmp_path):
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=CLASSES)})
    encode = lambda rows: {"text": [r["text"] for r in rows], "label": [CLASSES.index(r["label"]) for r in rows]}  # noqa: E731
    splits = {name: datasets.Dataset.from_dict(encode(text_rows(n, o)), features) for name, n, o in
              (("train", 5, 0), ("validation", 2, 50), ("test", 2, 100))}  # fmt: skip
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "disk")
    cfg = yaml.safe_load(text_recipe(tmp_path).read_text())
    cfg["data"].update(path="disk", data_files=None, ood=[])
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(cfg))
    data = load_bundle(load_recipe(tmp_path / "recipe.yaml").data, "minilm", base=tmp_path)
    assert data.class_names == CLASSES, "a ClassLabel's names, in its order"
    assert len(data.val) == 8 and len(data.train) == 20, "the validation split is the held-out split"
    assert data.val.tensors[1].tolist() == splits["validation"]["label"]


def image_disk(folder: Path, n_per_class: int = 4) -> Path:
    from PIL import Image

    g = np.random.default_rng(0)
    names = ["dark", "light"]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})

    def table(n: int) -> datasets.Dataset:
        images = [
            Image.fromarray(g.integers(0, 100 + 155 * c, (8, 8), dtype=np.uint8)) for c in (0, 1) for _ in range(n)
        ]
        return datasets.Dataset.from_dict({"image": images, "label": [c for c in (0, 1) for _ in range(n)]}, features)

    datasets.DatasetDict({"train": table(n_per_class), "test": table(2)}).save_to_disk(folder / "images")
    return folder / "images"


def image_recipe(folder: Path, **data) -> Path:
    image_disk(folder)
    recipe = {
        "name": "own_images",
        "model": {
            "name": "vit_tiny_patch16_224",
            "kwargs": {"img_size": 16, "patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 4},
            "train_base": {"steps": 2, "batch_size": 8},
        },
        "data": {
            "source": "dataset",
            "path": "images",
            "image_column": "image",
            "img_size": 16,
            "augment": "none",
            "calibration_samples": 8,
            **data,
        },  # fmt: skip
        "steps": [{"evaluate": {"baselines": ["base"], "plots": False}}],
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_images_from_save_to_disk_go_through_the_models_timm_transform(tmp_path):
    import timm
    import timm.data

    recipe = load_recipe(image_recipe(tmp_path))
    model = timm.create_model("vit_tiny_patch16_224", num_classes=2, img_size=16, patch_size=4, embed_dim=48, depth=2,
                              num_heads=4)  # fmt: skip
    data = load_bundle(recipe.data, recipe.model["name"], model, base=tmp_path)
    raw = datasets.load_from_disk(str(tmp_path / "images"))["test"]
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in data.preprocessing.items() if k != "kind"}
    transform = timm.data.create_transform(**cfg, is_training=False)
    for i in range(len(raw)):
        x, y = data.test[i]
        assert torch.equal(x, transform(raw[i]["image"].convert("RGB"))) and int(y) == raw[i]["label"]
    assert data.class_names == ["dark", "light"]


def run_validate(recipe: Path, capsys) -> tuple[int, list[str]]:
    code = main(["validate", str(recipe)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


def _edit(recipe: Path, change) -> Path:
    cfg = yaml.safe_load(recipe.read_text())
    change(cfg, recipe.parent)
    recipe.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return recipe


def _rewrite(name: str, rows: list[dict]):
    return lambda cfg, folder: write_table(rows, folder / name)


def _csv_text(name: str, text: str):
    return lambda cfg, folder: (folder / name).write_text(text, encoding="utf-8")


def _heldout_with(label: str):
    def change(cfg: dict, folder: Path) -> None:
        write_table([{"text": "p q", "label": "fruit"}, {"text": "r s", "label": label}], folder / "val.csv")
        cfg["data"]["data_files"]["validation"] = "val.csv"

    return change


TEXT_CASES = [
    ("missing-column", lambda c, f: c["data"].update(text_column="body"),
     ["data.text_column: no column 'body' in split 'train'", "it has text, label"]),
    ("empty-text", _csv_text("train.csv", "text,label\n" + "a b,fruit\n" * 3 + '"  ",water\nc d,water\ne f,water\n'),
     ["column 'text', split 'train', row 3: an empty text; expected a non-empty text"]),
    ("null-text", _csv_text("train.csv", "text,label\n" + "a b,fruit\n" * 3 + ",water\nc d,water\ne f,water\n"),
     ["column 'text', split 'train', row 3: NoneType None; expected a non-empty text"]),
    ("unseen-heldout-label", _heldout_with("metal"),
     ["column 'label', split 'validation': label 'metal' that the train split never has"]),
    ("unseen-label", _rewrite("test.csv", [{"text": "x y", "label": "fruit"}, {"text": "z w", "label": "metal"}]),
     ["column 'label', split 'test': label 'metal' that the train split never has"]),
    ("one-class", _rewrite("train.csv", [{"text": f"t {i}", "label": "fruit"} for i in range(4)]),
     ["column 'label', split 'train': 1 class; expected at least 2"]),
    ("lonely-class", _rewrite("train.csv", text_rows(3) + [{"text": "odd one", "label": "rock"}]),
     ["class 'rock' has 1 training samples; expected at least 2 per class"]),
    ("ood-shares-rows", _rewrite("ood.jsonl", [{"text": text_rows(6)[5]["text"]}, {"text": "fresh"}]),
     ["data.ood[0]: 1 of its 2 rows are also in the train split"]),
    ("hub-offline", lambda c, f: c["data"].update(path="someone/their-dataset", data_files=None),
     ["data.path: 'someone/their-dataset' is not a local folder", "there is no network here"]),
    ("no-file", lambda c, f: c["data"]["data_files"].update(test="nope.csv"), ["data.data_files: no such file"]),
    ("no-test", lambda c, f: c["data"]["data_files"].pop("test"), ["data.data_files: no 'test' split"]),
]  # fmt: skip


@pytest.mark.parametrize("case", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_bad_text_data_stops_validate_in_one_line(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, change, texts = case
    recipe = _edit(text_recipe(tmp_path), change)
    code, err = run_validate(recipe, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {recipe}: "), err[0]
    assert all(t in err[0] for t in texts), err[0]
    assert not (tmp_path / "runs").exists(), "no run folder"


def test_bad_image_data_stops_validate_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = image_recipe(tmp_path)
    good = datasets.load_from_disk(str(tmp_path / "images"))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["dark", "light"])})
    broken = datasets.Dataset.from_dict(
        {"image": [{"bytes": b"not a png", "path": None}] * 2, "label": [0, 1]}, features
    )
    datasets.DatasetDict({"train": good["train"], "test": broken}).save_to_disk(tmp_path / "broken")
    _edit(recipe, lambda c, f: c["data"].update(path="broken"))
    code, err = run_validate(recipe, capsys)
    assert code == 2 and len(err) == 1, err
    assert "column 'image', split 'test', row 0: not a decodable image" in err[0], err[0]
    ints = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    test = datasets.Dataset.from_dict({"image": good["test"]["image"][:2], "label": [0, 5]}, ints)
    datasets.DatasetDict({"train": good["train"], "test": test}).save_to_disk(tmp_path / "labels")
    _edit(recipe, lambda c, f: c["data"].update(path="labels"))
    code, err = run_validate(recipe, capsys)
    expected = "split 'test', row 1: label 5; expected an integer in 0..1 (the classes of the ClassLabel)"
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "runs").exists()
