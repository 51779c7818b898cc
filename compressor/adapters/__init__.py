"""Model adapters: `get_adapter(model)` picks the one for the model's family."""

from __future__ import annotations

from torch import nn

from compressor.adapters.base import HeadWeights, ModelAdapter
from compressor.adapters.hf import HFEncoderAdapter
from compressor.adapters.timm_vit import TimmViTAdapter

ADAPTERS: list[type[ModelAdapter]] = [TimmViTAdapter, HFEncoderAdapter]


def get_adapter(model: nn.Module) -> ModelAdapter:
    """Return the adapter for `model`, or raise TypeError naming the supported families."""
    for cls in ADAPTERS:
        if cls.matches(model):
            return cls(model)
    names = ", ".join(c.family for c in ADAPTERS)
    raise TypeError(f"no adapter for {type(model).__name__}; supported families: {names}")


__all__ = ["ADAPTERS", "HFEncoderAdapter", "HeadWeights", "ModelAdapter", "TimmViTAdapter", "get_adapter"]
