"""Bad input, table-driven: every case exits with the right code and a one-line error naming the
file and the key, within seconds (no training starts), and changes nothing outside the run folder.
Then the run folder's lock and marker and NaN guards (edited exports: test_bad_exports.py)."""

import copy
import time
from pathlib import Path

import pytest
import torch
import yaml

from compressor.core.errors import WeightsError, WorkError
from compressor.core.masks import HeadMask
from compressor.core.weights import save_weights
from compressor.data import digits_bundle
from compressor.deploy.export import export_model
from compressor.run.cli import main
from compressor.training.config import TrainConfig
from compressor.training.loop import train
from mergers.plain import prune_physically

from .conftest import make_vit
from .helpers import tree_digest

RECIPE = {
    "name": "bad",
    "model": {
        "name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 16, "patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 4},
        "train_base": {"steps": 2, "batch_size": 32},
    },
    "data": {"calibration_samples": 32},
    "steps": [
        {"prune": {"pruner": "taylor", "members": 2}},
        {"merge": {"merger": "hydra", "mlp": "pruned"}},
        {"evaluate": {"plots": False}},
        {"export": {}},
    ],
}


def _set(path: str, value):
    """A change to the recipe: set a dotted key path (list items by index)."""

    def change(r):
        keys = path.split(".")
        node = r
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        node[int(last) if isinstance(node, list) else last] = value

    return change


def _steps(steps):
    return lambda r: r.__setitem__("steps", steps)


