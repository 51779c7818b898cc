"""The benchmark scripts: row definitions are valid recipes (a typo fails here, not after an hour), and
result files of seeds run apart join into the right means."""

import copy
import importlib.util
import json

import numpy as np
import pytest

from compressor.run.recipe import validate_recipe

from .helpers import ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


uq_table = _load("uq_table")


def test_every_uq_table_row_validates_as_a_recipe():
    for name, (_, steps) in uq_table.digit_rows(100).items():
        raw = copy.deepcopy(uq_table.base_recipe())
        raw["steps"] = steps + [{"evaluate": {"baselines": ["base"], "plots": False}}]
        validate_recipe(raw, where=f"uq_table:{name}")


@pytest.mark.parametrize("task", ["sentiment", "topics", "fashion"])
def test_every_text_table_row_validates_as_a_recipe(task, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    text_table = _load("text_table")
    for name, steps in text_table.rows(task).items():
        raw = text_table.recipe(task)
        evaluate = {"baselines": ["base", "deep_ensemble", "mc_dropout"], "deep_ensemble_seeds": [1, 2]}
        raw["steps"] = steps + [{"evaluate": {**evaluate, "mc_dropout_samples": 4, "plots": False}}]
        validate_recipe(raw, where=f"text_table:{name}")
    assert set(text_table.ROW_SETS["main"]) <= set(text_table.rows(task))


def test_every_named_row_set_names_existing_rows():
    known = set(uq_table.digit_rows(100))
    for set_name, rows in uq_table.ROW_SETS.items():
        assert set(rows) <= known, (set_name, set(rows) - known)


def test_results_of_seeds_run_apart_merge_into_the_mean_over_the_seeds_that_have_each_row(tmp_path, monkeypatch):
    monkeypatch.setattr(uq_table, "RESULTS", tmp_path)
    uq_table.write_results("a", [0], [{"base": {"acc": 0.5}, "extra": {"acc": 0.1}}], 1.0, rows=["extra"])
    uq_table.write_results("b", [1, 2], [{"base": {"acc": 0.7}}, {"base": {"acc": 0.9}}], 2.5, rows=["extra"])
    uq_table.merge_results(["a", "b"], "joined", keep="rows")
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert joined["seeds"] == [0, 1, 2] and joined["minutes"] == 3.5 and joined["rows"] == ["extra"]
    assert joined["mean"]["base"]["acc"] == pytest.approx(0.7)
    assert joined["std"]["base"]["acc"] == pytest.approx(np.std([0.5, 0.7, 0.9]))
    assert joined["mean"]["extra"]["acc"] == pytest.approx(0.1) and joined["seeds_per_row"]["extra"] == [0]
    assert (tmp_path / "joined.md").exists()
    # a row run later for the same seeds, in its own process: joined seed by seed, not as new seeds
    uq_table.write_results("c", [0, 2], [{"later": {"acc": 0.2}}, {"later": {"acc": 0.4}}], 1.0, rows=["later"])
    uq_table.merge_results(["joined", "c"], "all")
    joined = json.loads((tmp_path / "all.json").read_text())
    assert joined["seeds"] == [0, 1, 2] and joined["rows"] == ["extra", "later"]
    assert joined["seeds_per_row"] == {"base": [0, 1, 2], "extra": [0], "later": [0, 2]}
    assert joined["mean"]["later"]["acc"] == pytest.approx(0.3) and joined["mean"]["base"]["acc"] == pytest.approx(0.7)


def test_text_table_merges_new_rows_into_an_earlier_summary(tmp_path, monkeypatch):
    """A row run later (its own part file) joins the earlier summary's rows seed by seed; a row
    measured on one seed shows its value alone, named with its seed, never as '± 0.000'."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    text_table = _load("text_results")
    monkeypatch.setattr(text_table, "RESULTS", tmp_path)

    def part(seed: int, rows: dict, suffix: str = "") -> None:
        payload = {"task": "topics", "seed": seed, "rows": rows}
        (tmp_path / f"text_topics_seed{seed}{suffix}.json").write_text(json.dumps(payload))

    row = lambda acc: {"accuracy": acc, "auroc/a": acc, "fpr95/a": 1 - acc}  # noqa: E731
    for seed, acc in enumerate([0.5, 0.7, 0.9]):
        part(seed, {"base": row(acc), "_minutes": {"total": 10.0}})
    part(0, {"lever": row(0.3)}, "_lever")
    text_table.merge("topics", [0, 1, 2])
    for seed, acc in enumerate([0.6, 0.8, 1.0]):
        part(seed, {"new": row(acc), "_minutes": {"total": 5.0}}, "_new")
    text_table.merge("topics", [0, 1, 2])
    joined = json.loads((tmp_path / "text_topics.json").read_text())
    assert joined["seeds_per_row"] == {"base": [0, 1, 2], "lever": [0], "new": [0, 1, 2]}
    assert joined["mean"]["base"]["accuracy"] == pytest.approx(0.7)
    assert joined["mean"]["new"]["accuracy"] == pytest.approx(0.8)
    assert joined["minutes_per_seed"] == {"0": 10.0, "1": 10.0, "2": 10.0}
    md = (tmp_path / "text_topics.md").read_text()
    assert "| lever (seed 0 only) | 0.300 |" in md and "| base | 0.700 ± 0.163 |" in md
    assert not list(tmp_path.glob("text_topics_seed*.json"))  # the parts are merged away


def test_side_by_side_latency_goes_to_every_row_of_the_same_architecture(tmp_path, monkeypatch):
    """cost_quality.py --latency stores one ratio per architecture; a merge gives it to the rows that
    run that model (its Mahalanobis-scored and merge-tuned rows too) and drops the in-run figures."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    results = _load("text_results")
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    row = {"accuracy": 0.9, "auroc/a": 0.8, "fpr95/a": 0.5, "latency_ratio": 9.4}
    names = ["base", "base + Mahalanobis", "hydra", "hydra + Mahalanobis", "hydra, tuned after the merge", "other"]
    per_seed = [{"task": "topics", "seed": 0, "rows": {n: dict(row) for n in names}}]
    latency = {"ratios": {"base": 1.0, "hydra": 2.0}}
    (tmp_path / "text_topics.json").write_text(json.dumps({"per_seed": per_seed, "cpu_latency": latency}))
    results.merge("topics", [0])
    mean = json.loads((tmp_path / "text_topics.json").read_text())["mean"]
    assert [mean[n].get("latency_ratio") for n in names] == [1.0, 1.0, 2.0, 2.0, 2.0, None]
