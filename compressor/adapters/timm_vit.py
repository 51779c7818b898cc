"""Adapter for timm VisionTransformer: fused `qkv` Linear, `num_heads`, `proj`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from compressor.adapters.base import HeadWeights, ModelAdapter


def _select_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    new = nn.Linear(linear.in_features, rows.numel(), bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[rows])
    return new


def _select_cols(linear: nn.Linear, cols: torch.Tensor) -> nn.Linear:
    new = nn.Linear(cols.numel(), linear.out_features, bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, cols])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


class TimmViTAdapter(ModelAdapter):
    """timm `VisionTransformer` (and subclasses using timm's standard `Attention`)."""

    family = "timm_vit"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        for i, blk in enumerate(model.blocks):
            attn = blk.attn
            if not hasattr(attn, "qkv") or not hasattr(attn, "proj"):
                raise TypeError(f"block {i}: attention {type(attn).__name__} has no fused qkv/proj")
            if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
                raise TypeError(f"block {i}: scale_norm mixes heads before proj; head gating would not be exact")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        try:
            from timm.models.vision_transformer import VisionTransformer
        except ImportError:  # pragma: no cover
            return False
        return isinstance(model, VisionTransformer)

    def _attn(self, block: int) -> nn.Module:
        return self.model.blocks[block].attn

    @property
    def num_blocks(self) -> int:
        return len(self.model.blocks)

    @property
    def embed_dim(self) -> int:
        return int(self.model.embed_dim)

    def num_heads(self, block: int) -> int:
        return int(self._attn(block).num_heads)

    def head_dim(self, block: int) -> int:
        return int(self._attn(block).head_dim)

    def output_projection(self, block: int) -> nn.Linear:
        return self._attn(block).proj

    def head_weights(self, block: int) -> HeadWeights:
        attn = self._attn(block)
        h, hd = self.num_heads(block), self.head_dim(block)
        w = attn.qkv.weight.view(3, h, hd, -1)
        b = attn.qkv.bias.view(3, h, hd) if attn.qkv.bias is not None else None
        return HeadWeights(
            q=w[0],
            k=w[1],
            v=w[2],
            q_bias=None if b is None else b[0],
            k_bias=None if b is None else b[1],
            v_bias=None if b is None else b[2],
            o=attn.proj.weight.view(-1, h, hd),
            o_bias=attn.proj.bias,
        )

    def prune_heads_(self, block: int, keep: Sequence[int]) -> None:
        attn = self._attn(block)
        h, hd = self.num_heads(block), self.head_dim(block)
        keep_t = torch.as_tensor(sorted(keep), dtype=torch.long)
        if keep_t.numel() == 0:
            raise ValueError(f"block {block}: cannot physically remove every head")
        per_head = (keep_t[:, None] * hd + torch.arange(hd)[None]).flatten()  # columns of kept heads
        qkv_rows = torch.cat([per_head + i * h * hd for i in range(3)])
        had_gate = hasattr(attn.proj, "head_gate")
        gate_values = attn.proj.head_gate[keep_t] if had_gate else None
        attn.qkv = _select_rows(attn.qkv, qkv_rows)
        if getattr(attn, "gate", None) is not None:
            attn.gate = _select_rows(attn.gate, per_head)
        attn.proj = _select_cols(attn.proj, per_head)
        attn.num_heads = int(keep_t.numel())
        attn.attn_dim = attn.num_heads * hd
        if had_gate:
            self.install_gates()
            attn.proj._buffers["head_gate"] = gate_values.clone()

    def logits(self, inputs: Any) -> torch.Tensor:
        return self.model(inputs)
