"""Recipe text: strict safe YAML (no duplicate keys), `--set key.path=value` overrides, and input paths
read relative to the recipe file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from compressor.core.errors import RecipeError


def apply_overrides(raw: dict, overrides: list[str], where: str) -> dict:
    """Apply `--set key.path=value` overrides (value parsed as YAML; list items by index)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"{where}: --set {item!r}: expected key.path=value")
        path, _, text = item.partition("=")
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as e:
            raise RecipeError(
                f"{where}: --set {item!r}: the value is not valid YAML ({' '.join(str(e).split())})"
            ) from e
        keys = path.split(".")
        node: Any = raw
        for j, k in enumerate(keys[:-1]):
            node = _child(node, k, where, ".".join(keys[: j + 1]), create=True)
        last = keys[-1]
        if isinstance(node, list):
            node[_index(last, node, where, path)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise RecipeError(f"{where}: --set {path}: '{'.'.join(keys[:-1])}' is not a mapping or list")
    return raw


def _index(k: str, node: list, where: str, path: str) -> int:
    try:
        i = int(k)
        node[i]
        return i
    except (ValueError, IndexError) as e:
        raise RecipeError(f"{where}: --set {path}: expected an index 0..{len(node) - 1}, got {k!r}") from e


def _child(node: Any, k: str, where: str, path: str, create: bool) -> Any:
    if isinstance(node, list):
        return node[_index(k, node, where, path)]
    if isinstance(node, dict):
        if k not in node or node[k] is None:
            if not create:
                raise RecipeError(f"{where}: --set {path}: no such key")
            node[k] = {}
        return node[k]
    raise RecipeError(f"{where}: --set {path}: not a mapping or list")


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """YAML with safe types only and no duplicate keys."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


INPUT_PATHS = {"model": ("checkpoint",), "data": ("root", "ood_val_file", "ood_roots", "ood_val_roots")}
STEP_INPUT_PATHS = {"prune": ("path",)}  # the file pruner's masks


def resolve_input_paths(raw: dict, folder: Path) -> dict:
    """The recipe's relative input paths (checkpoint, data folders and files, a masks file) made
    relative to `folder`, the recipe file's own; outputs (out, cache_dir, export.dir) stay relative
    to the current directory, and so do `--set` values (applied after this)."""

    def resolved(value: object) -> object:
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            return str(folder / value)
        if isinstance(value, list):
            return [resolved(v) for v in value]
        return value

    def fix(block: object, keys: tuple[str, ...]) -> None:
        if isinstance(block, dict):
            for key in keys:
                if key in block:
                    block[key] = resolved(block[key])

    for section, keys in INPUT_PATHS.items():
        fix(raw.get(section), keys)
    for step in raw.get("steps") or []:
        if isinstance(step, dict) and len(step) == 1:
            name, cfg = next(iter(step.items()))
            fix(cfg, STEP_INPUT_PATHS.get(name, ()))
    return raw