# (id, change to the recipe or extra CLI args, expected exit code, texts the one-line error contains)
RECIPE_CASES = [
    ("unknown-top-key", lambda r: r.update(colour=1), 2, ["colour: unknown key"]),
    ("seed-type", _set("seed", "x"), 2, ["seed: expected an integer"]),
    ("name-traversal", _set("name", "../evil"), 2, ["name: expected a plain name"]),
    ("name-dot", _set("name", "."), 2, ["name: expected a plain name"]),
    ("model-missing", lambda r: r.pop("model"), 2, ["model: missing"]),
    ("model-name", _set("model.name", "vit_nope"), 2, ["model.name: unknown timm model"]),
    ("checkpoint-missing", _set("model.source", "checkpoint"), 2, ["model.checkpoint: missing"]),
    ("checkpoint-file", _set("model.checkpoint", "none.safetensors"), 2, ["model.checkpoint: no such file"]),
    ("timm-kwargs", _set("model.kwargs.num_heads", 7), 2, ["model.kwargs: timm.create_model"]),
    ("lr-inf", _set("model.train_base.lr", float("inf")), 2, ["train_base.lr: expected a finite number > 0"]),
    ("train-steps", _set("model.train_base.steps", 10**9), 2, ["train_base.steps: expected an integer in 1..100000"]),
    ("data-source", _set("data.source", "imagenet"), 2, ["data.source: expected one of"]),
    ("ood-roots-type", _set("data.ood_roots", [123]), 2, ["data.ood_roots[0]: no such folder 123"]),
    ("ood-roots-missing", _set("data.ood_roots", ["/nope"]), 2, ["data.ood_roots[0]: no such folder"]),
    ("image-folder-root", _set("data.source", "image_folder"), 2, ["data.root: missing"]),
    ("in-classes", _set("data.in_classes", [1, 1]), 2, ["data.in_classes: expected 2 to 9 distinct digits"]),
    ("batch-huge", _set("data.batch_size", 10**30), 2, ["data.batch_size: expected an integer in 1..65536"]),
    ("steps-empty", _steps([]), 2, ["steps: expected at least one step"]),
    ("steps-type", _steps("prune"), 2, ["steps: expected a list"]),
    ("step-unknown", _steps([{"fly": {}}]), 2, ["steps[0]: unknown step 'fly'"]),
    (
        "step-two-keys",
        _steps([{"prune": {"pruner": "taylor"}, "merge": {}}]),
        2,
        ["steps[0]: expected a mapping with one"],
    ),
    ("pruner-unknown", _set("steps.0.prune.pruner", "tylor"), 2, ["steps[0].prune.pruner: unknown pruner 'tylor'"]),
    (
        "pruner-popen",
        _set("steps.0.prune", {"pruner": "subprocess:Popen", "args": ["touch", "PWNED"]}),
        2,
        ["steps[0].prune.pruner: pruner 'subprocess:Popen': expected a subclass of Pruner"],
    ),
    ("pruner-system", _set("steps.0.prune.pruner", "os:system"), 2, ["expected a subclass of Pruner, got function"]),
    ("pruner-object", _set("steps.0.prune.pruner", "builtins:object"), 2, ["expected a subclass of Pruner, got class"]),
    ("pruner-module", _set("steps.0.prune.pruner", "no_such_module:X"), 2, ["cannot import module 'no_such_module'"]),
    ("members-huge", _set("steps.0.prune.members", 1000), 2, ["steps[0].prune: members: expected an integer in 1..64"]),
    (
        "keep-ratio",
        _set("steps.0.prune.keep_ratio", 1.5),
        2,
        ["steps[0].prune: keep_ratio: expected a number in [0, 1]"],
    ),
    ("prune-option", _set("steps.0.prune.colour", 1), 2, ["steps[0].prune.colour: unknown option for pruner 'taylor'"]),
    ("keeps-no-head", _set("steps.0.prune.keep_ratio", 0.01), 2, ["steps[0].prune: keep_ratio 0.01 keeps no head"]),
    (
        "trunk-too-deep",
        _set("steps.0.prune.shared_blocks", 2),
        2,
        ["steps[0].prune: shared_blocks: expected an integer in 0..1 (the model has 2 blocks", "got 2"],
    ),
    ("trunk-negative", _set("steps.0.prune.shared_blocks", -1), 2, ["prune.shared_blocks: expected an integer >= 0"]),
    (
        "trunk-redrawn",
        lambda r: (
            r["steps"][0]["prune"].update(shared_blocks=1),
            r["steps"].insert(1, {"finetune": {"target": "members", "reinit_blocks": "all"}}),
        ),
        2,
        ["steps[1].finetune: 'finetune' reinit_blocks 'all' would redraw the 1 blocks prune.shared_blocks keeps"],
    ),
    ("merge-first", _steps([{"merge": {"merger": "hydra"}}]), 2, ["steps[0].merge: 'merge' needs a 'prune' step"]),
    ("merger-unknown", _set("steps.1.merge.merger", "glue"), 2, ["steps[1].merge.merger: unknown merger 'glue'"]),
    ("mlp-mode", _set("steps.1.merge.mlp", "wide"), 2, ["steps[1].merge: mlp: expected one of"]),
    (
        "plain-member",
        _set("steps.1.merge", {"merger": "plain", "member": 7}),
        2,
        ["steps[1].merge: 'merge' merger 'plain' needs 8 member masks; the prune step before it makes 2"],
    ),
    ("finetune-merged-first", _steps([{"finetune": {"target": "merged"}}]), 2, ["'finetune' target 'merged' needs"]),
    (
        "finetune-members-late",
        lambda r: r["steps"].insert(2, {"finetune": {"target": "members"}}),
        2,
        ["steps[2].finetune: 'finetune' target 'members' after the merge would be lost"],
    ),
    (
        "reinit-merged-trunk",
        lambda r: (
            r["steps"][0]["prune"].update(shared_blocks=1),
            r["steps"].insert(2, {"finetune": {"target": "merged", "reinit_blocks": "all"}}),
        ),
        2,
        ["steps[2].finetune: 'finetune' reinit_blocks 'all' would redraw the 1 blocks prune.shared_blocks keeps"],
    ),
    (
        "reinit-too-deep",
        lambda r: r["steps"].insert(1, {"finetune": {"target": "members", "reinit_blocks": 3}}),
        2,
        ["steps[1].finetune: reinit_blocks: 3 is more than the model's 2 blocks"],
    ),
    (
        "finetune-steps",
        lambda r: r["steps"].insert(2, {"finetune": {"steps": 10**6}}),
        2,
        ["finetune.steps: expected an integer in 1..2000"],
    ),
    ("baseline-unknown", _set("steps.2.evaluate.baselines", ["base", "ensemble"]), 2, ["(unknown: ensemble)"]),
    ("export-first", _steps([{"export": {}}]), 2, ["steps[0].export: 'export' needs a 'merge' step"]),
    (
        "export-dir-up",
        _set("steps.3.export.dir", "../x"),
        2,
        ["steps[3].export.dir: expected a relative folder inside"],
    ),
    ("export-dir-abs", _set("steps.3.export.dir", "/tmp/x"), 2, ["steps[3].export.dir: expected a relative folder"]),
    ("device", _set("device", "cuda:7"), 2, ["device: 'cuda:7' asked for"]),
    ("precision", _set("precision", "fp16"), 2, ["precision: fp16 autocast needs a CUDA device"]),
    ("merger-arch", _set("model.kwargs.norm_layer", "rmsnorm"), 2, ["steps[1].merge: hydra merger does not support"]),
]

