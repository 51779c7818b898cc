"""Export a compressed model to a folder, and load it back with one call and no recipe.

A folder holds `model.safetensors` (weights, never pickle), `config.json` (architecture, members,
masks, MLP mode, class names, library versions) and `masks.json`. The folder is written under a
temporary name and renamed into place, so an interrupted export leaves no half-written folder.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from compressor.clip import ZeroShotCLIP
from compressor.io import atomic_dir
from compressor.masks import HeadMask, save_masks
from compressor.weights import WeightsError, load_weights, save_weights

FORMAT = "compressor.export/1"


class ExportError(ValueError):
    """An export folder that cannot be loaded."""


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("compressor", "torch", "timm", "transformers", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def describe(model: nn.Module, base_info: dict) -> dict:
    """The architecture part of config.json for a merged model."""
    from mergers.hydra.hf import HydraHF
    from mergers.hydra.model import HydraViT

    if isinstance(model, (HydraViT, HydraHF)):
        return {
            "kind": "hydra",
            "family": "timm_vit" if isinstance(model, HydraViT) else f"hf_{model.spec.family}",
            "hydra_spec": model.spec.to_dict(),
            "members": model.members,
            "mlp_mode": model.spec.mlp_mode,
        }
    from compressor.adapters import get_adapter

    adapter = get_adapter(model)
    info = {"kind": "plain", "family": adapter.family, "members": 1, "heads": adapter.heads_per_block()}
    if _is_transformers_model(model):  # e.g. CLIPForImageClassification used as it is: rebuilt from its config
        info["hf_class"] = type(model).__name__
        info["hf_config"] = model.config.to_dict()
    elif isinstance(model, tuple(WRAPPERS.values())):  # e.g. ZeroShotCLIP: rebuilt by its own `empty`
        info["wrapper"] = type(model).__name__
        info["wrapper_config"] = model.export_config()
    return info


# this project's wrappers around a transformers model that an export can name (never an import path)
WRAPPERS = {"ZeroShotCLIP": ZeroShotCLIP}


def _is_transformers_model(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PreTrainedModel)


def export_model(
    model: nn.Module,
    out_dir: str | Path,
    base_info: dict,
    masks: Sequence[HeadMask] | None = None,
    class_names: Sequence[str] = (),
    onnx_input: torch.Tensor | None = None,
) -> Path:
    """Write the export folder for `model`; `base_info` says how to rebuild the base architecture."""
    out_dir = Path(out_dir)
    config = {
        "format": FORMAT,
        **describe(model, base_info),
        "base": base_info,
        "class_names": list(class_names),
        "versions": library_versions(),
        "masks": [m.to_dict() for m in masks] if masks else None,
    }
    with atomic_dir(out_dir) as tmp:
        save_weights(model.state_dict(), tmp / "model.safetensors", metadata={"format": FORMAT})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if masks:
            save_masks(tmp / "masks.json", masks)
        if config["kind"] == "plain" and config["family"] == "hf_encoder" and masks:
            save_hf_pretrained(model, masks[0], tmp / ("hf_model" if "hf_class" in config else "hf_encoder"))
        if onnx_input is not None:
            from compressor.onnx_export import export_onnx

            export_onnx(model, onnx_input, tmp / "model.onnx")
    return out_dir


def _read_config(path: Path) -> dict:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ExportError(f"{cfg_path}: missing; expected an export folder written by the export step")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ExportError(f"{cfg_path}: not valid JSON ({e})") from e
    if cfg.get("format") != FORMAT:
        raise ExportError(f"{cfg_path}: format: expected '{FORMAT}', got {cfg.get('format')!r}")
    return cfg


def build_plain_timm(base: dict, heads: Sequence[int]) -> nn.Module:
    """An empty timm model of the exported architecture with `heads[b]` heads in block b."""
    import timm

    from compressor.adapters import get_adapter

    model = timm.create_model(base["name"], pretrained=False, **base["kwargs"])
    adapter = get_adapter(model)
    for b, h in enumerate(heads):
        if h < adapter.num_heads(b):
            adapter.prune_heads_(b, list(range(h)))
    return model


def save_hf_pretrained(model: nn.Module, mask: HeadMask, folder: Path) -> None:
    """`save_pretrained` of the pruned transformers model (the encoder of a MeanPoolClassifier, or
    the model itself), so transformers' `from_pretrained` loads it without this project.

    transformers 5 cannot describe a different head count per layer (no `pruned_heads`), so the
    removed heads are written as zero weights at their original places: outputs equal the pruned
    model's; the physically smaller weights are the export's model.safetensors.
    """
    from compressor.adapters import get_adapter

    small = model if _is_transformers_model(model) else model.encoder
    full = type(small)(small.config).eval()
    ad_full, ad_small = get_adapter(full), get_adapter(small)
    with torch.no_grad():
        small_params = dict(small.named_parameters())
        for name, p in full.named_parameters():
            if small_params[name].shape == p.shape:
                p.copy_(small_params[name])
        for b in range(ad_full.num_blocks):
            hd = ad_full.head_dim(b)
            keep = torch.as_tensor(mask.kept_indices(b), dtype=torch.long)
            cols = (keep[:, None] * hd + torch.arange(hd)[None]).flatten()
            wf, ws = ad_full.head_weights(b), ad_small.head_weights(b)
            for name in ("q", "k", "v"):
                tf, ts = getattr(wf, name), getattr(ws, name)  # [H, hd, D] views of the weights
                tf.zero_()
                tf.view(-1, tf.shape[-1])[cols] = ts.reshape(-1, ts.shape[-1])
                bf, bs = getattr(wf, name + "_bias"), getattr(ws, name + "_bias")
                if bf is not None:
                    bf.zero_()
                    bf.view(-1)[cols] = bs.reshape(-1)
            wf.o.zero_()
            wf.o.view(wf.o.shape[0], -1)[:, cols] = ws.o.reshape(ws.o.shape[0], -1)
    full.save_pretrained(str(folder))


def build_plain_hf(cfg: dict) -> nn.Module:
    """An empty transformers model of the exported architecture with `heads[b]` heads in block b:
    the recorded wrapper (ZeroShotCLIP) or transformers class, or a MeanPoolClassifier over the
    recorded encoder."""
    import transformers

    from compressor.adapters import get_adapter
    from compressor.text import MeanPoolClassifier

    base, heads = cfg["base"], cfg["heads"]
    if "wrapper" in cfg:
        if cfg["wrapper"] not in WRAPPERS:
            raise ExportError(f"wrapper: expected one of {', '.join(WRAPPERS)}, got {cfg['wrapper']!r}")
        model = WRAPPERS[cfg["wrapper"]].empty(**cfg["wrapper_config"])
    elif "hf_class" in cfg:
        cls = getattr(transformers, str(cfg["hf_class"]), None)
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise ExportError(f"hf_class: expected a transformers model class, got {cfg['hf_class']!r}")
        model = cls(cls.config_class.from_dict(cfg["hf_config"]))
    else:
        config = transformers.AutoConfig.for_model(**base["encoder_config"])
        encoder = transformers.AutoModel.from_config(config)
        model = MeanPoolClassifier(encoder, base["num_classes"], base["pad_token_id"])
    adapter = get_adapter(model)
    for b, h in enumerate(heads):
        if h < adapter.num_heads(b):
            adapter.prune_heads_(b, list(range(h)))
    return model


def load_export(path: str | Path, map_location: str = "cpu") -> nn.Module:
    """Rebuild the exported model (eval mode) from its folder; no recipe, no pickle."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder")
    cfg = _read_config(path)
    kind, family = cfg.get("kind"), cfg.get("family")
    if (kind, family) == ("hydra", "timm_vit"):
        from mergers.hydra.model import HydraSpec, HydraViT

        model = HydraViT(HydraSpec.from_dict(cfg["hydra_spec"]))
    elif kind == "hydra" and str(family).startswith("hf_"):
        from mergers.hydra.hf import FAMILIES, HydraHF, HydraHFSpec

        if family[3:] not in FAMILIES:
            raise ExportError(f"{path / 'config.json'}: family: unsupported '{family}'")

        model = HydraHF(HydraHFSpec.from_dict(cfg["hydra_spec"]))
    elif (kind, family) == ("plain", "timm_vit"):
        model = build_plain_timm(cfg["base"], cfg["heads"])
    elif (kind, family) == ("plain", "hf_encoder"):
        model = build_plain_hf(cfg)
    else:
        raise ExportError(f"{path / 'config.json'}: kind/family: unsupported '{cfg['kind']}'/'{cfg.get('family')}'")
    state = load_weights(path / "model.safetensors", device=map_location)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise WeightsError(f"{path / 'model.safetensors'}: weights do not fit config.json ({e})") from e
    model.class_names = cfg.get("class_names") or []
    return model.to(map_location).eval()
