"""HydraViT: M head-pruned ViT members fused into one module that runs them in one pass.

The model is described by a `HydraSpec` (shapes and which parts are shared), so it can be built
empty and loaded from an export without the base model, or filled from a base timm ViT and its
members by `mergers.hydra.build.build_hydra_vit`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mergers.hydra.layers import (
    GroupedLinear,
    HydraAttention,
    HydraMLP,
    MemberAffine,
    MemberLayerNorm,
    SharedMLP,
    run_in_chunks,
    widest_member_activation,
)

# measured with benchmarks/hydra_speed.py on a 2-core CPU: see the README's speed table
INFERENCE_CHUNK_BYTES = 8 << 20


class HydraOutput(NamedTuple):
    """member_logits: [M, B, C]; probs: the ensemble's averaged softmax, [B, C]."""

    member_logits: torch.Tensor
    probs: torch.Tensor


@dataclass
class HydraSpec:
    """Everything needed to build an empty HydraViT of the right shapes."""

    members: int
    embed_dim: int
    num_classes: int
    in_chans: int
    patch_size: list[int]
    grid_size: list[int]
    head_dim: int
    heads: list[list[int]]  # [block][member] kept heads
    mlp_hidden: list[list[int]]  # [block][member] MLP width (one entry when shared)
    mlp_mode: str = "average"
    num_prefix_tokens: int = 1
    has_cls_token: bool = True
    no_embed_class: bool = False
    global_pool: str = "token"
    qkv_bias: bool = True
    proj_bias: bool = True
    patch_bias: bool = True
    eps: float = 1e-6
    act: str = "gelu"
    fc_norm: bool = False
    final_norm: bool = True
    layer_scale: bool = False
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    shared: dict[str, bool] = field(default_factory=dict)  # component name -> one copy for all

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HydraSpec:
        return cls(**d)


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


def _norm(spec: HydraSpec, name: str) -> nn.Module:
    if spec.shared.get(name, True):
        return nn.LayerNorm(spec.embed_dim, eps=spec.eps)
    return MemberLayerNorm(spec.members, spec.embed_dim, eps=spec.eps)


def _scale(spec: HydraSpec, name: str) -> nn.Module:
    if not spec.layer_scale:
        return nn.Identity()
    return MemberAffine(spec.members if not spec.shared.get(name, True) else 1, spec.embed_dim, bias=False)


class HydraBlock(nn.Module):
    """Pre-norm transformer block over M streams: x + attn(norm1(x)); x + mlp(norm2(x))."""

    def __init__(self, spec: HydraSpec, index: int) -> None:
        super().__init__()
        p = f"blocks.{index}."
        self.norm1 = _norm(spec, p + "norm1")
        self.attn = HydraAttention(
            spec.embed_dim,
            spec.heads[index],
            spec.head_dim,
            spec.qkv_bias,
            spec.proj_bias,
            spec.attn_drop,
            spec.proj_drop,
        )
        self.ls1 = _scale(spec, p + "ls1")
        self.norm2 = _norm(spec, p + "norm2")
        act = ACTIVATIONS[spec.act]()
        hidden = spec.mlp_hidden[index]
        if spec.mlp_mode == "average":
            self.mlp = SharedMLP(spec.embed_dim, hidden[0], act, spec.proj_bias, spec.proj_drop)
        else:
            self.mlp = HydraMLP(spec.embed_dim, hidden, act, spec.proj_bias, spec.proj_drop)
        self.ls2 = _scale(spec, p + "ls2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class HydraViT(nn.Module):
    """M ViT members in one module; forward returns HydraOutput(member_logits [M,B,C], probs [B,C]).

    `inference_chunk_bytes`: CPU inference runs large batches in chunks whose widest activation
    (all members together) fits this many bytes; None runs every batch whole.
    """

    inference_chunk_bytes: int | None = INFERENCE_CHUNK_BYTES

    def __init__(self, spec: HydraSpec) -> None:
        super().__init__()
        self.spec = spec
        m, d = spec.members, spec.embed_dim
        self.members = m
        shared = spec.shared
        self.patch_shared = shared.get("patch_embed", True)
        out_ch = d if self.patch_shared else m * d
        self.patch_proj = nn.Conv2d(spec.in_chans, out_ch, spec.patch_size, spec.patch_size, bias=spec.patch_bias)
        n_members = lambda name: 1 if shared.get(name, True) else m  # noqa: E731
        n_patches = spec.grid_size[0] * spec.grid_size[1]
        n_pos = n_patches if spec.no_embed_class else n_patches + spec.num_prefix_tokens
        self.cls_token = nn.Parameter(torch.zeros(n_members("cls_token"), 1, 1, d)) if spec.has_cls_token else None
        self.pos_embed = nn.Parameter(torch.zeros(n_members("pos_embed"), 1, n_pos, d))
        self.blocks = nn.ModuleList(HydraBlock(spec, i) for i in range(len(spec.heads)))
        self.norm = _norm(spec, "norm") if spec.final_norm else nn.Identity()
        self.fc_norm = _norm(spec, "fc_norm") if spec.fc_norm else nn.Identity()
        self.head_shared = shared.get("head", True)
        if self.head_shared:
            self.head = nn.Linear(d, spec.num_classes)
        else:
            self.head = GroupedLinear([d] * m, [spec.num_classes] * m)
        self._widest = widest_member_activation(self.blocks)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> member streams [M, B, T, D] (patch embedding run once)."""
        m, d = self.members, self.spec.embed_dim
        p = self.patch_proj(x).flatten(2)  # [B, D or M*D, N]
        b, n = p.shape[0], p.shape[-1]
        if self.patch_shared:
            tokens = p.transpose(1, 2).unsqueeze(0).expand(m, b, n, d)
        else:
            tokens = p.view(b, m, d, n).permute(1, 0, 3, 2)
        pos = self.pos_embed.expand(m, 1, -1, d)
        if self.spec.no_embed_class:
            tokens = tokens + pos
        if self.cls_token is not None:
            cls = self.cls_token.expand(m, b, 1, d)
            tokens = torch.cat([cls, tokens], dim=2)
        if not self.spec.no_embed_class:
            tokens = tokens + pos
        return tokens

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.global_pool == "token":
            return x[:, :, 0]
        if self.spec.global_pool == "avg":
            return x[:, :, self.spec.num_prefix_tokens :].mean(dim=2)
        raise ValueError(f"global_pool '{self.spec.global_pool}' is not supported (token, avg)")

    def forward_member_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> per-member logits [M, B, num_classes]."""
        per_sample = self.pos_embed.shape[2] * self._widest * self.pos_embed.element_size()
        return run_in_chunks(self._member_logits, x, per_sample, self.inference_chunk_bytes)

    def _member_logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h)
        feats = self.fc_norm(self.pool(self.norm(h)))  # [M, B, D]
        return self.head(feats)

    def forward(self, x: torch.Tensor) -> HydraOutput:
        logits = self.forward_member_logits(x)
        return HydraOutput(logits, F.softmax(logits, dim=-1).mean(dim=0))
