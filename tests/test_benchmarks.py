"""The benchmark scripts' row definitions are valid recipes (a typo fails here, not after an hour)."""

import copy
import importlib.util

import pytest

from compressor.recipe import validate_recipe

from .helpers import ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


uq_table = _load("uq_table")


@pytest.mark.parametrize("text", [False, True])
def test_every_uq_table_row_validates_as_a_recipe(text):
    rows = uq_table.text_rows(100) if text else uq_table.digit_rows(100)
    for name, (_, steps) in rows.items():
        raw = copy.deepcopy(uq_table.base_recipe(text))
        raw["steps"] = steps + [{"evaluate": {"baselines": ["base"], "plots": False}}]
        validate_recipe(raw, where=f"uq_table:{name}")


def test_every_named_row_set_names_existing_rows():
    known = set(uq_table.digit_rows(100)) | set(uq_table.text_rows(100))
    for set_name, rows in uq_table.ROW_SETS.items():
        assert set(rows) <= known, (set_name, set(rows) - known)
