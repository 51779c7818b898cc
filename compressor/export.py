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
import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from compressor.calibration import Calibrated
from compressor.errors import ExportError, PluginError, WeightsError
from compressor.io import atomic_dir
from compressor.masks import HeadMask, save_masks
from compressor.registry import names, resolve
from compressor.weights import load_weights, save_weights

FORMAT = "compressor.export/2"


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
    calibration = None
    if isinstance(model, Calibrated):  # the weights are the inner model's; the calibration is config
        model, calibration = model.model, model.config()
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
        save_weights(model.state_dict(), tmp / "model.safetensors", metadata={"format": FORMAT})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if masks:
            save_masks(tmp / "masks.json", masks)
        merger_cls.write_extras(model, tmp, masks or [])
        if preprocessing and preprocessing.get("kind") == "text":
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(preprocessing["tokenizer"]).save_pretrained(str(tmp / "tokenizer"))
        if onnx_input is not None:
            from compressor.onnx_export import export_onnx

            export_onnx(model, onnx_input, tmp / "model.onnx")
    return out_dir


def _portable(preprocessing: dict | None) -> dict | None:
    """The preprocessing as the export records it (a text model's tokenizer: the export's copy)."""
    if not preprocessing:
        return None
    return {**preprocessing, "tokenizer": "tokenizer"} if preprocessing.get("kind") == "text" else dict(preprocessing)


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


def load_export(path: str | Path, map_location: str = "cpu") -> nn.Module:
    """Rebuild the exported model (eval mode) from its folder; no recipe, no pickle."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder")
    cfg = _read_config(path)
    cfg_path = path / "config.json"
    kind = cfg.get("kind")
    if not isinstance(kind, str) or ":" in kind:
        raise ExportError(f"{cfg_path}: kind: expected a registered merger name, got {kind!r}")
    try:
        model = resolve("merger", kind).rebuild(cfg)
    except PluginError as e:
        raise ExportError(f"{cfg_path}: kind: {e}") from e
    except ExportError as e:
        raise ExportError(f"{cfg_path}: {e}") from e
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ExportError(f"{cfg_path}: does not describe a {kind} model ({type(e).__name__}: {e})") from e
    state = load_weights(path / "model.safetensors", device=map_location)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise WeightsError(f"{path / 'model.safetensors'}: weights do not fit config.json ({e})") from e
    calibration = cfg.get("calibration")
    if calibration:
        model = Calibrated(model, torch.tensor(calibration["temperature"]), calibration.get("ood"))
    model.class_names = cfg.get("class_names") or []
    model.preprocessing = _attach_preprocessing(model, cfg.get("preprocessing"), path)
    return model.to(map_location).eval()


def _attach_preprocessing(model: nn.Module, preprocessing: dict | None, path: Path) -> dict:
    """The recorded preprocessing, with a text model's tokenizer at its place in the export; an
    image model's settings also go into `pretrained_cfg`, where timm.data.resolve_data_config
    reads them."""
    if not preprocessing:
        return {}
    if preprocessing.get("kind") == "text":
        return {**preprocessing, "tokenizer": str(path / str(preprocessing.get("tokenizer", "tokenizer")))}
    target = model.model if isinstance(model, Calibrated) else model
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in preprocessing.items() if k != "kind"}
    for m in {id(model): model, id(target): target}.values():
        m.pretrained_cfg = {**(getattr(m, "pretrained_cfg", None) or {}), **settings}
    return dict(preprocessing)
