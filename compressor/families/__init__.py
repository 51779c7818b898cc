"""The model-family layer: `family_of(model)` gives the `Family` that knows that model's layout.

In-tree families: timm ViT (`timm_vit`), BERT-style encoders (`bert`), transformers ViT
(`hf_vit`), CLIP vision (`clip_vision`, incl. zero-shot CLIP) and CLIP text (`clip_text`).
Another package adds one by entry point (group `compressor.families`) or with
`compressor.core.registry.register("family", name)`.
"""

from __future__ import annotations

import copy

from torch import nn

from compressor.core.errors import UnsupportedModelError
from compressor.core.masks import HeadMask
from compressor.families.base import Family
from compressor.families.bert import Bert
from compressor.families.clip import ClipText, ClipVision
from compressor.families.hf_vit import HFViT
from compressor.families.parts import AttentionSlots, BlockParts, HeadWeights, MlpSlots, Slot
from compressor.families.timm_vit import TimmViT

__all__ = [
    "AttentionSlots",
    "Bert",
    "BlockParts",
    "ClipText",
    "ClipVision",
    "Family",
    "HFViT",
    "HeadWeights",
    "MlpSlots",
    "Slot",
    "TimmViT",
    "family_class",
    "family_of",
    "masked_member",
]


def family_class(name: str) -> type[Family]:
    """The Family registered as `name` (in-tree, by entry point, or in this process)."""
    from compressor.core.registry import resolve

    return resolve("family", name)


def family_of(model: nn.Module) -> Family:
    """The family view of `model`; UnsupportedModelError names the supported families."""
    from compressor.core.registry import names

    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    for name in names("family"):
        cls = family_class(name)
        if cls.matches(model):
            return cls(model)
    raise UnsupportedModelError(
        f"no model family handles {type(model).__name__}; supported: {', '.join(names('family'))}"
    )


def masked_member(base: nn.Module, mask: HeadMask) -> nn.Module:
    """A copy of `base` whose head gates apply `mask` (what a member is before fusing)."""
    member = copy.deepcopy(base)
    family_of(member).apply_mask(mask)
    return member
