"""Recipes: YAML files that describe a whole compression run, validated before any work starts.

Every error names the file, the key path and what was expected, e.g.
    recipes/vit_hydra.yaml: steps[0].prune.keep_ratio: expected a number in [0, 1], got 'half'
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from compressor.registry import PluginError, resolve


class RecipeError(ValueError):
    """A recipe that cannot run: names the file and key path."""


@dataclass
class Field:
    """One recipe key: its type(s), default, allowed values and a one-line description."""

    types: tuple[type, ...]
    default: Any = None
    required: bool = False
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None
    doc: str = ""
    schema: dict[str, Field] | None = None  # nested mapping


def _positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "a number > 0"


def _ratio(v: Any) -> str | None:
    vals = v if isinstance(v, list) else [v]
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in vals)
    return None if ok else "a number in [0, 1] (or a list of them, one per member)"


NUM = (int, float)
TRAIN_FIELDS: dict[str, Field] = {
    "steps": Field((int,), 200, check=_positive, doc="optimizer steps"),
    "batch_size": Field((int,), 128, check=_positive),
    "lr": Field(NUM, 1e-3, check=_positive),
    "weight_decay": Field(NUM, 0.05),
    "warmup_steps": Field((int,), 10),
    "label_smoothing": Field(NUM, 0.0),
    "eval_every": Field((int,), 25, check=_positive),
    "patience": Field((int, type(None)), None, doc="evaluations without val-NLL improvement before stopping"),
}

MODEL_SCHEMA: dict[str, Field] = {
    "source": Field((str,), "timm", choices=("timm", "checkpoint", "hf"), doc="where the base model comes from"),
    "name": Field(
        (str,), required=True, doc="timm model name (vit_tiny_patch16_224), or for hf a folder, hub name or 'minilm'"
    ),
    "pretrained": Field((bool,), False, doc="load timm's pretrained weights (needs network)"),
    "checkpoint": Field((str, type(None)), None, doc="local .safetensors weights for this architecture"),
    "kwargs": Field((dict,), {}, doc="extra timm.create_model arguments (img_size, depth, num_heads, ...)"),
    "train_base": Field(
        (dict, type(None)),
        None,
        schema={
            **TRAIN_FIELDS,
            "cache": Field((bool,), True),
            "trainable": Field((str,), "all", choices=("all", "head"), doc="head: train the classifier only"),
        },
        doc="train the base model on the data's train split first",
    ),
}

DATA_SCHEMA: dict[str, Field] = {
    "source": Field((str,), "digits", choices=("digits", "image_folder", "text")),
    "max_length": Field((int,), 48, check=_positive, doc="text: tokens per sentence"),
    "root": Field((str, type(None)), None, doc="image_folder: folder with train/<class>/ and val/<class>/"),
    "ood_roots": Field((list,), [], doc="image_folder: folders of OOD images"),
    "img_size": Field((int,), 16, check=_positive, doc="digits: upsampled image size"),
    "seed": Field((int,), 0, doc="data split seed"),
    "batch_size": Field((int,), 256, check=_positive, doc="evaluation/calibration batch size"),
    "calibration_samples": Field((int,), 512, check=_positive, doc="train samples used to score heads"),
}

PRUNE_SCHEMA: dict[str, Field] = {
    "pruner": Field((str,), required=True, doc="registered name or 'package.module:Class'"),
}
FINETUNE_SCHEMA: dict[str, Field] = {
    "target": Field(
        (str,),
        "auto",
        choices=("auto", "members", "merged"),
        doc="members: each masked member before merging; merged: the fused model",
    ),
    **TRAIN_FIELDS,
    "steps": Field((int,), 100, check=lambda v: None if 0 < v <= 2000 else "an integer in 1..2000"),
    "lr": Field(NUM, 5e-4, check=_positive),
}
MERGE_SCHEMA: dict[str, Field] = {
    "merger": Field((str,), required=True, doc="registered name or 'package.module:Class'"),
}
EVALUATE_SCHEMA: dict[str, Field] = {
    "baselines": Field((list,), ["base"], doc="also evaluate these: base, members, deep_ensemble, mc_dropout"),
    "deep_ensemble_size": Field((int, type(None)), None, doc="models in the deep_ensemble baseline (default M)"),
    "plots": Field((bool,), True),
}
EXPORT_SCHEMA: dict[str, Field] = {
    "dir": Field((str,), "export", doc="folder under the run folder"),
    "onnx": Field((bool,), False, doc="also write model.onnx (needs onnx and onnxruntime)"),
}
DISTRIBUTED_SCHEMA: dict[str, Field] = {
    "backend": Field(
        (str,),
        "auto",
        choices=("auto", "gloo", "nccl"),
        doc="auto: NCCL when GPUs are visible, gloo on the CPU; used only under torchrun",
    ),
    "timeout_s": Field((int,), 1800, check=_positive, doc="collective-operation timeout"),
}
STEP_SCHEMAS = {
    "prune": PRUNE_SCHEMA,
    "finetune": FINETUNE_SCHEMA,
    "merge": MERGE_SCHEMA,
    "evaluate": EVALUATE_SCHEMA,
    "export": EXPORT_SCHEMA,
}
PLUGIN_STEPS = {"prune": ("pruner", "pruner"), "merge": ("merger", "merger")}

RECIPE_SCHEMA: dict[str, Field] = {
    "name": Field((str,), "run"),
    "seed": Field((int,), 0),
    "out": Field((str, type(None)), None, doc="run folder (default runs/<name>)"),
    "model": Field((dict,), required=True, schema=MODEL_SCHEMA),
    "data": Field((dict,), {}, schema=DATA_SCHEMA),
    "steps": Field((list,), required=True),
    "distributed": Field((dict,), {}, schema=DISTRIBUTED_SCHEMA, doc="torchrun settings"),
}


@dataclass
class Recipe:
    """A validated recipe: plain dicts with defaults filled in."""

    path: str
    name: str
    seed: int
    out: str | None
    model: dict
    data: dict
    steps: list[tuple[str, dict]] = field(default_factory=list)
    distributed: dict = field(default_factory=dict)


def _type_name(types: tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true/false",
        dict: "a mapping",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_value(where: str, key_path: str, value: Any, f: Field) -> Any:
    types = f.types
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise RecipeError(f"{where}: {key_path}: expected {_type_name(types)}, got {value!r}")
    if f.choices is not None and value not in f.choices:
        raise RecipeError(f"{where}: {key_path}: expected one of {', '.join(map(str, f.choices))}, got {value!r}")
    if f.check is not None:
        err = f.check(value)
        if err:
            raise RecipeError(f"{where}: {key_path}: expected {err}, got {value!r}")
    if f.schema is not None and isinstance(value, dict):
        return validate_mapping(where, key_path, value, f.schema)
    return copy.deepcopy(value)


def validate_mapping(where: str, prefix: str, data: Any, schema: dict[str, Field], extra_ok: bool = False) -> dict:
    """Check keys and types of `data` against `schema`; fill defaults."""
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: {prefix or 'top level'}: expected a mapping, got {data!r}")
    dot = f"{prefix}." if prefix else ""
    out: dict = {}
    for key in data:
        if key not in schema and not extra_ok:
            raise RecipeError(f"{where}: {dot}{key}: unknown key; expected one of {', '.join(schema)}")
    for key, f in schema.items():
        if key in data:
            out[key] = _check_value(where, dot + key, data[key], f)
        elif f.required:
            raise RecipeError(f"{where}: {dot}{key}: missing; expected {_type_name(f.types)} ({f.doc})")
        else:
            default = copy.deepcopy(f.default)
            out[key] = (
                validate_mapping(where, dot + key, default, f.schema)
                if f.schema and isinstance(default, dict)
                else default
            )
    for key in data:
        if key not in schema:
            out[key] = copy.deepcopy(data[key])
    return out


def plugin_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Keyword parameters a plugin's constructor accepts (following **kwargs up the MRO)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        sig = inspect.signature(init)
        more = False
        for name, p in list(sig.parameters.items())[1:]:
            if p.kind == p.VAR_KEYWORD:
                more = True
            elif p.kind != p.VAR_POSITIONAL:
                params.setdefault(name, p)
        if not more:
            break
    return params


def _check_plugin_options(where: str, key_path: str, kind: str, cls: type, options: dict) -> None:
    params = plugin_parameters(cls)
    for key in options:
        if key not in params:
            raise RecipeError(
                f"{where}: {key_path}.{key}: unknown option for {kind} '{getattr(cls, 'plugin_name', cls.__name__)}'; "
                f"expected one of {', '.join(params) or '(none)'}"
            )
    try:
        cls(**options)  # constructors validate values cheaply, before any work
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: {key_path}: {e}") from e


def validate_recipe(raw: Any, where: str = "<recipe>") -> Recipe:
    """Validate a loaded recipe dict (every key, step and plugin option); return a Recipe."""
    top = validate_mapping(where, "", raw, RECIPE_SCHEMA)
    steps: list[tuple[str, dict]] = []
    for i, step in enumerate(top["steps"]):
        key_path = f"steps[{i}]"
        if not (isinstance(step, dict) and len(step) == 1):
            raise RecipeError(
                f"{where}: {key_path}: expected a mapping with one step name ({', '.join(STEP_SCHEMAS)}), got {step!r}"
            )
        ((kind, body),) = step.items()
        if kind not in STEP_SCHEMAS:
            raise RecipeError(f"{where}: {key_path}: unknown step '{kind}'; expected one of {', '.join(STEP_SCHEMAS)}")
        body = {} if body is None else body
        extra_ok = kind in PLUGIN_STEPS
        cfg = validate_mapping(where, f"{key_path}.{kind}", body, STEP_SCHEMAS[kind], extra_ok=extra_ok)
        if kind in PLUGIN_STEPS:
            name_key, plugin_kind = PLUGIN_STEPS[kind]
            try:
                cls = resolve(plugin_kind, cfg[name_key])
            except PluginError as e:
                raise RecipeError(f"{where}: {key_path}.{kind}.{name_key}: {e}") from e
            options = {k: v for k, v in cfg.items() if k != name_key}
            _check_plugin_options(where, f"{key_path}.{kind}", plugin_kind, cls, options)
        steps.append((kind, cfg))
    kinds = [k for k, _ in steps]
    if "merge" in kinds and "prune" not in kinds[: kinds.index("merge")]:
        raise RecipeError(f"{where}: steps: 'merge' needs a 'prune' step before it")
    m = top["model"]
    if m["source"] == "checkpoint" and not m["checkpoint"]:
        raise RecipeError(f"{where}: model.checkpoint: missing; expected a .safetensors path for source: checkpoint")
    if m["checkpoint"] and not Path(m["checkpoint"]).is_file():
        raise RecipeError(f"{where}: model.checkpoint: no such file '{m['checkpoint']}'")
    if m["source"] in ("timm", "checkpoint"):
        import timm

        if not timm.is_model(m["name"]):
            close = timm.list_models(f"*{m['name'].split('_')[0]}*")[:6]
            hint = f"; similar: {', '.join(close)}" if close else ""
            raise RecipeError(f"{where}: model.name: unknown timm model '{m['name']}'{hint}")
    d = top["data"]
    if (m["source"] == "hf") != (d["source"] == "text"):
        raise RecipeError(
            f"{where}: data.source: model.source 'hf' goes with data.source 'text' (and only it); "
            f"got model.source '{m['source']}' with data.source '{d['source']}'"
        )
    if d["source"] == "image_folder":
        if not d["root"]:
            raise RecipeError(f"{where}: data.root: missing; expected a folder for source: image_folder")
        for sub in ("train", "val"):
            if not (Path(d["root"]) / sub).is_dir():
                raise RecipeError(f"{where}: data.root: expected a folder '{sub}/' inside '{d['root']}'")
    for i, r in enumerate(d["ood_roots"]):
        if not Path(r).is_dir():
            raise RecipeError(f"{where}: data.ood_roots[{i}]: no such folder '{r}'")
    return Recipe(where, top["name"], top["seed"], top["out"], m, d, steps, top["distributed"])


def apply_overrides(raw: dict, overrides: list[str], where: str) -> dict:
    """Apply `--set key.path=value` overrides (value parsed as YAML; list items by index)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"{where}: --set {item!r}: expected key.path=value")
        path, _, text = item.partition("=")
        value = yaml.safe_load(text)
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


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read (yaml.safe_load), apply overrides, validate. Raises RecipeError naming the file."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError as e:
        raise RecipeError(f"{where}: no such recipe file") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"{where}: not valid YAML: {e}") from e
    if overrides:
        raw = apply_overrides(raw if isinstance(raw, dict) else {}, overrides, where)
    return validate_recipe(raw, where)
