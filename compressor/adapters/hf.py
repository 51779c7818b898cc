"""Adapter for Hugging Face transformers encoders: BERT-style, ViT, CLIP text and vision towers.

Attention blocks are found by structure, not by class name:
- BERT-style: a module with `query`/`key`/`value` Linears; its output projection is the sibling
  `output.dense` (BertSelfAttention inside BertAttention).
- q/k/v/o style (HF ViT in transformers 5, CLIP): `q_proj`/`k_proj`/`v_proj` and `o_proj` or
  `out_proj` on the same module.
Heads are gated in the adapter (transformers 5 ignores `head_mask` and has no `prune_heads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compressor.adapters.base import HeadWeights, ModelAdapter
from compressor.adapters.timm_vit import _select_cols, _select_rows


@dataclass
class _Attention:
    module: nn.Module  # holds q/k/v (and the head-count attributes)
    owner: nn.Module  # holds the output projection
    q: str
    k: str
    v: str
    o: str
    count_attrs: tuple[str, ...]
    head_dim: int


def _find_attention(model: nn.Module) -> list[_Attention]:
    found = []
    for mod in model.modules():
        if all(isinstance(getattr(mod, n, None), nn.Linear) for n in ("query", "key", "value")):
            parent = next((p for p in model.modules() if getattr(p, "self", None) is mod), None)
            dense = getattr(getattr(parent, "output", None), "dense", None)
            if parent is None or not isinstance(dense, nn.Linear):
                continue
            found.append(
                _Attention(
                    mod,
                    parent.output,
                    "query",
                    "key",
                    "value",
                    "dense",
                    ("num_attention_heads",),
                    int(mod.attention_head_size),
                )
            )
        elif all(isinstance(getattr(mod, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj")):
            o = "o_proj" if isinstance(getattr(mod, "o_proj", None), nn.Linear) else "out_proj"
            if not isinstance(getattr(mod, o, None), nn.Linear):
                continue
            counts = tuple(a for a in ("num_heads", "num_attention_heads") if hasattr(mod, a))
            found.append(_Attention(mod, mod, "q_proj", "k_proj", "v_proj", o, counts, int(mod.head_dim)))
    return found


class HFEncoderAdapter(ModelAdapter):
    """transformers encoders (BertModel and friends, ViTModel, CLIP towers), bare or wrapped."""

    family = "hf_encoder"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._attn = _find_attention(model)
        if not self._attn:
            raise TypeError(f"{type(model).__name__}: no BERT-style or q/k/v/o attention blocks found")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        try:
            from transformers import PreTrainedModel
        except ImportError:  # pragma: no cover
            return False
        return any(isinstance(m, PreTrainedModel) for m in model.modules()) and bool(_find_attention(model))

    @property
    def num_blocks(self) -> int:
        return len(self._attn)

    def num_heads(self, block: int) -> int:
        a = self._attn[block]
        return getattr(a.module, a.q).out_features // a.head_dim

    def head_dim(self, block: int) -> int:
        return self._attn[block].head_dim

    def output_projection(self, block: int) -> nn.Linear:
        a = self._attn[block]
        return getattr(a.owner, a.o)

    def head_weights(self, block: int) -> HeadWeights:
        a = self._attn[block]
        h, hd = self.num_heads(block), a.head_dim
        lin = [getattr(a.module, n) for n in (a.q, a.k, a.v)]
        o = self.output_projection(block)
        biases = [None if li.bias is None else li.bias.view(h, hd) for li in lin]
        return HeadWeights(
            q=lin[0].weight.view(h, hd, -1),
            k=lin[1].weight.view(h, hd, -1),
            v=lin[2].weight.view(h, hd, -1),
            q_bias=biases[0],
            k_bias=biases[1],
            v_bias=biases[2],
            o=o.weight.view(-1, h, hd),
            o_bias=o.bias,
        )

    def prune_heads_(self, block: int, keep: Sequence[int]) -> None:
        a = self._attn[block]
        hd = a.head_dim
        keep_t = torch.as_tensor(sorted(keep), dtype=torch.long)
        if keep_t.numel() == 0:
            raise ValueError(f"block {block}: cannot physically remove every head")
        cols = (keep_t[:, None] * hd + torch.arange(hd)[None]).flatten()
        proj = self.output_projection(block)
        had_gate = hasattr(proj, "head_gate")
        gate_values = proj.head_gate[keep_t] if had_gate else None
        for n in (a.q, a.k, a.v):
            setattr(a.module, n, _select_rows(getattr(a.module, n), cols))
        setattr(a.owner, a.o, _select_cols(proj, cols))
        for attr in a.count_attrs:
            setattr(a.module, attr, int(keep_t.numel()))
        if hasattr(a.module, "all_head_size"):
            a.module.all_head_size = int(keep_t.numel()) * hd
        if had_gate:
            self.install_gates()
            self.output_projection(block)._buffers["head_gate"] = gate_values.clone()

    def logits(self, inputs: Any) -> torch.Tensor:
        out = self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)
        for name in ("logits", "last_hidden_state"):
            if hasattr(out, name):
                return getattr(out, name)
        return out
