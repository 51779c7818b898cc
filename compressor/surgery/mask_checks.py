"""What the prune step checks of a pruner's masks before anything uses or writes them."""

from __future__ import annotations

from typing import Any

from compressor.core.errors import MaskError
from compressor.core.masks import HeadMask
from compressor.families import Family


def check_pruner_masks(masks: Any, family: Family, pruner: Any, name: str) -> list[HeadMask]:
    """Raise MaskError naming pruner `name` unless `masks` is a list of `pruner.members` HeadMasks
    that fit the model (no empty block unless allowed; all different when the pruner asks for
    distinct members); return them."""
    where = f"pruner '{name}'"
    if not isinstance(masks, (list, tuple)) or not all(isinstance(m, HeadMask) for m in masks):
        raise MaskError(f"{where}: returned {type(masks).__name__}; expected a list of HeadMask")
    members = getattr(pruner, "members", len(masks))
    if len(masks) != members:
        raise MaskError(f"{where}: returned {len(masks)} masks; the recipe asks for members: {members}")
    allow_empty = bool(getattr(pruner, "allow_empty_blocks", False))
    for i, mask in enumerate(masks):
        mask.validate(
            family.heads_per_block(), allow_empty, where=f"{where}: member {i}", mlp_widths=family.mlp_widths()
        )
    if getattr(pruner, "distinct", False) and len(set(masks)) < len(masks):
        raise MaskError(f"{where}: returned identical members; expected {len(masks)} different masks (distinct: true)")
    return list(masks)
