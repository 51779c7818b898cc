"""Weights on disk: safetensors only (never pickle), written atomically."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from compressor.core.errors import WeightsError
from compressor.core.io import atomic_path

__all__ = ["WeightsError", "check_fits", "load_weights", "save_weights", "stored_shapes"]


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors of `state` holding NaN or infinity."""
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def save_weights(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Save a state dict as safetensors (contiguous copies; shared tensors duplicated). Weights
    holding NaN or infinity are refused (a diverged training must not reach a cache or an export)."""
    bad = non_finite(state)
    if bad:
        raise WeightsError(f"{path}: refusing to save weights with NaN/inf values ({', '.join(bad[:3])}, ...)")
    tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
    with atomic_path(Path(path)) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def stored_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header, without reading the tensors."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise WeightsError(f"{path}: not a valid safetensors file ({e})") from e


def check_fits(path: str | Path, model: torch.nn.Module, show: int = 5) -> None:
    """One-line WeightsError unless the file's tensors have exactly the model's names and shapes:
    up to `show` offending keys with expected and found shapes, missing and unexpected keys."""
    found = stored_shapes(path)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [
        f"{k} expected {list(expected[k])} found {list(found[k])}"
        for k in expected
        if k in found and found[k] != expected[k]
    ]
    missing, extra = [k for k in expected if k not in found], [k for k in found if k not in expected]
    parts = [
        f"{len(items)} {label}: {'; '.join(items[:show])}{', ...' if len(items) > show else ''}"
        for label, items in (("shapes differ", wrong), ("keys missing", missing), ("unexpected keys", extra))
        if items
    ]
    if parts:
        raise WeightsError(f"{path}: weights do not fit the model ({'; '.join(parts)})")


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (as accelerate's
    init_empty_weights): a model's shapes without its memory, so that sizes read from a file can be
    checked against the weights before anything that large is allocated. Not thread-safe: it swaps
    `nn.Module.register_parameter` while it is open."""
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            kept = module._parameters[name]
            module._parameters[name] = torch.nn.Parameter(kept.to("meta"), requires_grad=kept.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def load_weights(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Load a safetensors file; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise WeightsError(f"{path}: not a valid safetensors file ({e})") from e
