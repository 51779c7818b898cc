"""The hydra merger: M head-pruned members fused into one grouped-attention model."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from compressor.masks import HeadMask
from compressor.registry import register_merger
from mergers.base import Merger
from mergers.hydra.build import MLP_MODES, build_hydra_vit, mlp_unit_scores
from mergers.hydra.layers import GroupedLinear, HydraAttention, HydraMLP, SharedMLP
from mergers.hydra.model import HydraOutput, HydraSpec, HydraViT


@register_merger("hydra")
class HydraMerger(Merger):
    """Fuse M head-pruned members into one module that runs them all in one forward pass."""

    def __init__(self, mlp: str = "average", mlp_keep_ratio: float | None = None) -> None:
        if mlp not in MLP_MODES:
            raise ValueError(f"mlp: expected one of {', '.join(MLP_MODES)}, got '{mlp}'")
        self.mlp = mlp
        self.mlp_keep_ratio = mlp_keep_ratio

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> nn.Module:
        from compressor.adapters import TimmViTAdapter
        from mergers.hydra.hf import build_hydra_hf

        if TimmViTAdapter.matches(base):
            return build_hydra_vit(base, masks, members, self.mlp, self.mlp_keep_ratio, calibration)
        return build_hydra_hf(base, masks, members, self.mlp, self.mlp_keep_ratio)


__all__ = [
    "GroupedLinear",
    "HydraAttention",
    "HydraMLP",
    "HydraMerger",
    "HydraOutput",
    "HydraSpec",
    "HydraViT",
    "MLP_MODES",
    "SharedMLP",
    "build_hydra_vit",
    "mlp_unit_scores",
]
