"""Export a compressed model to a folder, and load it back with one call and no recipe.

A folder holds `model.safetensors` (weights, never pickle), `config.json` (which merger built
the model and its architecture, the masks, class names and library versions) and `masks.json`;
a merger may add more (the plain merger adds a copy transformers loads on its own). The folder
is written under a temporary name and renamed into place, so an interrupted export leaves no
half-written folder. The merger that built a model describes and rebuilds it; an export names
its merger by registered name only (never an import path).
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from compressor.core.errors import ExportError, PluginError, WeightsError
from compressor.core.folders import is_marked, marked_above, write_marker
from compressor.core.io import atomic_dir, file_sha256, json_text
from compressor.core.masks import HeadMask, save_masks
from compressor.core.registry import names, resolve
from compressor.core.schema import Field, validate_mapping
from compressor.core.weights import (
    check_fits,
    empty_parameters,
    load_weights,
    non_finite,
    save_weights,
    stored_shapes,
)
from compressor.deploy.manifest import verify_manifest, write_manifest
from compressor.deploy.preprocessing import check_preprocessing
from compressor.uq.calibrated import Calibrated
from compressor.uq.calibration import TEMPERATURE_SCOPES
from compressor.uq.conformal import CONFORMAL_METHODS
from compressor.uq.features import feature_layers
from compressor.uq.posthoc import Mahalanobis
from compressor.uq.scores import ENSEMBLE_SCORES, FEATURE_SCORES, OOD_SCORES

FORMAT = "compressor.export/2"
FEATURE_SCORE_FILE = "ood_features.safetensors"  # ood score 'mahalanobis': means [M, K, D], precision [M, D, D]
MAX_FEATURE_DIM = 1 << 14


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("compressor", "torch", "timm", "transformers", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def owning_merger(model: nn.Module) -> str:
    """The registered merger whose models `model` is (the hydra merger's fused models first)."""
    for name in names("merger"):
        if resolve("merger", name).owns(model):
            return name
    raise ExportError(f"no registered merger describes a {type(model).__name__}")


def export_model(
    model: nn.Module,
    out_dir: str | Path,
    masks: Sequence[HeadMask] | None = None,
    class_names: Sequence[str] = (),
    onnx_input: torch.Tensor | None = None,
    merger: str | None = None,
    preprocessing: dict | None = None,
) -> Path:
    """Write the export folder for `model` (built by `merger`, found by `owning_merger` if None).

    `preprocessing` (a DataBundle's) says how raw inputs become model inputs: a timm data config
    for images, or a tokenizer (its files are copied into the export) and a max length for text.
    """
    out_dir = Path(out_dir)
    check_export_location(out_dir)
    calibration, feature_score = None, None
    if isinstance(model, Calibrated):  # the weights are the inner model's; the calibration is config
        model, calibration, feature_score = model.model, model.config(), model.feature_score
    name = merger if merger is not None and ":" not in merger else owning_merger(model)
    merger_cls = resolve("merger", name)
    config = {
        "format": FORMAT,
        "kind": name,
        **merger_cls.describe(model),
        "class_names": list(class_names),
        "calibration": calibration,
        "preprocessing": _portable(preprocessing),
        "versions": library_versions(),
        "masks": [m.to_dict() for m in masks] if masks else None,
    }
    with atomic_dir(out_dir) as tmp:
        write_marker(tmp, "export")
        save_weights(model.state_dict(), tmp / "model.safetensors", metadata={"format": FORMAT})
        config["weights_sha256"] = file_sha256(tmp / "model.safetensors")
        (tmp / "config.json").write_text(json_text(config))
        if masks:
            save_masks(tmp / "masks.json", masks)
        if feature_score is not None:  # the Mahalanobis OOD score's class means and precision
            save_weights(feature_score.state_dict(), tmp / FEATURE_SCORE_FILE, metadata={"format": FORMAT})
        merger_cls.write_extras(model, tmp, masks or [])
        _write_processors(tmp, preprocessing)
        if onnx_input is not None:
            from compressor.deploy.onnx_export import export_onnx

            export_onnx(model, onnx_input, tmp / "model.onnx")
        write_manifest(tmp)  # last: every file above, with its sha256
    return out_dir


def check_export_location(out_dir: Path) -> None:
    """An export replaces only an earlier export (marked) or an empty folder, never a user's files,
    and is never written inside another export."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: is a file; expected an export folder (or a path to create)")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_marked(out_dir, "export"):
        raise ExportError(
            f"{out_dir}: holds files but no .compressor-export marker (not an export this version wrote); "
            "an export replaces only an earlier export; choose another folder"
        )
    above = marked_above(out_dir, ("export",))
    if above is not None:
        raise ExportError(f"{out_dir}: inside the export folder {above}; expected a folder of its own")


def _write_processors(folder: Path, preprocessing: dict | None) -> None:
    """The input processing as its library saves it: a text model's tokenizer (in `tokenizer/`,
    and beside any transformers copy), an image processor beside a transformers image model."""
    if not preprocessing:
        return
    hf_dirs = [folder / d for d in ("hf_encoder", "hf_model") if (folder / d).is_dir()]
    if preprocessing.get("kind") == "text":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(preprocessing["tokenizer"])
        for target in [folder / "tokenizer", *hf_dirs]:
            tok.save_pretrained(str(target))
    elif hf_dirs:
        from transformers import ViTImageProcessor

        c, h, w = preprocessing["input_size"]
        resample = {"bilinear": 2, "bicubic": 3, "nearest": 0}.get(preprocessing.get("interpolation"), 2)
        processor = ViTImageProcessor(
            size={"height": h, "width": w},
            image_mean=list(preprocessing["mean"]),
            image_std=list(preprocessing["std"]),
            resample=resample,
        )
        for target in hf_dirs:
            processor.save_pretrained(str(target))


def _portable(preprocessing: dict | None) -> dict | None:
    """The preprocessing as the export records it (a text model's tokenizer: the export's copy)."""
    if not preprocessing:
        return None
    return {**preprocessing, "tokenizer": "tokenizer"} if preprocessing.get("kind") == "text" else dict(preprocessing)


def _positive_list(v: list) -> str | None:
    ok = v and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1e6 for t in v)
    return None if ok else "a list of positive numbers"


def _ood(v: dict) -> str | None:
    t = v.get("threshold")
    finite = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
    ok = not v or (v.get("score") in OOD_SCORES and finite)
    return None if ok else f"a score ({', '.join(OOD_SCORES)}) and a finite threshold"


def _conformal(v: dict) -> str | None:
    def share(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1

    methods_ok = all(share(v.get(m)) for m in CONFORMAL_METHODS) and v.get("method") in CONFORMAL_METHODS
    ok = not v or (share(v.get("coverage")) and 0 < v["coverage"] < 1 and methods_ok)
    return None if ok else f"a coverage in (0, 1), a method ({', '.join(CONFORMAL_METHODS)}) and thresholds in [0, 1]"


CALIBRATION_SCHEMA = {
    "temperature": Field((list,), required=True, check=_positive_list),
    # exports written before the scope was recorded applied their temperatures per member
    "temperature_scope": Field((str,), "member", choices=TEMPERATURE_SCOPES),
    "ood": Field((dict, type(None)), None, check=lambda v: _ood(v or {})),
    "conformal": Field((dict, type(None)), None, check=lambda v: _conformal(v or {})),
}
CONFIG_SCHEMA = {
    "format": Field((str,), required=True),
    "kind": Field((str,), required=True, doc="a registered merger name"),
    "class_names": Field(
        (list,), [], check=lambda v: None if all(isinstance(c, str) for c in v) else "a list of strings"
    ),
    "masks": Field((list, type(None)), None),
    "calibration": Field((dict, type(None)), None),
    "preprocessing": Field((dict, type(None)), None),
    "weights_sha256": Field((str,), required=True, doc="model.safetensors' sha256, as the manifest lists it"),
}


def _check_config(cfg: dict, cfg_path: Path) -> dict:
    """`cfg` checked against CONFIG_SCHEMA (unknown keys kept: each merger reads its own); the
    calibration block normalised (its scope filled in)."""
    cfg = validate_mapping(str(cfg_path), "", cfg, CONFIG_SCHEMA, extra_ok=True, error=ExportError)
    if cfg["calibration"]:
        cal = validate_mapping(str(cfg_path), "calibration", cfg["calibration"], CALIBRATION_SCHEMA, error=ExportError)
        if cal["temperature_scope"] == "ensemble" and len(cal["temperature"]) != 1:
            raise ExportError(f"{cfg_path}: calibration.temperature: expected one temperature for scope 'ensemble'")
        cfg["calibration"] = cal
    cfg["preprocessing"] = check_preprocessing(cfg["preprocessing"], str(cfg_path))
    return cfg


def _read_config(path: Path) -> dict:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ExportError(f"{cfg_path}: missing; expected an export folder written by the export step")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{cfg_path}: not valid JSON ({e})") from e
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        got = cfg.get("format") if isinstance(cfg, dict) else cfg
        raise ExportError(f"{cfg_path}: format: expected '{FORMAT}', got {got!r}")
    return cfg


def load_export(path: str | Path, map_location: str = "cpu") -> Calibrated:
    """Rebuild the exported model (eval mode) from its folder; no recipe, no pickle. It comes back
    wrapped in `Calibrated` with what the export recorded (temperature 1 and no thresholds when no
    calibrate step ran), so every export answers the same way: `EnsembleOutput(member_logits, probs)`."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder")
    cfg_path = path / "config.json"
    optional = ["masks.json", "tokenizer", FEATURE_SCORE_FILE]
    hashes = verify_manifest(path, ["config.json", "model.safetensors"], optional)
    cfg = _check_config(_read_config(path), cfg_path)
    if cfg["weights_sha256"] != hashes["model.safetensors"]:
        raise ExportError(f"{cfg_path}: weights_sha256: differs from manifest.json's sha256 of model.safetensors")
    if cfg.get("masks") is not None and (path / "masks.json").is_file():
        from compressor.core.masks import load_masks

        listed = [HeadMask.from_dict(m, where=f"{cfg_path}: masks[{i}]") for i, m in enumerate(cfg["masks"])]
        if load_masks(path / "masks.json") != listed:
            raise ExportError(f"{path / 'masks.json'}: differs from the masks config.json records")
    kind = cfg.get("kind")
    if not isinstance(kind, str) or ":" in kind:
        raise ExportError(f"{cfg_path}: kind: expected a registered merger name, got {kind!r}")
    try:
        merger = resolve("merger", kind)
        with empty_parameters():  # shapes first: nothing the config sizes is allocated before it fits
            skeleton = merger.rebuild(cfg)
    except PluginError as e:
        raise ExportError(f"{cfg_path}: kind: {e}") from e
    except ExportError as e:
        raise ExportError(f"{cfg_path}: {e}") from e
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ExportError(f"{cfg_path}: does not describe a {kind} model ({type(e).__name__}: {e})") from e
    check_fits(path / "model.safetensors", skeleton)
    model = merger.rebuild(cfg)
    state = load_weights(path / "model.safetensors", device=map_location)
    if bad := non_finite(state):
        raise WeightsError(f"{path / 'model.safetensors'}: {bad[0]}: NaN or inf weights; expected finite values")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise WeightsError(f"{path / 'model.safetensors'}: weights do not fit config.json ({e})") from e
    try:
        merger.verify(model)
    except ExportError as e:
        raise ExportError(f"{path / 'model.safetensors'}: {e}") from e
    calibration = cfg.get("calibration") or {}
    preprocessing = _preprocessing_in(cfg.get("preprocessing"), path)
    ood = calibration.get("ood") or {}
    wrapped = Calibrated(
        model,
        torch.tensor(calibration.get("temperature", [1.0])),
        ood,
        calibration.get("temperature_scope", "ensemble"),
        calibration.get("conformal"),
        class_names=cfg.get("class_names") or [],
        preprocessing=preprocessing,
        feature_score=_feature_score(path, model, cfg) if ood.get("score") in FEATURE_SCORES else None,
    )
    temperatures = len(calibration.get("temperature", [1.0]))
    if calibration.get("temperature_scope") == "member" and temperatures not in (1, wrapped.members):
        raise ExportError(
            f"{cfg_path}: calibration.temperature: {temperatures} values for {wrapped.members} members; expected 1 or "
            f"{wrapped.members}"
        )
    if wrapped.ood.get("score") in ENSEMBLE_SCORES and wrapped.members < 2:
        raise ExportError(f"{cfg_path}: calibration.ood.score: '{wrapped.ood['score']}' needs an ensemble; one member")
    if preprocessing and hasattr(model, "pretrained_cfg"):  # a plain timm model: where timm reads it
        model.pretrained_cfg = {**(model.pretrained_cfg or {}), **wrapped.pretrained_cfg}
    return wrapped.to(map_location).eval()


