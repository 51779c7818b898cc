"""transformers CLIP towers: `self_attn.q_proj/k_proj/v_proj/out_proj`, pre-norm layers
(`layer_norm1`/`layer_norm2`), quick GELU.

- `clip_vision`: CLIPVisionModel, CLIPForImageClassification (mean of the patch tokens ->
  classifier) and ZeroShotCLIP (class token -> post_layernorm -> projection -> cosine similarity
  to fixed class prompt embeddings).
- `clip_text`: CLIPTextModel, bare or as MeanPoolClassifier (causal + padding mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from compressor.core.errors import ExportError
from compressor.core.masks import HeadMask
from compressor.core.registry import register
from compressor.families.classifiers import MeanPoolClassifier, ZeroShotCLIP
from compressor.families.hf import (
    ImageStem,
    PooledHead,
    TextEncoderFamily,
    TransformersFamily,
    save_full_size,
    with_depth,
)
from compressor.families.parts import AttentionSlots, BlockParts, MlpSlots, Slot


class ClipTower(TransformersFamily):
    """What both CLIP towers share: the encoder layers."""

    def tower(self) -> nn.Module:
        """The CLIPVisionModel / CLIPTextModel inside the model."""
        raise NotImplementedError

    def config(self):
        return self.tower().config

    def blocks(self) -> Sequence[nn.Module]:
        return self.tower().encoder.layers

    def attention(self, block: int) -> AttentionSlots:
        attn = self.blocks()[block].self_attn
        return AttentionSlots(
            qkv=tuple(Slot(attn, n) for n in ("q_proj", "k_proj", "v_proj")), o=Slot(attn, "out_proj")
        )

    def head_dim(self, block: int) -> int:
        return int(self.blocks()[block].self_attn.head_dim)

    def set_head_count(self, block: int, heads: int) -> None:
        self.blocks()[block].self_attn.num_heads = heads

    def mlp(self, block: int) -> MlpSlots:
        mlp = self.blocks()[block].mlp
        return MlpSlots(fc1=Slot(mlp, "fc1"), act=mlp.activation_fn, fc2=Slot(mlp, "fc2"))

    def block_parts(self, block: int) -> BlockParts:
        layer = self.blocks()[block]
        return BlockParts(
            norm1=layer.layer_norm1, norm2=layer.layer_norm2, attn_drop=float(self.config().attention_dropout)
        )


def _vision_classes() -> dict[str, type]:
    from transformers import CLIPForImageClassification, CLIPVisionModel

    return {c.__name__: c for c in (CLIPVisionModel, CLIPForImageClassification, ZeroShotCLIP)}


@register("family", "clip_vision")
class ClipVision(ClipTower):
    """CLIP vision tower: CLIPVisionModel, CLIPForImageClassification, ZeroShotCLIP."""

    name = "clip_vision"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, tuple(_vision_classes().values()))

    def tower(self) -> nn.Module:
        if isinstance(self.model, ZeroShotCLIP):
            return self.model.encoder
        return getattr(self.model, "vision_model", self.model)

    def classifier(self) -> nn.Module:
        if isinstance(self.model, ZeroShotCLIP):
            return self.model.projection
        return getattr(self.model, "classifier", nn.Identity())

    def input_size(self) -> tuple[int, ...]:
        c = self.config()
        return (int(c.num_channels), int(c.image_size), int(c.image_size))

    def standard_block_problems(self) -> list[str]:
        if type(self.model).__name__ == "CLIPVisionModel":
            return ["CLIPVisionModel is not supported; use CLIPForImageClassification or ZeroShotCLIP"]
        return super().standard_block_problems()

    def stem_and_head(self) -> tuple[nn.Module, nn.Module]:
        tower = self.tower()
        stem = ImageStem(tower.embeddings, tower.embeddings.num_positions, norm=tower.pre_layrnorm)
        if isinstance(self.model, ZeroShotCLIP):
            return stem, ZeroShotHead(self.model, tower.post_layernorm)
        return stem, PooledHead(self.model.classifier, "patches")

    def describe(self) -> dict:
        if isinstance(self.model, ZeroShotCLIP):
            return {"class": "ZeroShotCLIP", **self.model.export_config()}
        return {"class": type(self.model).__name__, "config": self.model.config.to_dict()}

    @classmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        classes = _vision_classes()
        if arch.get("class") not in classes:
            raise ExportError(f"class: expected one of {', '.join(classes)}, got {arch.get('class')!r}")
        if arch["class"] == "ZeroShotCLIP":
            vision = with_depth(arch["vision_config"], depth)
            return ZeroShotCLIP.empty(vision, arch["projection_dim"], arch["num_classes"]).eval()
        model_cls = classes[arch["class"]]
        config = model_cls.config_class.from_dict(arch["config"])
        vision = config.vision_config if hasattr(config, "vision_config") else config
        if depth is not None:
            vision.num_hidden_layers = depth
        return model_cls(config).eval()

    def save_pretrained(self, folder: Path, mask: HeadMask) -> str:
        if isinstance(self.model, ZeroShotCLIP):  # the vision tower alone, loadable by CLIPVisionModel
            from safetensors.torch import save_file

            tower = self.tower()
            full = type(tower)(tower.config)
            save_full_size(ClipVision(tower), full, mask, Path(folder) / "hf_encoder")
            head = {  # logits = logit_scale * normalize(projection(pooler_output)) @ class_embeds.T
                "projection": self.model.projection.weight.detach().contiguous(),
                "class_embeds": self.model.class_embeds.detach().contiguous(),
                "logit_scale": self.model.logit_scale.detach().reshape(1).contiguous(),
            }
            save_file(head, str(Path(folder) / "hf_encoder" / "zero_shot_head.safetensors"))
            return "hf_encoder"
        save_full_size(self, type(self).empty(self.describe()), mask, Path(folder) / "hf_model")
        return "hf_model"


class ZeroShotHead(nn.Module):
    """Class token -> post_layernorm -> projection -> scaled cosine similarity to the class embeddings."""

    def __init__(self, model: ZeroShotCLIP, post_norm: nn.Module) -> None:
        super().__init__()
        self.embed = PooledHead(model.projection, "first", norm=post_norm)
        self.register_buffer("class_embeds", model.class_embeds.detach().clone())
        self.register_buffer("logit_scale", model.logit_scale.detach().clone())

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        image = self.embed(x)
        return self.logit_scale * (image / image.norm(dim=-1, keepdim=True)) @ self.class_embeds.t()

    def feature_layer(self) -> nn.Module:
        """The projection, whose input is the pooled feature (feature-based OOD scores read it)."""
        return self.embed.feature_layer()


@register("family", "clip_text")
class ClipText(ClipTower, TextEncoderFamily):
    """CLIP text tower: CLIPTextModel, bare or as MeanPoolClassifier(CLIPTextModel)."""

    name = "clip_text"
    causal = True

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        from transformers import CLIPTextModel

        return isinstance(model.encoder if isinstance(model, MeanPoolClassifier) else model, CLIPTextModel)

    def tower(self) -> nn.Module:
        return self.encoder()

    def final_norm(self) -> nn.Module:
        return self.tower().final_layer_norm

    @classmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        from transformers import CLIPTextConfig, CLIPTextModel

        return cls.wrap(CLIPTextModel(CLIPTextConfig.from_dict(with_depth(arch["config"], depth))), arch)
