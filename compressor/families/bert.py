"""BERT-style transformers encoders (BertModel, and models laid out like it such as MiniLM and
RoBERTa): `attention.self.query/key/value`, `attention.output.dense`, post-norm blocks.

Seen bare, or inside a `MeanPoolClassifier` (the form whose blocks and head can be run on their own).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from compressor.core.registry import register
from compressor.families.classifiers import MeanPoolClassifier
from compressor.families.hf import TextEncoderFamily, with_depth
from compressor.families.parts import AttentionSlots, BlockParts, MlpSlots, Slot


def _is_bert_like(model: nn.Module) -> bool:
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not (isinstance(layers, nn.ModuleList) and len(layers) and hasattr(model, "embeddings")):
        return False
    attn = getattr(getattr(layers[0], "attention", None), "self", None)
    return all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("query", "key", "value"))


@register("family", "bert")
class Bert(TextEncoderFamily):
    """BERT-style encoders, bare or as `MeanPoolClassifier(encoder)`."""

    name = "bert"
    pre_norm = False  # x = LN1(x + attn(x)); x = LN2(x + mlp(x))

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return _is_bert_like(model.encoder if isinstance(model, MeanPoolClassifier) else model)

    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder().encoder.layer

    def attention(self, block: int) -> AttentionSlots:
        attn = self.blocks()[block].attention
        qkv = tuple(Slot(attn.self, n) for n in ("query", "key", "value"))
        return AttentionSlots(qkv=qkv, o=Slot(attn.output, "dense"))

    def head_dim(self, block: int) -> int:
        return int(self.blocks()[block].attention.self.attention_head_size)

    def set_head_count(self, block: int, heads: int) -> None:
        attn = self.blocks()[block].attention.self
        attn.num_attention_heads = heads
        attn.all_head_size = heads * int(attn.attention_head_size)

    def mlp(self, block: int) -> MlpSlots:
        layer = self.blocks()[block]
        fc1, act = Slot(layer.intermediate, "dense"), layer.intermediate.intermediate_act_fn
        return MlpSlots(fc1=fc1, act=act, fc2=Slot(layer.output, "dense"))

    def block_parts(self, block: int) -> BlockParts:
        layer, config = self.blocks()[block], self.config()
        return BlockParts(
            norm1=layer.attention.output.LayerNorm,
            norm2=layer.output.LayerNorm,
            attn_drop=float(config.attention_probs_dropout_prob),
            proj_drop=float(config.hidden_dropout_prob),
            mlp_drop=float(config.hidden_dropout_prob),
        )

    @classmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        import transformers

        config = transformers.AutoConfig.for_model(**with_depth(arch["config"], depth))
        return cls.wrap(transformers.AutoModel.from_config(config), arch)
