"""The pieces of a transformer block a family hands out: slots that surgery can replace, the
attention and MLP projections, per-head weight views, what a block has besides them, and the
row/column selection of Linears that head and unit removal use."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Slot:
    """A submodule reached as `owner.<name>`, so that surgery can replace it."""

    owner: nn.Module
    name: str

    def get(self) -> nn.Module:
        return getattr(self.owner, self.name)

    def set(self, module: nn.Module) -> None:
        setattr(self.owner, self.name, module)


@dataclass
class AttentionSlots:
    """One block's attention projections: a fused [q; k; v] Linear or three, and the output one.

    `head_rows` are further Linears whose output rows follow the heads (removed with them).
    """

    qkv: tuple[Slot, ...]
    o: Slot
    head_rows: tuple[Slot, ...] = ()


@dataclass
class MlpSlots:
    """One block's MLP: fc1 (hidden units are its output rows), the activation, fc2."""

    fc1: Slot
    act: nn.Module
    fc2: Slot


@dataclass
class HeadWeights:
    """One block's attention weights split per head (views of the model's own tensors).

    q, k, v: [H, head_dim, D] weights and [H, head_dim] biases (None where absent);
    o: [D, H, head_dim] output-projection weight, o_bias: [D] or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None


@dataclass
class BlockParts:
    """What a fused block copies from one block besides attention and MLP weights.

    Dropout rates: `attn_drop` on attention probabilities, `proj_drop` after the output
    projection, `mlp_act_drop` after the MLP activation, `mlp_drop` after fc2.
    """

    norm1: nn.Module
    norm2: nn.Module
    ls1: torch.Tensor | None = None  # layer-scale gammas [D]
    ls2: torch.Tensor | None = None
    q_norm: nn.Module | None = None  # per-head LayerNorm over head_dim (timm qk_norm)
    k_norm: nn.Module | None = None
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    mlp_act_drop: float = 0.0
    mlp_drop: float = 0.0


def select_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A new Linear keeping output rows `rows` of `linear`."""
    new = nn.Linear(linear.in_features, rows.numel(), bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[rows])
    return new


def select_cols(linear: nn.Linear, cols: torch.Tensor) -> nn.Linear:
    """A new Linear keeping input columns `cols` of `linear`."""
    new = nn.Linear(cols.numel(), linear.out_features, bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, cols])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def head_columns(keep: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Feature indices of heads `keep` in a [heads * head_dim] layout."""
    return (keep[:, None] * head_dim + torch.arange(head_dim)[None]).flatten()