def _feature_score(path: Path, model: nn.Module, cfg: dict) -> Mahalanobis:
    """The export's Mahalanobis score, its shapes checked against the model before it is built."""
    file = path / FEATURE_SCORE_FILE
    if not file.is_file():
        raise ExportError(f"{file}: missing; calibration.ood.score 'mahalanobis' needs it")
    members = int(getattr(model, "members", 1))
    layers = feature_layers(model)
    dim = getattr(layers[0], "in_features", None)
    classes = len(cfg.get("class_names") or []) or getattr(layers[0], "out_features", None) or MAX_FEATURE_DIM
    shapes = stored_shapes(file)
    m, k, d = shapes["means"] if len(shapes.get("means", ())) == 3 else (0, 0, 0)
    fits = (
        set(shapes) == {"means", "precision"}
        and m == members
        and 1 <= k <= classes
        and 1 <= d <= MAX_FEATURE_DIM
        and (dim is None or d == dim)
        and shapes["precision"] == (m, d, d)
    )
    if not fits:
        raise ExportError(
            f"{file}: tensors {shapes}; expected means [{members}, K <= {classes}, {dim or 'D'}] and precision "
            f"[{members}, {dim or 'D'}, {dim or 'D'}]"
        )
    tensors = load_weights(file)
    if bad := non_finite(tensors):
        raise WeightsError(f"{file}: {bad[0]}: NaN or inf values; expected finite values")
    return Mahalanobis(tensors["means"], tensors["precision"])


def _preprocessing_in(preprocessing: dict | None, path: Path) -> dict:
    """The recorded preprocessing, with a text model's tokenizer at its place in the export."""
    if not preprocessing:
        return {}
    if preprocessing.get("kind") == "text":
        return {**preprocessing, "tokenizer": str(path / str(preprocessing.get("tokenizer", "tokenizer")))}
    return dict(preprocessing)
