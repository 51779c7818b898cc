"""Hydra for transformers models: BERT-style text classifiers and ViT image classifiers.

Same fusion as the timm version: member streams [M, B, T, D], grouped Q/K/V, one attention call
(with the padding mask for text), grouped output projection. BERT blocks are post-norm
(x = LN1(x + attn(x)); x = LN2(x + mlp(x))), ViT blocks pre-norm. Embeddings run once when the
members share them. Supported: `MeanPoolClassifier(BertModel-like)` and `ViTForImageClassification`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from compressor.adapters import get_adapter
from compressor.masks import HeadMask
from mergers.hydra.build import _fill_norm, _same_module, fill_attention
from mergers.hydra.layers import GroupedLinear, HydraAttention, HydraMLP, MemberLayerNorm, SharedMLP
from mergers.hydra.model import ACTIVATIONS, HydraOutput

ACT_NAMES = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


@dataclass(frozen=True)
class _Family:
    """Where one transformers family keeps the parts of a block, and how it embeds and pools."""

    name: str
    pre_norm: bool
    norm1: str
    norm2: str
    fc1: str
    fc2: str


FAMILIES = {
    "bert": _Family(
        "bert", False, "attention.output.LayerNorm", "output.LayerNorm", "intermediate.dense", "output.dense"
    ),
    "vit": _Family("vit", True, "layernorm_before", "layernorm_after", "mlp.fc1", "mlp.fc2"),
}


def _get(mod: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        mod = getattr(mod, part)
    return mod


def family_of(model: nn.Module) -> str | None:
    """'bert' for MeanPoolClassifier over a BERT-style encoder, 'vit' for ViTForImageClassification."""
    from compressor.text import MeanPoolClassifier

    if (
        isinstance(model, MeanPoolClassifier)
        and hasattr(model.encoder, "embeddings")
        and hasattr(getattr(model.encoder, "encoder", None), "layer")
    ):
        return "bert"
    try:
        from transformers import ViTForImageClassification
    except ImportError:  # pragma: no cover
        return None
    return "vit" if isinstance(model, ViTForImageClassification) else None


def _parts(model: nn.Module, family: str) -> tuple[nn.Module, list[nn.Module], nn.Module | None, nn.Module]:
    """(embeddings, layers, final norm or None, classifier) of a supported model."""
    if family == "bert":
        return model.encoder.embeddings, list(model.encoder.encoder.layer), None, model.head
    return model.vit.embeddings, list(model.vit.layers), model.vit.layernorm, model.classifier


@dataclass
class HydraHFSpec:
    members: int
    family: str
    encoder_config: dict
    num_classes: int
    head_dim: int
    heads: list[list[int]]
    mlp_hidden: list[list[int]]
    mlp_mode: str = "average"
    act: str = "gelu"
    eps: float = 1e-12
    pad_token_id: int = 0
    shared: dict[str, bool] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HydraHFSpec:
        return cls(**d)


def _norm(spec: HydraHFSpec, name: str, dim: int) -> nn.Module:
    if spec.shared.get(name, True):
        return nn.LayerNorm(dim, eps=spec.eps)
    return MemberLayerNorm(spec.members, dim, eps=spec.eps)


class HydraHFLayer(nn.Module):
    def __init__(self, spec: HydraHFSpec, index: int, dim: int) -> None:
        super().__init__()
        p = f"layer.{index}."
        self.pre_norm = FAMILIES[spec.family].pre_norm
        self.attn = HydraAttention(dim, spec.heads[index], spec.head_dim)
        self.norm1 = _norm(spec, p + "norm1", dim)
        act = ACTIVATIONS[spec.act]()
        hidden = spec.mlp_hidden[index]
        self.mlp = SharedMLP(dim, hidden[0], act) if spec.mlp_mode == "average" else HydraMLP(dim, hidden, act)
        self.norm2 = _norm(spec, p + "norm2", dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.norm1(x), key_mask)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, key_mask))
        return self.norm2(x + self.mlp(x))


class HydraHF(nn.Module):
    """M transformers classifiers in one module: token ids [B, L] or images [B, C, H, W] -> HydraOutput."""

    def __init__(self, spec: HydraHFSpec) -> None:
        super().__init__()
        self.spec = spec
        self.members = spec.members
        if spec.family == "bert":
            from transformers import BertConfig
            from transformers.models.bert.modeling_bert import BertEmbeddings

            config = BertConfig(**spec.encoder_config)
            make_emb = lambda: BertEmbeddings(config)  # noqa: E731
        else:
            from transformers import ViTConfig
            from transformers.models.vit.modeling_vit import ViTEmbeddings

            config = ViTConfig(**spec.encoder_config)
            make_emb = lambda: ViTEmbeddings(config)  # noqa: E731
        dim = config.hidden_size
        n = lambda name: 1 if spec.shared.get(name, True) else spec.members  # noqa: E731
        self.embeddings = nn.ModuleList(make_emb() for _ in range(n("embeddings")))
        self.layers = nn.ModuleList(HydraHFLayer(spec, i, dim) for i in range(len(spec.heads)))
        self.final_norm = _norm(spec, "final_norm", dim) if spec.family == "vit" else nn.Identity()
        if spec.shared.get("head", True):
            self.head = nn.Linear(dim, spec.num_classes)
        else:
            self.head = GroupedLinear([dim] * spec.members, [spec.num_classes] * spec.members)

    def _embed(self, inputs: torch.Tensor) -> torch.Tensor:
        call = (lambda e: e(input_ids=inputs)) if self.spec.family == "bert" else (lambda e: e(inputs))
        if len(self.embeddings) == 1:
            e = call(self.embeddings[0])
            return e.unsqueeze(0).expand(self.members, *e.shape)
        return torch.stack([call(emb) for emb in self.embeddings])  # fine-tuned members: a lookup each

    def forward_member_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        key_mask = inputs != self.spec.pad_token_id if self.spec.family == "bert" else None
        x = self._embed(inputs)
        for layer in self.layers:
            x = layer(x, key_mask)
        x = self.final_norm(x)
        if key_mask is None:
            pooled = x[:, :, 0]
        else:
            m = key_mask[None, :, :, None].to(x.dtype)
            pooled = (x * m).sum(2) / m.sum(2).clamp_min(1.0)  # [M, B, D]
        return self.head(pooled)

    def forward(self, inputs: torch.Tensor) -> HydraOutput:
        logits = self.forward_member_logits(inputs)
        return HydraOutput(logits, F.softmax(logits, dim=-1).mean(dim=0))


def build_hydra_hf(
    base: nn.Module,
    masks: Sequence[HeadMask],
    members: Sequence[nn.Module] | None = None,
    mlp_mode: str = "average",
    mlp_keep_ratio: float | None = None,
) -> HydraHF:
    """Fuse M members of a supported transformers classifier (base + masks, or fine-tuned members)."""
    family = family_of(base)
    if family is None:
        raise NotImplementedError(
            f"hydra merger: {type(base).__name__} is not supported; transformers models supported are "
            "MeanPoolClassifier(BertModel-like) and ViTForImageClassification (the plain merger handles any)"
        )
    fam = FAMILIES[family]
    m = len(masks)
    srcs = list(members) if members is not None else [base] * m
    if len(srcs) != m:
        raise ValueError(f"hydra merger: {m} masks but {len(srcs)} member models")
    heads_per_block = get_adapter(srcs[0]).heads_per_block()
    for i, mask in enumerate(masks):
        mask.validate(heads_per_block, allow_empty_blocks=True, where=f"hydra merger: mask {i}")
    parts = [_parts(s, family) for s in srcs]
    config = (srcs[0].encoder if family == "bert" else srcs[0].vit).config
    depth = len(parts[0][1])
    shared = {"embeddings": _same_module([p[0] for p in parts]), "head": _same_module([p[3] for p in parts])}
    if family == "vit":
        shared["final_norm"] = _same_module([p[2] for p in parts])
    for i in range(depth):
        shared[f"layer.{i}.norm1"] = _same_module([_get(p[1][i], fam.norm1) for p in parts])
        shared[f"layer.{i}.norm2"] = _same_module([_get(p[1][i], fam.norm2) for p in parts])
    hidden = config.intermediate_size
    unit_keep = None
    if mlp_mode == "average":
        mlp_hidden = [[hidden]] * depth
    elif mlp_mode == "grouped":
        mlp_hidden = [[hidden] * m] * depth
    else:
        k = max(1, int(round((1.0 / m if mlp_keep_ratio is None else mlp_keep_ratio) * hidden)))
        unit_keep = []
        for p in parts:
            per = []
            for layer in p[1]:
                score = _get(layer, fam.fc1).weight.norm(dim=1) * _get(layer, fam.fc2).weight.norm(dim=0)
                per.append(torch.sort(torch.argsort(-score.double(), stable=True)[:k]).values)
            unit_keep.append(per)
        mlp_hidden = [[k] * m] * depth
    if config.hidden_act not in ACT_NAMES:
        raise NotImplementedError(f"hydra merger: activation '{config.hidden_act}' is not supported")
    spec = HydraHFSpec(
        members=m,
        family=family,
        encoder_config=config.to_dict(),
        num_classes=parts[0][3].out_features,
        head_dim=get_adapter(srcs[0]).head_dim(0),
        heads=[[mask.num_kept()[b] for mask in masks] for b in range(depth)],
        mlp_hidden=mlp_hidden,
        mlp_mode=mlp_mode,
        act=ACT_NAMES[config.hidden_act],
        eps=config.layer_norm_eps,
        pad_token_id=getattr(srcs[0], "pad_token_id", 0),
        shared=shared,
    )
    model = HydraHF(spec)
    _fill(model, srcs, parts, fam, masks, unit_keep)
    model.mlp_kept = unit_keep
    return model.eval()


@torch.no_grad()
def _fill(model: HydraHF, srcs, parts, fam: _Family, masks, unit_keep) -> None:
    for i, emb in enumerate(model.embeddings):
        emb.load_state_dict(parts[i][0].state_dict())
    if isinstance(model.head, GroupedLinear):
        for i, p in enumerate(parts):
            model.head.set_member(i, p[3].weight, p[3].bias)
    else:
        model.head.load_state_dict(parts[0][3].state_dict())
    if not isinstance(model.final_norm, nn.Identity):
        _fill_norm(model.final_norm, [p[2] for p in parts])
    adapters = [get_adapter(s) for s in srcs]
    for b, layer in enumerate(model.layers):
        src_layers = [p[1][b] for p in parts]
        _fill_norm(layer.norm1, [_get(x, fam.norm1) for x in src_layers])
        _fill_norm(layer.norm2, [_get(x, fam.norm2) for x in src_layers])
        fill_attention(layer.attn, adapters, masks, b)
        fc1s = [_get(x, fam.fc1) for x in src_layers]
        fc2s = [_get(x, fam.fc2) for x in src_layers]
        if isinstance(layer.mlp, SharedMLP):
            for dst, srcs_ in ((layer.mlp.fc1, fc1s), (layer.mlp.fc2, fc2s)):
                dst.weight.copy_(torch.stack([f.weight for f in srcs_]).mean(0))
                dst.bias.copy_(torch.stack([f.bias for f in srcs_]).mean(0))
        else:
            for i, (f1, f2) in enumerate(zip(fc1s, fc2s)):
                units = unit_keep[i][b] if unit_keep is not None else torch.arange(f1.out_features)
                layer.mlp.fc1.set_member(i, f1.weight[units], f1.bias[units])
                layer.mlp.fc2.set_member(i, f2.weight[:, units], f2.bias)
