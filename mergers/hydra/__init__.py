"""The hydra merger: M head-pruned members fused into one grouped-attention model."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from compressor.core.errors import ExportError, OptionError, UnsupportedModelError
from compressor.core.masks import HeadMask
from compressor.core.schema import Field, validate_mapping
from compressor.families import Family
from compressor.plugins import Merger
from mergers.hydra.build import build_hydra, hydra_problems
from mergers.hydra.layers import GroupedLinear, HydraAttention, HydraMLP, SharedMLP
from mergers.hydra.model import MLP_MODES, HydraModel, HydraSpec


class HydraMerger(Merger):
    """Fuse M head-pruned members into one module that runs them all in one forward pass."""

    OPTIONS = {
        "mlp": Field((str,), "average", choices=MLP_MODES, doc="how members' MLPs are fused"),
        "mlp_keep_ratio": Field(
            (int, float, type(None)),
            None,
            check=lambda v: None if v is None or 0 < v <= 1 else "a number in (0, 1]",
            doc="mlp: pruned, masks without units: each member's share of MLP units",
        ),
    }

    def __init__(self, mlp: str = "average", mlp_keep_ratio: float | None = None) -> None:
        options = {"mlp": mlp, "mlp_keep_ratio": mlp_keep_ratio}
        options = validate_mapping("", "", options, self.OPTIONS, error=OptionError)
        if options["mlp_keep_ratio"] is not None and options["mlp"] != "pruned":
            raise OptionError(f"mlp_keep_ratio: only used with mlp: pruned, not '{mlp}'")
        self.mlp = options["mlp"]
        self.mlp_keep_ratio = options["mlp_keep_ratio"]

    def honours_mlp_units(self) -> bool:
        return self.mlp == "pruned"

    def chooses_mlp_units(self) -> bool:
        return self.mlp_keep_ratio is not None

    def shared_trunk(self, model: nn.Module) -> int | None:
        return model.spec.trunk

    def check(self, family: Family) -> None:
        problems = hydra_problems(family)
        if problems:
            raise UnsupportedModelError("hydra merger does not support this model: " + "; ".join(problems))

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> HydraModel:
        return build_hydra(base, masks, members, self.mlp, self.mlp_keep_ratio, calibration)

    @classmethod
    def owns(cls, model: nn.Module) -> bool:
        return isinstance(model, HydraModel)

    @classmethod
    def describe(cls, model: nn.Module) -> dict:
        return {"members": model.members, "mlp_mode": model.spec.mlp_mode, "hydra_spec": model.spec.to_dict()}

    @classmethod
    def rebuild(cls, config: dict) -> nn.Module:
        spec = HydraSpec.from_dict(config.get("hydra_spec"))
        masks = config.get("masks")
        if masks is not None:  # the masks must say what the spec says
            kept = [HeadMask.from_dict(m, where=f"masks[{i}]").num_kept() for i, m in enumerate(masks)]
            if len(kept) != spec.members or any(
                kept[m][b] != spec.heads[b][min(m, spec.streams(b) - 1)]
                for m in range(spec.members)
                for b in range(len(spec.heads))
            ):
                raise ExportError("hydra_spec.heads: do not match the head counts of 'masks'")
        return HydraModel(spec)

    @classmethod
    def verify(cls, model: nn.Module) -> None:
        bad = model.padding_violations()
        if bad:
            raise ExportError(f"weights do not fit hydra_spec (non-zero padding in {', '.join(bad[:3])})")


__all__ = [
    "GroupedLinear",
    "HydraAttention",
    "HydraMLP",
    "HydraMerger",
    "HydraModel",
    "HydraSpec",
    "MLP_MODES",
    "SharedMLP",
    "build_hydra",
]
