"""recipes/bert_hydra.yaml end to end on a few texts: the paper's pipeline on the real MiniLM, its
fused model sharing one copy of the frozen embeddings, and the recipe checks around it."""

from __future__ import annotations

import json

import pytest
import yaml

from compressor.run.recipe import RecipeError, load_recipe

from .helpers import ROOT, run_cli

QUICK = [
    "--set",
    "data.max_samples=40",
    "--set",
    "model.train_base.steps=3",
    "--set",
    "model.train_base.eval_every=3",
    "--set",
    "steps.1.finetune.steps=2",
    "--set",
    "steps.1.finetune.eval_every=2",
    "--set",
    "data.calibration_samples=16",
]


def test_bert_hydra_runs_end_to_end(tmp_path):
    out = tmp_path / "run"
    done = run_cli(["apply", str(ROOT / "recipes" / "bert_hydra.yaml"), "--out", str(out), "--quiet", *QUICK], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    hydra, base = metrics["models"]["hydra"], metrics["models"]["base"]
    assert set(hydra["ood"]) == {"plot_summaries", "headlines", "wiki_en", "wiki_fr", "wiki_es"}
    # one shared copy of the frozen embeddings (without it three, about 2x the parameters) and one
    # averaged MLP per block; its FLOPs are the paper's: the whole MLP runs on all 3 member streams
    assert hydra["params_ratio"] < 1.15, hydra["params_ratio"]
    assert 2.3 < hydra["flops_ratio"] < 2.7, hydra["flops_ratio"]
    assert base["params_ratio"] == 1.0
    spec = json.loads((out / "export" / "config.json").read_text())["hydra_spec"]
    assert spec["shared"]["stem"] is True


def _write(tmp_path, change) -> str:
    raw = yaml.safe_load((ROOT / "recipes" / "bert_hydra.yaml").read_text())
    change(raw)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_freeze_embeddings_needs_member_fine_tunes(tmp_path):
    def merged(raw):
        raw["steps"].insert(3, {"finetune": {"target": "merged", "freeze_embeddings": True}})

    with pytest.raises(RecipeError, match="freeze_embeddings needs target 'members'"):
        load_recipe(_write(tmp_path, merged))


def test_unknown_text_task_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="data.task: expected one of sentiment, topics"):
        load_recipe(_write(tmp_path, lambda raw: raw["data"].update(task="news")))
