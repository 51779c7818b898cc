import pytest
import yaml

from compressor.run.recipe import RecipeError, load_recipe

from .helpers import ROOT


def write(tmp_path, data, name="r.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


BASE = {"model": {"name": "vit_tiny_patch16_224"}, "steps": [{"prune": {"pruner": "taylor"}}]}


@pytest.mark.parametrize("name", ["vit_hydra.yaml", "vit_prune.yaml", "vit_smaller.yaml", "bert_hydra.yaml"])
def test_shipped_recipes_validate(name):
    r = load_recipe(ROOT / "recipes" / name)
    assert r.steps and r.model["name"]


def test_defaults_are_filled(tmp_path):
    r = load_recipe(write(tmp_path, BASE))
    assert r.data["source"] == "digits" and r.model["source"] == "timm" and r.seed == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["model"].update(colour="red"), r"r.yaml: model.colour: unknown key; expected one of source"),
        (lambda d: d["model"].update(pretrained="yes"), r"r.yaml: model.pretrained: expected true/false"),
        (lambda d: d["data"].update(source="imagenet"), r"data.source: expected one of digits, image_folder"),
        (
            lambda d: d["steps"][0]["prune"].update(pruner="magic"),
            r"steps\[0\].prune.pruner: unknown pruner 'magic'; choices: disjoint, file, gradient_free, magnitude",
        ),
        (lambda d: d["steps"][0]["prune"].update(keep_ratio="half"), r"steps\[0\].prune: keep_ratio"),
        (
            lambda d: d["steps"][0]["prune"].update(colour=1),
            r"steps\[0\].prune.colour: unknown option for pruner 'taylor'; expected one of",
        ),
        (lambda d: d["steps"].append({"fly": {}}), r"steps\[1\]: unknown step 'fly'; expected one of prune"),
        (
            lambda d: d["steps"].append({"merge": {"merger": "hydra", "mlp": "wide"}}),
            r"steps\[1\].merge: mlp",
        ),
        (lambda d: d["steps"].insert(0, {"merge": {"merger": "plain"}}), r"'merge' needs a 'prune' step"),
        (lambda d: d["model"].pop("name"), r"model.name: missing"),
        (
            lambda d: d["model"].update(source="checkpoint", checkpoint="nope.safetensors"),
            r"model.checkpoint: no such file '/.*/nope.safetensors'",  # resolved against the recipe's folder
        ),
        (
            lambda d: d["steps"].append({"finetune": {"steps": 10**6}}),
            r"finetune.steps: expected an integer in 1..2000",
        ),
        # cross-step rules, checked before any work
        (lambda d: d["steps"].append({"export": {}}), r"steps\[1\].export: 'export' needs a 'merge' step before it"),
        (
            lambda d: d["steps"].append({"finetune": {"target": "merged"}}),
            r"steps\[1\].finetune: 'finetune' target 'merged' needs a 'merge' step before it",
        ),
        (
            lambda d: d["steps"].extend([{"merge": {"merger": "hydra"}}, {"finetune": {"target": "members"}}]),
            r"steps\[2\].finetune: 'finetune' target 'members' after the merge would be lost",
        ),
        (
            lambda d: d["steps"].append({"evaluate": {"baselines": ["base", "ensemble"]}}),
            r"steps\[1\].evaluate.baselines: expected a list of base, members, uncalibrated, deep_ensemble, mc_dropout "
            r"\(unknown: ensemble\)",
        ),
        # MLP units have one owner: the prune step's choice must reach a merge mode that keeps them
        (
            lambda d: (
                d["steps"][0]["prune"].update(mlp_keep_ratio=0.5) or d["steps"].append({"merge": {"merger": "hydra"}})
            ),
            r"steps\[1\].merge: 'merge' with this merger runs full MLPs and would discard the MLP units prune.mlp",
        ),
        (
            lambda d: (
                d["steps"][0]["prune"].update(mlp_keep_ratio=0.5)
                or d["steps"].append({"merge": {"merger": "hydra", "mlp": "pruned", "mlp_keep_ratio": 0.4}})
            ),
            r"steps\[1\].merge: 'merge' would choose MLP units a second time: prune.mlp_keep_ratio already does",
        ),
        (lambda d: d.update(steps=[]), r"r.yaml: steps: expected at least one step"),
        (
            lambda d: d["steps"][0]["prune"].update(pruner="builtins:object"),
            r"steps\[0\].prune.pruner: pruner 'builtins:object': expected a subclass of Pruner, got class",
        ),
    ],
)
def test_errors_name_file_key_and_expectation(tmp_path, change, message):
    data = yaml.safe_load(yaml.safe_dump({**BASE, "data": {}}))
    change(data)
    with pytest.raises(RecipeError, match=message):
        load_recipe(write(tmp_path, data))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed")
    with pytest.raises(RecipeError, match="bad.yaml: not valid YAML"):
        load_recipe(tmp_path / "bad.yaml")
    (tmp_path / "code.yaml").write_text("model: !!python/object/apply:os.system ['echo hi']\nsteps: []\n")
    with pytest.raises(RecipeError, match="not valid YAML"):  # safe_load refuses to build objects
        load_recipe(tmp_path / "code.yaml")


def test_overrides(tmp_path):
    r = load_recipe(write(tmp_path, BASE), ["steps.0.prune.members=4", "model.kwargs.depth=2", "seed=3"])
    assert r.steps[0][1]["members"] == 4 and r.model["kwargs"] == {"depth": 2} and r.seed == 3
    with pytest.raises(RecipeError, match=r"--set steps.5: expected an index 0..0"):
        load_recipe(write(tmp_path, BASE), ["steps.5.prune=1"])


def test_input_paths_resolve_against_the_recipe_folder_and_set_paths_against_the_cwd(tmp_path, monkeypatch):
    """A recipe in its own folder names its weights and data relative to itself; outputs and
    `--set` values stay relative to where the command runs."""
    project = tmp_path / "project"
    (project / "data" / "train").mkdir(parents=True)
    (project / "data" / "val").mkdir()
    (project / "w.safetensors").write_bytes(b"")
    recipe = {
        "model": {"name": "vit_tiny_patch16_224", "source": "checkpoint", "checkpoint": "w.safetensors"},
        "data": {"source": "image_folder", "root": "data", "ood_roots": ["data/train"]},
        "steps": [{"prune": {"pruner": "file", "path": "masks.json"}}],
        "out": "runs/x",
    }
    (project / "masks.json").write_text("{}")
    path = write(project, recipe)
    monkeypatch.chdir(tmp_path)  # somewhere else
    r = load_recipe(path)
    assert r.model["checkpoint"] == str(project / "w.safetensors")
    assert r.data["root"] == str(project / "data") and r.data["ood_roots"] == [str(project / "data" / "train")]
    assert dict(r.steps)["prune"]["path"] == str(project / "masks.json")
    assert r.out == "runs/x"  # outputs: relative to the current directory
    (tmp_path / "here.safetensors").write_bytes(b"")
    r = load_recipe(path, ["model.checkpoint=here.safetensors"])
    assert r.model["checkpoint"] == "here.safetensors"  # --set: relative to the current directory
