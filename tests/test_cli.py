"""`compressor` end to end, as a user runs it: real subprocesses, real files."""

import json

import torch
from PIL import Image

import compressor
from compressor.data import digits_bundle

from .helpers import ROOT, SMALL, run_cli

PLUGINS = ROOT / "tests" / "plugins"


def test_list_and_help(tmp_path):
    out = run_cli(["list"], tmp_path)
    assert out.returncode == 0, out.stderr
    for name in ("magnitude", "taylor", "gradient_free", "random", "disjoint", "hydra", "plain"):
        assert f"  {name} " in out.stdout
    helptext = run_cli(["apply", "--help"], tmp_path).stdout
    assert "--set KEY.PATH=VALUE" in helptext and "--out DIR" in helptext


def test_validate_reports_errors_before_work(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "recipes" / "vit_prune.yaml").read_text().replace("gradient_free", "gradient_freee"))
    out = run_cli(["apply", str(bad)], tmp_path)
    assert out.returncode == 2
    assert "bad.yaml: steps[0].prune.pruner: unknown pruner 'gradient_freee'; choices:" in out.stderr
    assert not (tmp_path / "runs").exists(), "nothing may run before validation passes"
    assert run_cli(["validate", str(ROOT / "recipes" / "vit_hydra.yaml")], tmp_path).returncode == 0


def test_apply_vit_prune_end_to_end(tmp_path):
    out_dir = tmp_path / "run"
    args = [
        "apply",
        str(ROOT / "recipes" / "vit_prune.yaml"),
        "--out",
        str(out_dir),
        *SMALL,
        "--set",
        "steps.2.finetune.steps=4",
    ]
    out = run_cli(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for f in (
        "masks.json",
        "metrics.json",
        "metrics.md",
        "report.md",
        "export/model.safetensors",
        "export/config.json",
        "plots/reliability_plain.png",
        "plots/head_importance.png",
    ):
        assert (out_dir / f).is_file(), f
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert {"plain", "base"} <= set(metrics["summary"])
    for key in ("accuracy", "nll", "ece", "brier", "auroc_msp", "fpr95_msp"):
        assert key in metrics["summary"]["plain"]
    for png in ("reliability_plain.png", "reliability_base.png", "head_importance.png"):
        with Image.open(out_dir / "plots" / png) as im:
            assert im.format == "PNG" and im.size[0] > 100
            im.verify()
    assert "| plain |" in (out_dir / "metrics.md").read_text()
    # the export loads with one call, no recipe, and is physically smaller
    model = compressor.load(out_dir / "export").model
    assert [b.attn.num_heads for b in model.blocks] == [2, 2]
    x = digits_bundle().test[:4][0]
    assert model(x).shape == (4, 8)
    assert "Hydra" not in type(model).__name__ and isinstance(model, torch.nn.Module)


def _plugin_recipe(tmp_path, pruner: str):
    text = (ROOT / "recipes" / "vit_hydra.yaml").read_text()
    text = text.replace("pruner: taylor", f"pruner: {pruner}\n      n: 2").replace("      keep_ratio: 0.5\n", "")
    text = text.replace("      diversity: bootstrap\n", "")
    p = tmp_path / "plugin.yaml"
    p.write_text(text)
    return p


def test_custom_pruner_by_import_path(tmp_path):
    recipe = _plugin_recipe(tmp_path, "my_pruners:KeepFirstHeads")
    args = [
        "apply",
        str(recipe),
        "--out",
        str(tmp_path / "run"),
        *SMALL,
        "--set",
        "steps.2.finetune.steps=2",
        "--set",
        "steps.4.evaluate.plots=false",
    ]
    out = run_cli(args, tmp_path, extra_path=[PLUGINS])
    assert out.returncode == 0, out.stderr[-3000:]
    masks = json.loads((tmp_path / "run" / "masks.json").read_text())["members"]
    assert [m["kept"][0] for m in masks] == [[0, 1], [1, 2], [2, 3]]
    assert compressor.load(tmp_path / "run" / "export").members == 3


def test_custom_pruner_by_entry_point(tmp_path):
    dist = tmp_path / "site" / "my_pruners_pkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pruners-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[compressor.pruners]\nfirst_heads = my_pruners:KeepFirstHeads\n")
    listing = run_cli(["list"], tmp_path, extra_path=[PLUGINS, tmp_path / "site"])
    assert "first_heads" in listing.stdout and "Keep the first n heads" in listing.stdout
    recipe = _plugin_recipe(tmp_path, "first_heads")
    out = run_cli(["validate", str(recipe)], tmp_path, extra_path=[PLUGINS, tmp_path / "site"])
    assert out.returncode == 0, out.stderr