SET_CASES = [
    ("set-bad-yaml", ["--set", "seed=[1,"], ["--set 'seed=[1,': the value is not valid YAML"]),
    ("set-yaml-tag", ["--set", "seed=!!python/object/apply:os.system ['touch PWNED']"], ["not valid YAML"]),
    ("set-no-equals", ["--set", "seed"], ["--set 'seed': expected key.path=value"]),
    ("set-index", ["--set", "steps.9.prune.members=2"], ["--set steps.9: expected an index 0..3, got '9'"]),
    # rules that used to fail only after minutes of work
    (
        "keep-every-head",
        ["--set", "steps.0.prune.keep_ratio=1.0"],
        ["steps[0].prune: keep_ratio: 1.0 keeps every head, so 2 members cannot differ (distinct: true)"],
    ),
    (
        "mi-one-member",
        ["--set", "steps.0.prune.members=1", "--set", "steps.2={calibrate: {ood_score: mi}}"],
        ["steps[2].calibrate: 'calibrate' ood_score 'mi' (mutual information between members) needs an ensemble"],
    ),
    (
        "disagreement-members",
        [
            "--set",
            "steps.1={finetune: {target: members, disagreement: 0.3}}",
            "--set",
            "steps.2={merge: {merger: hydra}}",
        ],
        ["steps[1].finetune: 'finetune' disagreement rewards members for disagreeing inside one fused model"],
    ),
    ("cache-dir-file", ["--set", "cache_dir=r.yaml"], ["cache_dir: 'r.yaml' is a file; expected a folder"]),
    ("out-file", ["--set", "out=r.yaml"], ["out: 'r.yaml' is a file; expected a folder"]),
    ("export-run-folder", ["--set", "steps.3.export.dir=./"], ["steps[3].export.dir: expected a relative folder"]),
    (
        "export-into-plots",
        ["--set", "steps.3.export.dir=plots/x"],
        ["steps[3].export.dir: expected a folder of its own inside the run folder, not the run's 'plots'"],
    ),
]


def _run(argv, capsys, root: Path):
    (root / "runs").mkdir(exist_ok=True)  # where the run folder goes, as after a first run
    before = tree_digest(root, root / "runs" / "bad")
    t0 = time.time()
    code = main(argv)
    elapsed = time.time() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert tree_digest(root, root / "runs" / "bad") == before, "something outside the run folder changed"
    assert not (root / "PWNED").exists(), "a recipe ran code"
    assert not (root / "runs" / ".cache").exists(), "a base model was trained"
    return code, err, elapsed


