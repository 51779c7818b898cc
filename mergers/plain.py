"""The plain merger: one head mask -> a physically smaller model of the same family."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from compressor.core.errors import ExportError, MaskError, OptionError
from compressor.core.masks import HeadMask
from compressor.families import family_class, family_of
from compressor.plugins import Merger
from compressor.surgery.physical import prune_physically


class PlainMerger(Merger):
    """Physically remove pruned heads (and MLP units): a smaller model of the same family, no hooks."""

    def __init__(self, member: int = 0) -> None:
        if isinstance(member, bool) or not isinstance(member, int) or member < 0:
            raise OptionError(f"member: expected an integer >= 0, got {member!r}")
        self.member = member

    def min_members(self) -> int:
        return self.member + 1

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> nn.Module:
        if not 0 <= self.member < len(masks):
            raise MaskError(f"plain merger: member {self.member} requested, {len(masks)} masks given")
        source = members[self.member] if members is not None else base
        return prune_physically(source, masks[self.member])

    @classmethod
    def owns(cls, model: nn.Module) -> bool:
        try:
            family_of(model)
        except NotImplementedError:
            return False
        return True

    @classmethod
    def describe(cls, model: nn.Module) -> dict:
        family = family_of(model)
        return {
            "members": 1,
            "family": family.name,
            "arch": family.describe(),
            "heads": family.heads_per_block(),
            "mlp_hidden": family.mlp_widths(),
            **family.standalone(),
        }

    @classmethod
    def rebuild(cls, config: dict) -> nn.Module:
        fam_cls = family_class(config["family"])
        model = fam_cls.empty(config["arch"])
        family = fam_cls(model)
        heads, widths = config["heads"], config["mlp_hidden"]
        if len(heads) != family.num_blocks or len(widths) != family.num_blocks:
            raise ExportError(f"heads/mlp_hidden: expected {family.num_blocks} blocks, got {len(heads)}/{len(widths)}")
        full_heads, full_widths = family.heads_per_block(), family.mlp_widths()
        for key, values, full in (("heads", heads, full_heads), ("mlp_hidden", widths, full_widths)):
            if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= f for v, f in zip(values, full)):
                raise ExportError(
                    f"{key}: expected per block an integer in 1..{max(full)} (the architecture's), got {values}"
                )
        if config.get("masks") and HeadMask.from_dict(config["masks"][0], where="masks[0]").num_kept() != heads:
            raise ExportError("heads: do not match the head counts of 'masks'")
        for b, (h, w) in enumerate(zip(heads, widths)):
            if h < family.num_heads(b):
                family.prune_heads_(b, list(range(h)))
            if w < family.mlp_widths()[b]:
                family.prune_mlp_units_(b, list(range(w)))
        return model

    @classmethod
    def write_extras(cls, model: nn.Module, folder: Path, masks: Sequence[HeadMask]) -> None:
        if masks:
            family_of(model).save_pretrained(folder, masks[0])
