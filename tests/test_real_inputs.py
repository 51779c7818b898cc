"""A user's own images and settings: an image folder of 32 px PNGs with a ViT built for 32 px runs
with no overlay (transforms follow the model), a size mismatch fails in validate in one line, and
the default recipe runs on the CPU in bf16."""

import json

import numpy as np
import yaml
from PIL import Image

import compressor
from compressor.run.cli import main

from .helpers import ROOT, SMALL, run_cli


def _image_folder(root, size=32):
    """Two classes (horizontal vs vertical stripes, random phase and noise) as PNG files."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 6)):
        for cls, axis in (("horizontal", 0), ("vertical", 1)):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                stripes = (np.arange(size) // 4 + rng.integers(0, 2)) % 2 * 200
                img = np.repeat(stripes[:, None] if axis == 0 else stripes[None, :], size, axis=1 - axis)
                img = np.clip(img + rng.normal(0, 20, (size, size)), 0, 255).astype(np.uint8)
                Image.fromarray(np.stack([img] * 3, -1)).save(folder / f"{i}.png")
    return root


RECIPE = {
    "name": "folder",
    "device": "cpu",
    "model": {
        "name": "vit_tiny_patch16_224",
        "kwargs": {
            "img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 4,
            "global_pool": "avg", "class_token": False,
        },
        "train_base": {"steps": 4, "batch_size": 8, "eval_every": 2},
    },
    "steps": [
        {"prune": {"pruner": "random", "members": 2}},
        {"merge": {"merger": "hydra", "mlp": "pruned"}},
        {"calibrate": {}},
        {"evaluate": {"plots": False, "baselines": ["base", "uncalibrated"]}},
        {"export": {}},
    ],
}  # fmt: skip


def test_image_folder_follows_the_model_and_predicts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = _image_folder(tmp_path / "images")
    recipe = {
        **RECIPE,
        "data": {"source": "image_folder", "root": str(root), "batch_size": 8, "calibration_samples": 8},
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["apply", "--quiet", str(path)]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "runs" / "folder" / "export" / "config.json").read_text())
    assert config["preprocessing"]["input_size"] == [3, 32, 32], "the model's size, not timm's 224 default"
    assert config["calibration"]["temperature_scope"] == "ensemble"
    summary = json.loads((tmp_path / "runs" / "folder" / "metrics.json").read_text())["summary"]
    # one temperature on the ensemble's log-probabilities never changes a prediction
    assert summary["hydra"]["accuracy"] == summary["uncalibrated"]["accuracy"]
    # a 4-step model may score every validation outlier as in-distribution: its threshold is then
    # refused (no OOD flag) and the report says why
    report = (tmp_path / "runs" / "folder" / "report.md").read_text()
    assert config["calibration"]["ood"].get("score") == "msp" or "refused, no OOD threshold stored" in report
    # a held-out split this small cannot certify 90% coverage: no sets, and the report says so
    assert config["calibration"]["conformal"] or "cannot certify coverage 0.9" in report
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(tmp_path / "runs" / "folder" / "export"), str(root / "val"), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and {r["prediction"] for r in rows} <= {"horizontal", "vertical"}
    capsys.readouterr()
    # an image size the model does not take fails before any training, in one line
    recipe["data"]["img_size"] = 48
    path.write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {path}: model/data: one test batch does not run through the model"
    )


def test_default_recipe_runs_on_the_cpu_in_bf16(tmp_path):
    out_dir = tmp_path / "run"
    args = ["apply", str(ROOT / "recipes" / "vit_hydra.yaml"), "--out", str(out_dir), *SMALL]
    args += ["--set", "device=cpu", "--set", "precision=bf16", "--set", "steps.4.evaluate.plots=false"]
    args += ["--set", "steps.2.finetune.steps=3"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert 0.0 < metrics["summary"]["base"]["accuracy"] <= 1.0
    assert (out_dir / "export" / "model.safetensors").is_file() and not (out_dir / "RUNNING").exists()
    # the default recipe calibrates: the export loads temperature-scaled, with its OOD threshold
    loaded = compressor.load(out_dir / "export")
    assert type(loaded).__name__ == "Calibrated" and loaded.ood["score"] == "msp"
    assert "**calibrate**" in (out_dir / "report.md").read_text()
    # and stores conformal thresholds; evaluate reports test coverage and set size for Hydra and the base
    assert loaded.conformal["coverage"] == 0.9 and loaded.conformal["method"] == "lac"
    assert "prediction sets (lac, coverage 90%)" in (out_dir / "report.md").read_text()
    for model in ("hydra", "base"):
        row = metrics["summary"][model]
        assert 0.0 <= row["coverage_lac"] <= 1.0 and 0.0 <= row["set_size_lac"] <= 8.0
        assert 0.0 <= row["coverage_aps"] <= 1.0 and 1.0 <= row["set_size_aps"] <= 8.0


def _validate_folder(tmp_path, capsys) -> tuple[int, str]:
    recipe = {**RECIPE, "data": {"source": "image_folder", "root": str(tmp_path / "images")}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code = main(["validate", str(tmp_path / "r.yaml")])
    captured = capsys.readouterr()
    return code, (captured.err.strip().splitlines() or [""])[-1]


def test_symlink_loops_and_links_out_of_the_folder_are_refused_by_validate(tmp_path, capsys):
    _image_folder(tmp_path / "images")
    assert _validate_folder(tmp_path, capsys)[0] == 0
    loop = tmp_path / "images" / "train" / "vertical" / "loop"
    loop.symlink_to(loop.parent, target_is_directory=True)  # torchvision follows it level after level
    code, err = _validate_folder(tmp_path, capsys)
    assert code == 2 and "are the same file" in err and "link loop" in err, err
    loop.unlink()
    outside = tmp_path / "elsewhere.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(outside)
    (tmp_path / "images" / "val" / "vertical" / "x.png").symlink_to(outside)
    code, err = _validate_folder(tmp_path, capsys)
    assert code == 2 and "outside" in err and "elsewhere.png" in err, err