@pytest.mark.parametrize("case", RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_bad_recipes_fail_fast_in_one_line(case, tmp_path, monkeypatch, capsys):
    name, change, code, texts = case
    monkeypatch.chdir(tmp_path)
    recipe = copy.deepcopy(RECIPE)
    change(recipe)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for command in (["validate"], ["apply", "--quiet"]):
        got, err, elapsed = _run([*command, str(path)], capsys, tmp_path)
        assert got == code and len(err) == 1, (command, err)
        assert err[0].startswith(f"error: {path}: "), err[0]
        for text in texts:
            assert text in err[0], (text, err[0])
        assert elapsed < 30


@pytest.mark.parametrize("case", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_bad_overrides_fail_fast_in_one_line(case, tmp_path, monkeypatch, capsys):
    name, args, texts = case
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    got, err, _ = _run(["validate", str(path), *args], capsys, tmp_path)
    assert got == 2 and len(err) == 1 and err[0].startswith(f"error: {path}: ")
    assert all(t in err[0] for t in texts), err[0]


@pytest.mark.parametrize(
    "content, text",
    [
        (b"\xff\xfe\x00 not utf-8", "not UTF-8 text"),
        (b"model: [unclosed", "not valid YAML"),
        (b"seed: 1\nseed: 2\nmodel: {name: x}\nsteps: []\n", "duplicate key 'seed'"),
        (None, "is a folder; expected a YAML recipe file"),
        ("missing", "no such recipe file"),
    ],
    ids=["non-utf8", "bad-yaml", "duplicate-key", "folder", "missing"],
)
def test_bad_recipe_files(content, text, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    if content is None:
        path.mkdir()
    elif content != "missing":
        path.write_bytes(content)
    got, err, _ = _run(["validate", str(path)], capsys, tmp_path)
    assert got == 2 and len(err) == 1 and err[0].startswith(f"error: {path}: ") and text in err[0], err


def test_training_stops_at_a_non_finite_loss_with_finite_weights():
    data = digits_bundle()
    vit = make_vit("tiny_cls")
    before = copy.deepcopy(vit.state_dict())
    with pytest.raises(WorkError, match="training stopped at step .*: the loss is not finite"):
        train(vit, data.train, None, TrainConfig(steps=20, batch_size=64, lr=1e30, warmup_steps=1))
    state = vit.state_dict()
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    assert all(torch.equal(state[k], before[k]) for k in before), "the weights as given were kept"


def test_non_finite_weights_never_reach_a_file(tmp_path):
    vit = make_vit("tiny_cls")
    with torch.no_grad():
        vit.head.weight[0, 0] = float("nan")
    with pytest.raises(WeightsError, match="refusing to save weights with NaN"):
        save_weights(vit.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(WeightsError, match="NaN"):
        export_model(prune_physically(vit, HeadMask.full([4, 4])), tmp_path / "e")
    assert not (tmp_path / "w.safetensors").exists() and not (tmp_path / "e").exists()


def test_a_corrupt_cache_is_retrained_not_used(tmp_path):
    from compressor.run.models import _cache_key, build_base

    data = digits_bundle()
    model_cfg = {**RECIPE["model"], "source": "timm", "pretrained": False, "checkpoint": None}
    model_cfg["train_base"] = {**TrainConfig(steps=2, batch_size=32).__dict__, "cache": True, "trainable": "all"}
    model_cfg["train_base"].pop("seed")
    data_cfg = {"source": "digits", "seed": 0}
    cached = tmp_path / f"base-{_cache_key(model_cfg, data_cfg, 0)}.safetensors"
    cached.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unusable cached base model removed"):
        model = build_base(model_cfg, data, data_cfg, 0, tmp_path)
    assert cached.is_file() and sum(p.numel() for p in model.parameters()) > 0


def test_outputs_follow_the_users_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        export_model(make_vit("tiny_cls"), tmp_path / "e")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "e").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "e" / "model.safetensors").stat().st_mode) == 0o644