def test_merger_that_cannot_fuse_the_architecture_fails_in_validate(tmp_path):
    """RmsNorm blocks cannot be fused exactly: `validate` says so in one line, and `apply` stops
    before the base model is trained."""
    hydra = str(ROOT / "recipes" / "vit_hydra.yaml")
    out = run_cli(["validate", hydra, "--set", "model.kwargs.norm_layer=rmsnorm"], tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith(f"error: {hydra}: steps[1].merge: hydra merger does not support this model:")
    assert "norm RmsNorm (LayerNorm expected)" in lines[0]
    run = tmp_path / "runs" / "r"
    out = run_cli(["apply", hydra, *SMALL, "--set", "model.kwargs.norm_layer=rmsnorm", "--out", str(run)], tmp_path)
    assert out.returncode == 2 and "train base" not in out.stderr
    assert not (tmp_path / "runs" / ".cache").exists(), "no base model was trained"


def _entry_point_site(tmp_path, group: str, line: str):
    dist = tmp_path / "site" / "my_plugins_pkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{line}\n")
    return tmp_path / "site"


def readme_plugins(tmp_path):
    """The README's plugin examples (its `# my_pkg/...` code blocks), written out as a package."""
    readme = (ROOT / "README.md").read_text()
    pkg = tmp_path / "src" / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in ("pruners", "steps"):
        block = readme.split(f"# my_pkg/{name}.py\n", 1)[1].split("```", 1)[0]
        (pkg / f"{name}.py").write_text(block)
    return tmp_path / "src"


def test_readme_plugins_run_by_entry_point(tmp_path):
    """The README's pruner and step, registered by entry point, run in a real recipe."""
    src = readme_plugins(tmp_path)
    site = _entry_point_site(tmp_path, "compressor.steps", "note = my_pkg.steps:note_step")
    with open(site / "my_plugins_pkg-0.1.dist-info" / "entry_points.txt", "a") as f:
        f.write("[compressor.pruners]\nfirst_heads = my_pkg.pruners:KeepFirstHeads\n")
    listing = run_cli(["list"], tmp_path, extra_path=[src, site])
    assert "  note " in listing.stdout and "Write note.json" in listing.stdout
    assert "  first_heads " in listing.stdout
    recipe = tmp_path / "note.yaml"
    steps = (
        "steps:\n  - prune: {pruner: first_heads, n: 2, members: 2}\n  - merge: {merger: plain}\n  - note: {text: hi}\n"
    )
    recipe.write_text((ROOT / "recipes" / "vit_prune.yaml").read_text().split("\nsteps:")[0] + "\n" + steps)
    out = run_cli(["apply", str(recipe), *SMALL, "--out", str(tmp_path / "run")], tmp_path, extra_path=[src, site])
    assert out.returncode == 0, out.stderr[-3000:]
    masks = json.loads((tmp_path / "run" / "masks.json").read_text())["members"]
    assert [m["kept"][0] for m in masks] == [[0, 1], [1, 2]]
    note = json.loads((tmp_path / "run" / "note.json").read_text())
    assert note["text"] == "hi" and note["members"] == 2 and note["params"] > 0
    bad = run_cli(["validate", str(recipe), "--set", "steps.2.note.colour=1"], tmp_path, extra_path=[src, site])
    assert bad.returncode == 2 and "steps[2].note.colour: unknown key; expected one of text" in bad.stderr


def test_entry_point_that_is_not_a_step_is_refused(tmp_path):
    src = readme_plugins(tmp_path)
    site = _entry_point_site(tmp_path, "compressor.steps", "note = my_pkg.steps:write_note")
    recipe = tmp_path / "note.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "vit_prune.yaml").read_text().split("\nsteps:")[0] + "\n" + "steps:\n  - note: {}\n"
    )
    out = run_cli(["validate", str(recipe)], tmp_path, extra_path=[src, site])
    assert out.returncode == 2
    assert "step 'note': expected an instance of Step, got function my_pkg.steps.write_note" in out.stderr
