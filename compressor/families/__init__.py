"""The model-family layer: `family_of(model)` gives the `Family` that knows that model's layout.

In-tree families: timm ViT (`timm_vit`), BERT-style encoders (`bert`), transformers ViT
(`hf_vit`), CLIP vision (`clip_vision`, incl. zero-shot CLIP) and CLIP text (`clip_text`).
Another package adds one by entry point (group `compressor.families`) or with
`compressor.registry.register("family", name)`.
"""

from __future__ import annotations

from torch import nn

from compressor.errors import UnsupportedModelError
from compressor.families.base import AttentionSlots, BlockParts, Family, HeadWeights, MlpSlots, Slot
from compressor.families.bert import Bert
from compressor.families.clip import ClipText, ClipVision
from compressor.families.hf_vit import HFViT
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
]


def family_class(name: str) -> type[Family]:
    """The Family registered as `name` (in-tree, by entry point, or in this process)."""
    from compressor.registry import resolve

    return resolve("family", name)


def family_of(model: nn.Module) -> Family:
    """The family view of `model`; UnsupportedModelError names the supported families."""
    from compressor.registry import names

    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    for name in names("family"):
        cls = family_class(name)
        if cls.matches(model):
            return cls(model)
    raise UnsupportedModelError(
        f"no model family handles {type(model).__name__}; supported: {', '.join(names('family'))}"
    )
