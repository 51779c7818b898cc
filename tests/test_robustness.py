"""Bad input fails clearly, before long work, and never leaves half-written outputs."""

import json

from compressor.core.masks import HeadMask, save_masks

from .helpers import ROOT, SMALL, run_cli

PRUNE = str(ROOT / "recipes" / "vit_prune.yaml")


def test_wrong_model_name(tmp_path):
    out = run_cli(["apply", PRUNE, "--set", "model.name=vit_tinyy_patch16_224"], tmp_path)
    assert out.returncode == 2
    assert "vit_prune.yaml: model.name: unknown timm model 'vit_tinyy_patch16_224'" in out.stderr


def test_corrupt_checkpoint_is_refused_without_unpickling(tmp_path):
    bad = tmp_path / "weights.safetensors"
    bad.write_bytes(b"\x80\x04\x95\x00 not safetensors, and pickle is never tried")
    out = run_cli(
        [
            "apply",
            PRUNE,
            *SMALL,
            "--set",
            "model.source=checkpoint",
            "--set",
            f"model.checkpoint={bad}",
            "--out",
            str(tmp_path / "run"),
        ],
        tmp_path,
    )
    assert out.returncode == 2  # bad input (recipe, file, mask), found before training
    assert f"{bad}: not a valid safetensors file" in out.stderr


def test_keep_ratio_that_removes_every_head_fails_before_training(tmp_path):
    out = run_cli(["apply", PRUNE, "--set", "steps.0.prune.keep_ratio=0.01", "--out", str(tmp_path / "run")], tmp_path)
    assert out.returncode == 2  # bad input (recipe, file, mask), found before training
    assert "vit_prune.yaml: steps[0].prune: keep_ratio 0.01 keeps no head of 12 in a block" in out.stderr
    assert "train base" not in out.stderr, "must fail before the base model is trained"


def test_masks_of_the_wrong_shape(tmp_path):
    masks = tmp_path / "old_masks.json"
    save_masks(masks, [HeadMask.from_kept([[0, 1]] * 3, [4] * 3)])  # 3 blocks; the model has 2
    out = run_cli(
        [
            "apply",
            PRUNE,
            *SMALL,
            "--set",
            f"steps.0.prune={{pruner: file, members: 1, path: {masks}}}",
            "--out",
            str(tmp_path / "run"),
        ],
        tmp_path,
    )
    assert out.returncode == 2  # bad input (recipe, file, mask), found before training
    assert f"{masks}: members[0]: has 3 blocks, the model has 2 attention blocks" in out.stderr
    assert "train base" not in out.stderr, "masks are checked against the model before training"
    missing = run_cli(["validate", PRUNE, "--set", "steps.0.prune={pruner: file, path: nope.json}"], tmp_path)
    assert (
        missing.returncode == 2
        and "path: expected an existing mask file (e.g. an earlier run's masks.json), got 'nope.json'" in missing.stderr
    )


def test_masks_from_an_earlier_run_are_reused(tmp_path):
    masks = tmp_path / "masks.json"
    save_masks(masks, [HeadMask.from_kept([[1, 3], [0]], [4, 4])])
    out = run_cli(
        [
            "apply",
            PRUNE,
            *SMALL,
            "--set",
            f"steps.0.prune={{pruner: file, members: 1, path: {masks}}}",
            "--set",
            "steps.2.finetune.steps=2",
            "--set",
            "steps.3.evaluate.plots=false",
            "--out",
            str(tmp_path / "run"),
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "masks.json").read_text())["members"][0]["kept"] == [[1, 3], [0]]
