"""`data.source: dataset` end to end: the base a run trains, evaluated by hand on the user's own
test rows (pandas or datasets, the tokenizer or timm's transform, the model), has the reported
accuracy and NLL; predict reads a table's column in row order; torchrun equals one process."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pytest
import torch
import yaml

from compressor.data.text import minilm_path
from compressor.run.cli import main

from .test_own_dataset import CLASSES, _edit, image_recipe, text_recipe, write_table


def test_report_base_accuracy_equals_an_own_evaluation_of_the_csv_test_rows(tmp_path, monkeypatch):
    """A user's check: the base model the run trained, evaluated by hand on the CSV's test rows
    (pandas + the tokenizer + the model), has the accuracy the run's metrics report."""
    from transformers import AutoModel, AutoTokenizer

    from compressor.core.weights import load_weights
    from compressor.families.classifiers import MeanPoolClassifier

    monkeypatch.chdir(tmp_path)
    recipe = text_recipe(tmp_path)
    assert main(["validate", str(recipe)]) == 0
    assert main(["apply", "--quiet", str(recipe)]) == 0
    metrics = json.loads((tmp_path / "runs" / "own" / "metrics.json").read_text())
    state = load_weights(next((tmp_path / "runs" / ".cache").glob("base-*.safetensors")))
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    model = MeanPoolClassifier(AutoModel.from_pretrained(str(minilm_path())), 4, tok.pad_token_id)
    model.load_state_dict(state)
    with open(tmp_path / "test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ids = tok([r["text"] for r in rows], padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(ids["input_ids"])
    truth = torch.tensor([sorted(CLASSES).index(r["label"]) for r in rows])
    own = float((logits.argmax(-1) == truth).float().mean())
    assert metrics["models"]["base"]["test"]["accuracy"] == pytest.approx(own, abs=1e-9)
    own_nll = float(torch.nn.functional.cross_entropy(logits, truth))
    assert metrics["models"]["base"]["test"]["nll"] == pytest.approx(own_nll, rel=1e-4), "the inputs, not just argmax"


def test_predict_reads_a_table_column_in_row_order(tmp_path, monkeypatch, capsys):
    from compressor.deploy.predict import predict_inputs

    monkeypatch.chdir(tmp_path)
    recipe = _edit(text_recipe(tmp_path), lambda c, f: c["steps"].extend([
        {"prune": {"pruner": "random", "members": 2}}, {"merge": {"merger": "hydra", "mlp": "average"}}, {"export": {}},
    ]))  # fmt: skip
    cfg = yaml.safe_load(recipe.read_text())
    cfg["steps"] = cfg["steps"][1:3] + [cfg["steps"][0], cfg["steps"][3]]
    recipe.write_text(yaml.safe_dump(cfg))
    assert main(["apply", "--quiet", str(recipe)]) == 0
    texts = ["a poem about verse", "an engine", "a river", "an apple", "a river again"]
    write_table([{"id": i, "body": t} for i, t in enumerate(texts)], tmp_path / "new.parquet")
    export = tmp_path / "runs" / "own" / "export"
    rows = predict_inputs(export, tmp_path / "new.parquet", column="body", batch_size=2)
    assert [r["input"] for r in rows] == texts
    by_txt = predict_inputs(export, _lines(tmp_path / "new.txt", texts), batch_size=2)
    assert [r["probability"] for r in rows] == [r["probability"] for r in by_txt], "the same as one text per line"
    assert main(["predict", str(export), str(tmp_path / "new.parquet"), "--column", "nope"]) == 2
    assert "no column 'nope'; it has id, body" in capsys.readouterr().err


def _lines(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def test_report_base_accuracy_equals_an_own_evaluation_of_the_saved_images(tmp_path, monkeypatch):
    """The same user's check for images: the base the run trained, evaluated by hand on the
    save_to_disk test split (datasets + timm's own transform + the model), has the reported accuracy."""
    import timm

    from compressor.core.weights import load_weights

    monkeypatch.chdir(tmp_path)
    recipe = image_recipe(tmp_path)
    assert main(["apply", "--quiet", str(recipe)]) == 0
    metrics = json.loads((tmp_path / "runs" / "own_images" / "metrics.json").read_text())
    cfg = yaml.safe_load(recipe.read_text())["model"]
    model = timm.create_model(cfg["name"], num_classes=2, **cfg["kwargs"])
    model.load_state_dict(load_weights(next((tmp_path / "runs" / ".cache").glob("base-*.safetensors"))))
    test = datasets.load_from_disk(str(tmp_path / "images"))["test"]
    own_weights = {"input_size": (3, 16, 16), "crop_pct": 1.0}  # own weights see the whole image (README)
    resolved = timm.data.resolve_data_config(own_weights, model=model)
    transform = timm.data.create_transform(**resolved, is_training=False)
    x = torch.stack([transform(row["image"].convert("RGB")) for row in test])
    with torch.no_grad():
        logits = model.eval()(x)
    truth = torch.tensor(test["label"])
    own = float((logits.argmax(-1) == truth).float().mean())
    assert metrics["models"]["base"]["test"]["accuracy"] == pytest.approx(own, abs=1e-9)
    own_nll = float(torch.nn.functional.cross_entropy(logits, truth))
    assert metrics["models"]["base"]["test"]["nll"] == pytest.approx(own_nll, rel=1e-4), "the inputs, not just argmax"


def test_a_saved_dataset_under_torchrun_matches_one_process(tmp_path):
    """`torchrun --nproc_per_node 2` on a save_to_disk dataset: each rank reads the same files, the metrics
    equal one process's."""
    import os
    import subprocess
    import sys

    from .helpers import ROOT, run_cli
    from .test_distributed import free_port

    recipe = yaml.safe_load(image_recipe(tmp_path).read_text())
    recipe["data"]["batch_size"] = 8
    recipe["steps"] = [{"prune": {"pruner": "random", "members": 2}}, {"merge": {"merger": "hydra", "mlp": "average"}},
                       {"evaluate": {"baselines": ["base"], "plots": False}}]  # fmt: skip
    recipe["model"]["train_base"]["cache"] = False
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    single = run_cli(["apply", str(path), "--out", str(tmp_path / "one")], tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(ROOT))
    run = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    cmd = [sys.executable, *run, "--master_port", str(free_port()), "-m", "compressor", "apply", str(path)]
    cmd += ["--out", str(tmp_path / "two")]
    multi = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert multi.returncode == 0, multi.stderr[-3000:]
    a = json.loads((tmp_path / "one" / "metrics.json").read_text())["summary"]
    b = json.loads((tmp_path / "two" / "metrics.json").read_text())["summary"]
    for model in a:
        for key in ("accuracy", "nll", "brier"):
            assert b[model][key] == pytest.approx(a[model][key], rel=1e-3, abs=1e-4), (model, key)
