"""transformers ViT (ViTModel, ViTForImageClassification): `q_proj/k_proj/v_proj/o_proj`,
pre-norm layers (`layernorm_before`/`layernorm_after`), class-token classifier."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from compressor.core.errors import ExportError
from compressor.core.masks import HeadMask
from compressor.core.registry import register
from compressor.families.hf import (
    ImageStem,
    PooledHead,
    TransformersFamily,
    save_full_size,
    with_depth,
)
from compressor.families.parts import AttentionSlots, BlockParts, MlpSlots, Slot


def _classes() -> tuple[type, type]:
    from transformers import ViTForImageClassification, ViTModel

    return ViTModel, ViTForImageClassification


@register("family", "hf_vit")
class HFViT(TransformersFamily):
    """transformers `ViTModel` and `ViTForImageClassification`."""

    name = "hf_vit"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, _classes())

    def vit(self) -> nn.Module:
        return self.model.vit if isinstance(self.model, _classes()[1]) else self.model

    def config(self):
        return self.vit().config

    def blocks(self) -> Sequence[nn.Module]:
        return self.vit().layers

    def attention(self, block: int) -> AttentionSlots:
        attn = self.blocks()[block].attention
        return AttentionSlots(qkv=tuple(Slot(attn, n) for n in ("q_proj", "k_proj", "v_proj")), o=Slot(attn, "o_proj"))

    def head_dim(self, block: int) -> int:
        return int(self.blocks()[block].attention.head_dim)

    def set_head_count(self, block: int, heads: int) -> None:
        self.blocks()[block].attention.num_attention_heads = heads

    def mlp(self, block: int) -> MlpSlots:
        mlp = self.blocks()[block].mlp
        return MlpSlots(fc1=Slot(mlp, "fc1"), act=mlp.activation_fn, fc2=Slot(mlp, "fc2"))

    def block_parts(self, block: int) -> BlockParts:
        layer, config = self.blocks()[block], self.config()
        return BlockParts(
            norm1=layer.layernorm_before,
            norm2=layer.layernorm_after,
            attn_drop=float(config.attention_probs_dropout_prob),
            proj_drop=float(config.hidden_dropout_prob),
            mlp_drop=float(config.hidden_dropout_prob),
        )

    def classifier(self) -> nn.Module:
        return getattr(self.model, "classifier", nn.Identity())

    def input_size(self) -> tuple[int, ...]:
        c = self.config()
        return (int(c.num_channels), int(c.image_size), int(c.image_size))

    def standard_block_problems(self) -> list[str]:
        if not isinstance(self.model, _classes()[1]):
            return [f"{type(self.model).__name__} is not supported; use ViTForImageClassification"]
        return super().standard_block_problems()

    def stem_and_head(self) -> tuple[nn.Module, nn.Module]:
        vit = self.vit()
        tokens = vit.embeddings.patch_embeddings.num_patches + 1
        return ImageStem(vit.embeddings, tokens), PooledHead(self.model.classifier, "first", norm=vit.layernorm)

    def describe(self) -> dict:
        return {"class": type(self.model).__name__, "config": self.model.config.to_dict()}

    @classmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        classes = {c.__name__: c for c in _classes()}
        if arch.get("class") not in classes:
            raise ExportError(f"class: expected one of {', '.join(classes)}, got {arch.get('class')!r}")
        model_cls = classes[arch["class"]]
        return model_cls(model_cls.config_class.from_dict(with_depth(arch["config"], depth))).eval()

    def save_pretrained(self, folder: Path, mask: HeadMask) -> str:
        """Physically smaller when every layer keeps as many heads and MLP units as the others
        (transformers' ViT reads `config.head_dim`, so the config can say so); otherwise the
        full-size copy with removed heads and units as zeros."""
        heads, widths = set(self.heads_per_block()), set(self.mlp_widths())
        if len(heads) == 1 and len(widths) == 1:
            small = copy.deepcopy(self.model)
            small.config.num_attention_heads = heads.pop()
            small.config.head_dim = self.head_dim(0)
            small.config.intermediate_size = widths.pop()
            small.save_pretrained(str(Path(folder) / "hf_model"))
            return "hf_model"
        save_full_size(self, type(self).empty(self.describe()), mask, Path(folder) / "hf_model")
        return "hf_model"
