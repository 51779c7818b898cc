"""HydraModel: M head-pruned members fused into one module that runs them in one forward pass.

One implementation for every model family. The family supplies the two ends, its stem
(inputs -> tokens and a key mask) and its head (tokens -> logits), as plain modules; the fused
blocks in between are described by a `HydraSpec` (shapes, norms, MLP mode and which parts the
members share), so the model can be built empty and loaded from an export without the base model.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from compressor.core.errors import ExportError
from compressor.families import family_class
from compressor.uq.outputs import EnsembleOutput
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

MLP_MODES = ("average", "grouped", "pruned")
# measured with benchmarks/hydra_speed.py on a 2-core CPU: see the README's speed table
INFERENCE_CHUNK_BYTES = 8 << 20


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


@dataclass
class HydraSpec:
    """Everything needed to build an empty HydraModel of the right shapes."""

    family: str  # the model family (its stem and head)
    arch: dict  # the family's description of the base architecture
    members: int
    dim: int
    head_dim: int
    heads: list[list[int]]  # [block][member] kept heads
    mlp_hidden: list[list[int]]  # [block][member] MLP width (one entry when shared)
    mlp_mode: str = "average"
    act: str = "gelu"
    pre_norm: bool = True
    causal: bool = False
    eps: float = 1e-6  # the blocks' LayerNorms
    qk_norm_eps: float | None = None  # None: no qk norm
    layer_scale: bool = False
    qkv_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    mlp_act_drop: float = 0.0
    mlp_drop: float = 0.0
    shared: dict[str, bool] = field(default_factory=dict)  # part name -> one copy for all members
    # the shared trunk: the first `trunk` blocks are the base's own, identical in every member, and
    # run ONCE on one stream that is then handed to every member (their heads and MLP lists: one entry)
    trunk: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HydraSpec:
        """A spec from an export's config, every key checked (types, ranges, consistency)."""
        if not isinstance(d, dict):
            raise ExportError(f"hydra_spec: expected a mapping, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(d) - known), sorted(k for k in ("family", "arch", "members", "dim") if k not in d)
        if unknown or missing:
            raise ExportError(f"hydra_spec: unknown keys {unknown}, missing keys {missing}")
        spec = cls(**d)
        spec.check()
        return spec

    def check(self) -> None:
        """Raise ExportError naming the key unless the spec describes a buildable model."""

        def need(ok: bool, key: str, expected: str) -> None:
            if not ok:
                raise ExportError(f"hydra_spec.{key}: expected {expected}, got {getattr(self, key)!r}")

        is_int = lambda v, lo=1, hi=1 << 20: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi  # noqa: E731
        need(isinstance(self.family, str) and isinstance(self.arch, dict), "family", "a family name and its arch")
        need(is_int(self.members, 1, 64), "members", "an integer in 1..64")
        need(is_int(self.dim, 1, 1 << 16) and is_int(self.head_dim, 1, 4096), "dim", "dim <= 65536, head_dim <= 4096")
        m = self.members
        need(isinstance(self.heads, list) and len(self.heads) > 0, "heads", "one list of head counts per block")
        depth = len(self.heads)
        need(is_int(self.trunk, 0, depth - 1), "trunk", f"an integer in 0..{depth - 1} (the blocks run once)")
        need(self.trunk == 0 or self.is_shared("stem"), "trunk", "0 when members have their own stems")
        need(
            all(
                isinstance(b, list) and len(b) == self.streams(i) and all(is_int(h, 0, 4096) for h in b)
                for i, b in enumerate(self.heads)
            )
            and all(max(b) > 0 for b in self.heads),
            "heads",
            f"per block one list of {m} head counts (0..4096, some > 0), one count in the {self.trunk} trunk blocks",
        )
        need(self.mlp_mode in MLP_MODES, "mlp_mode", f"one of {', '.join(MLP_MODES)}")
        widths = lambda i: 1 if self.mlp_mode == "average" else self.streams(i)  # noqa: E731
        need(
            isinstance(self.mlp_hidden, list)
            and len(self.mlp_hidden) == depth
            and all(
                isinstance(b, list) and len(b) == widths(i) and all(is_int(w) for w in b)
                for i, b in enumerate(self.mlp_hidden)
            ),
            "mlp_hidden",
            f"per block one list of {1 if self.mlp_mode == 'average' else m} positive MLP widths (one in the trunk)",
        )
        need(self.act in ACTIVATIONS, "act", f"one of {', '.join(ACTIVATIONS)}")
        for key in ("pre_norm", "causal", "layer_scale", "qkv_bias", "proj_bias", "mlp_bias"):
            need(isinstance(getattr(self, key), bool), key, "true/false")
        for key in ("eps", "attn_drop", "proj_drop", "mlp_act_drop", "mlp_drop"):
            need(
                isinstance(getattr(self, key), (int, float)) and 0 <= getattr(self, key) < 1, key, "a number in [0, 1)"
            )
        need(self.qk_norm_eps is None or isinstance(self.qk_norm_eps, (int, float)), "qk_norm_eps", "a number or null")
        need(
            isinstance(self.shared, dict) and all(isinstance(v, bool) for v in self.shared.values()),
            "shared",
            "a mapping of part names to true/false",
        )

    def is_shared(self, name: str) -> bool:
        return self.shared.get(name, True)

    def streams(self, block: int) -> int:
        """How many streams block `block` runs on: one in the shared trunk, else one per member."""
        return 1 if block < self.trunk else self.members


def _norm(spec: HydraSpec, name: str, dim: int, eps: float, block: int) -> nn.Module:
    if spec.is_shared(name) or spec.streams(block) == 1:
        return nn.LayerNorm(dim, eps=eps)
    return MemberLayerNorm(spec.members, dim, eps=eps)


def _scale(spec: HydraSpec, name: str, block: int) -> nn.Module:
    if not spec.layer_scale:
        return nn.Identity()
    return MemberAffine(1 if spec.is_shared(name) else spec.streams(block), spec.dim, bias=False)


def _norm_for(norm: nn.Module, x: torch.Tensor, folds: bool) -> tuple[torch.Tensor, MemberAffine | None]:
    """`norm(x)` for the layer after it, or, when that layer folds a per-member norm's affine into
    its grouped weights (`folds`), the plain normalisation and the affine to fold."""
    if folds and isinstance(norm, MemberLayerNorm):
        return norm.normalize(x), norm.affine
    return norm(x), None


class HydraBlock(nn.Module):
    """A transformer block over M streams: pre-norm (x + ls1(attn(norm1(x)))) or post-norm
    (norm1(x + attn(x))), then the MLP likewise."""

    def __init__(self, spec: HydraSpec, index: int) -> None:
        super().__init__()
        p = f"blocks.{index}."
        self.pre_norm = spec.pre_norm
        qk = [None, None]
        if spec.qk_norm_eps is not None:
            qk = [_norm(spec, p + n, spec.head_dim, spec.qk_norm_eps, index) for n in ("q_norm", "k_norm")]
        self.norm1 = _norm(spec, p + "norm1", spec.dim, spec.eps, index)
        self.attn = HydraAttention(
            spec.dim,
            spec.heads[index],
            spec.head_dim,
            spec.qkv_bias,
            spec.proj_bias,
            spec.attn_drop,
            spec.proj_drop,
            q_norm=qk[0],
            k_norm=qk[1],
        )
        self.ls1 = _scale(spec, p + "ls1", index)
        self.norm2 = _norm(spec, p + "norm2", spec.dim, spec.eps, index)
        act, hidden = ACTIVATIONS[spec.act](), spec.mlp_hidden[index]
        drops = (spec.mlp_act_drop, spec.mlp_drop)
        if spec.mlp_mode == "average":
            self.mlp = SharedMLP(spec.dim, hidden[0], act, spec.mlp_bias, *drops)
        else:
            self.mlp = HydraMLP(spec.dim, hidden, act, spec.mlp_bias, *drops)
        self.ls2 = _scale(spec, p + "ls2", index)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            h, affine = _norm_for(self.norm1, x, folds=True)
            x = x + self.ls1(self.attn(h, attn_mask, in_affine=affine))
            h, affine = _norm_for(self.norm2, x, folds=isinstance(self.mlp, HydraMLP))
            return x + self.ls2(self.mlp(h) if affine is None else self.mlp(h, in_affine=affine))
        x = self.norm1(x + self.ls1(self.attn(x, attn_mask)))
        return self.norm2(x + self.ls2(self.mlp(x)))


def attention_mask(key_mask: torch.Tensor | None, tokens: int, causal: bool) -> torch.Tensor | None:
    """Boolean [B or 1, 1, T, T] (True = may attend), or None for full attention."""
    if not causal:
        return None if key_mask is None else key_mask[:, None, None, :]
    device = key_mask.device if key_mask is not None else None
    mask = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril()[None, None]
    return mask if key_mask is None else mask & key_mask[:, None, None, :]


class HydraModel(nn.Module):
    """M members in one module; forward returns EnsembleOutput(member_logits [M,B,C], probs [B,C]).

    `stems`/`heads` hold one copy when every member has the same one, else one per member.
    `inference_chunk_bytes`: CPU inference runs large batches in chunks whose widest activation
    (all members together) fits this many bytes; None runs every batch whole.
    """

    inference_chunk_bytes: int | None = INFERENCE_CHUNK_BYTES

    def __init__(self, spec: HydraSpec) -> None:
        super().__init__()
        self.spec = spec
        self.members = spec.members
        fam = family_class(spec.family)
        stem, head = fam(fam.empty(spec.arch, depth=0)).stem_and_head()
        copies = lambda module, name: (
            [module]
            + [  # noqa: E731
                copy.deepcopy(module) for _ in range(0 if spec.is_shared(name) else spec.members - 1)
            ]
        )
        self.stems = nn.ModuleList(copies(stem, "stem"))
        self.blocks = nn.ModuleList(HydraBlock(spec, i) for i in range(len(spec.heads)))
        self.heads = nn.ModuleList(copies(head, "head"))
        self._widest = widest_member_activation(self.blocks)
        # per member, per block: the MLP units it kept ('pruned' mode; set by the builder), for inspection
        self.mlp_kept: list[list[torch.Tensor]] | None = None

    def forward(self, inputs: torch.Tensor) -> EnsembleOutput:
        return EnsembleOutput.from_logits(self.forward_member_logits(inputs))

    def feature_layers(self) -> list[nn.Module]:
        """The layers whose input is the pooled feature: one per member, or one shared layer that
        sees every member's features as [M * B, D] (member-major)."""
        return [head.feature_layer() for head in self.heads]

    def padding_violations(self) -> list[str]:
        """Grouped layers whose padding (weights outside every member's heads or units) is not
        zero: weights that do not fit the spec's head counts or MLP widths."""
        bad = []
        for name, module in self.named_modules():
            if isinstance(module, GroupedLinear) and module.padded:
                if bool((module.weight.detach() * (1 - module.weight_mask)).abs().gt(0).any()):
                    bad.append(name)
        return bad

    def forward_member_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Inputs (images or token ids) -> per-member logits [M, B, C]."""
        element = next(self.parameters()).element_size()
        per_sample = self.stems[0].tokens_per_sample(inputs) * self._widest * element
        return run_in_chunks(self._member_logits, inputs, per_sample, self.inference_chunk_bytes)

    def _member_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        m = self.members
        trunk = self.spec.trunk
        if len(self.stems) == 1:
            tokens, key_mask = self.stems[0](inputs)
            x = tokens.unsqueeze(0)
            attn_mask = attention_mask(key_mask, x.shape[2], self.spec.causal)
            for blk in self.blocks[:trunk]:  # the shared trunk: once, on one stream
                x = blk(x, attn_mask)
            x = x.expand(m, *x.shape[1:])
        else:  # members with their own (fine-tuned) stems
            ends = [stem(inputs) for stem in self.stems]
            x, key_mask = torch.stack([t for t, _ in ends]), ends[0][1]
            attn_mask = attention_mask(key_mask, x.shape[2], self.spec.causal)
        for blk in self.blocks[trunk:]:
            x = blk(x, attn_mask)
        if len(self.heads) == 1:
            b = x.shape[1]
            keys = None if key_mask is None else key_mask.repeat(m, 1)
            return self.heads[0](x.flatten(0, 1), keys).view(m, b, -1)
        return torch.stack([head(x[i], key_mask) for i, head in enumerate(self.heads)])
