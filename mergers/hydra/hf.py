"""Hydra for transformers models: BERT-style and CLIP-text classifiers, ViT and CLIP-vision classifiers.

Same fusion as the timm version: member streams [M, B, T, D], grouped Q/K/V, one attention call
(with the padding mask for text, and the causal mask for CLIP text), grouped output projection.
BERT blocks are post-norm (x = LN1(x + attn(x)); x = LN2(x + mlp(x))), ViT and CLIP blocks
pre-norm. Embeddings run once when the members share them. Supported:
`MeanPoolClassifier(BertModel-like)`, `MeanPoolClassifier(CLIPTextModel)`,
`ViTForImageClassification`, `CLIPForImageClassification` and `compressor.clip.ZeroShotCLIP`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from compressor.adapters import get_adapter
from compressor.masks import HeadMask
from mergers.hydra.build import _fill_norm, _same_module, fill_attention, fill_mlp, top_units
from mergers.hydra.layers import (
    GroupedLinear,
    HydraAttention,
    HydraMLP,
    MemberLayerNorm,
    SharedMLP,
    run_in_chunks,
    widest_member_activation,
)
from mergers.hydra.model import ACTIVATIONS, INFERENCE_CHUNK_BYTES, HydraOutput

ACT_NAMES = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "relu": "relu",
    "silu": "silu",
}


@dataclass(frozen=True)
class _Family:
    """Where one transformers family keeps its parts, and how it embeds, masks and pools.

    Paths are attribute paths: model-level ones from the classifier, block-level ones from a layer.
    """

    name: str
    config: str  # model-level path of the encoder's config
    embeddings: str
    layers: str
    embed_norm: str | None  # a LayerNorm right after the embeddings (CLIP vision's pre_layrnorm)
    final_norm: str | None
    classifier: str
    config_class: str  # "module:Class" of the encoder's config and of its embeddings
    embeddings_class: str
    pre_norm: bool
    norm1: str
    norm2: str
    fc1: str
    fc2: str
    text: bool  # token ids in (padding = pad_token_id), else images
    causal: bool = False
    pool: str = "cls"  # cls | mean_tokens (non-padding tokens) | mean_patches (every token after the first)
    zero_shot: bool = False  # classifier = projection, then scaled cosine similarity to fixed class embeddings


_BERT = "transformers.models.bert.modeling_bert"
_VIT = "transformers.models.vit.modeling_vit"
_CLIP = "transformers.models.clip.modeling_clip"
_CLIP_LAYER = dict(pre_norm=True, norm1="layer_norm1", norm2="layer_norm2", fc1="mlp.fc1", fc2="mlp.fc2")
_CLIP_VISION = dict(config_class="transformers:CLIPVisionConfig", embeddings_class=f"{_CLIP}:CLIPVisionEmbeddings")

FAMILIES = {
    "bert": _Family(
        name="bert", config="encoder.config", embeddings="encoder.embeddings", layers="encoder.encoder.layer",
        embed_norm=None, final_norm=None, classifier="head",
        config_class="transformers:BertConfig", embeddings_class=f"{_BERT}:BertEmbeddings",
        pre_norm=False, norm1="attention.output.LayerNorm", norm2="output.LayerNorm",
        fc1="intermediate.dense", fc2="output.dense", text=True, pool="mean_tokens",
    ),
    "vit": _Family(
        name="vit", config="vit.config", embeddings="vit.embeddings", layers="vit.layers",
        embed_norm=None, final_norm="vit.layernorm", classifier="classifier",
        config_class="transformers:ViTConfig", embeddings_class=f"{_VIT}:ViTEmbeddings",
        pre_norm=True, norm1="layernorm_before", norm2="layernorm_after", fc1="mlp.fc1", fc2="mlp.fc2", text=False,
    ),
    "clip_vision": _Family(
        name="clip_vision", config="vision_model.config", embeddings="vision_model.embeddings",
        layers="vision_model.encoder.layers", embed_norm="vision_model.pre_layrnorm", final_norm=None,
        classifier="classifier", **_CLIP_VISION, **_CLIP_LAYER, text=False, pool="mean_patches",
    ),
    "clip_text": _Family(
        name="clip_text", config="encoder.config", embeddings="encoder.embeddings", layers="encoder.encoder.layers",
        embed_norm=None, final_norm="encoder.final_layer_norm", classifier="head",
        config_class="transformers:CLIPTextConfig", embeddings_class=f"{_CLIP}:CLIPTextEmbeddings",
        **_CLIP_LAYER, text=True, causal=True, pool="mean_tokens",
    ),
    "clip_zero_shot": _Family(
        name="clip_zero_shot", config="encoder.config", embeddings="encoder.embeddings",
        layers="encoder.encoder.layers", embed_norm="encoder.pre_layrnorm", final_norm="encoder.post_layernorm",
        classifier="projection", **_CLIP_VISION, **_CLIP_LAYER, text=False, zero_shot=True,
    ),
}  # fmt: skip


def _get(mod: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        mod = getattr(mod, part)
    return mod


def _import(name: str):
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


def family_of(model: nn.Module) -> str | None:
    """The FAMILIES key of a supported classifier, or None."""
    from compressor.clip import ZeroShotCLIP
    from compressor.text import MeanPoolClassifier

    try:
        from transformers import CLIPForImageClassification, CLIPTextModel, ViTForImageClassification
    except ImportError:  # pragma: no cover
        return None
    if isinstance(model, MeanPoolClassifier):
        if isinstance(model.encoder, CLIPTextModel):
            return "clip_text"
        if hasattr(model.encoder, "embeddings") and hasattr(getattr(model.encoder, "encoder", None), "layer"):
            return "bert"
        return None
    if isinstance(model, ViTForImageClassification):
        return "vit"
    if isinstance(model, CLIPForImageClassification):
        return "clip_vision"
    if isinstance(model, ZeroShotCLIP):
        return "clip_zero_shot"
    return None


@dataclass
class _Parts:
    """The parts of one supported model that the fused model copies."""

    embeddings: nn.Module
    layers: list[nn.Module]
    embed_norm: nn.Module | None
    final_norm: nn.Module | None
    classifier: nn.Linear


def _parts(model: nn.Module, fam: _Family) -> _Parts:
    maybe = lambda path: None if path is None else _get(model, path)  # noqa: E731
    return _Parts(
        _get(model, fam.embeddings),
        list(_get(model, fam.layers)),
        maybe(fam.embed_norm),
        maybe(fam.final_norm),
        _get(model, fam.classifier),
    )


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
    projection_dim: int = 0  # zero-shot CLIP: the head projects to this width, then compares to class embeddings

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

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.norm1(x), attn_mask)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, attn_mask))
        return self.norm2(x + self.mlp(x))


class HydraHF(nn.Module):
    """M transformers classifiers in one module: token ids [B, L] or images [B, C, H, W] -> HydraOutput.

    `inference_chunk_bytes`: as for HydraViT, CPU inference runs large batches in chunks.
    """

    inference_chunk_bytes: int | None = INFERENCE_CHUNK_BYTES

    def __init__(self, spec: HydraHFSpec) -> None:
        super().__init__()
        self.spec = spec
        self.members = spec.members
        fam = FAMILIES[spec.family]
        config = _import(fam.config_class)(**spec.encoder_config)
        make_emb = _import(fam.embeddings_class)
        dim = config.hidden_size
        n = lambda name: 1 if spec.shared.get(name, True) else spec.members  # noqa: E731
        self.embeddings = nn.ModuleList(make_emb(config) for _ in range(n("embeddings")))
        self.embed_norm = _norm(spec, "embed_norm", dim) if fam.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(HydraHFLayer(spec, i, dim) for i in range(len(spec.heads)))
        self.final_norm = _norm(spec, "final_norm", dim) if fam.final_norm else nn.Identity()
        out, bias = (spec.projection_dim, False) if fam.zero_shot else (spec.num_classes, True)
        if spec.shared.get("head", True):
            self.head = nn.Linear(dim, out, bias=bias)
        else:
            self.head = GroupedLinear([dim] * spec.members, [out] * spec.members, bias=bias)
        if fam.zero_shot:
            self.register_buffer("class_embeds", torch.zeros(spec.num_classes, spec.projection_dim))
            self.register_buffer("logit_scale", torch.ones(()))
        self._widest = widest_member_activation(self.layers)
        self._image_tokens = 0 if fam.text else (config.image_size // config.patch_size) ** 2 + 1

    def _embed(self, inputs: torch.Tensor) -> torch.Tensor:
        text = FAMILIES[self.spec.family].text
        call = (lambda e: e(input_ids=inputs)) if text else (lambda e: e(inputs))
        if len(self.embeddings) == 1:
            e = call(self.embeddings[0])
            return e.unsqueeze(0).expand(self.members, *e.shape)
        return torch.stack([call(emb) for emb in self.embeddings])  # fine-tuned members: a lookup each

    def _attention_mask(self, key_mask: torch.Tensor | None, t: int) -> torch.Tensor | None:
        """Boolean [B or 1, 1, T, T] (True = may attend), or None for full attention."""
        if not FAMILIES[self.spec.family].causal:
            return None if key_mask is None else key_mask[:, None, None, :]
        causal = torch.ones(t, t, dtype=torch.bool, device=key_mask.device).tril()
        return causal & key_mask[:, None, None, :]  # the mask CLIPTextModel builds from its attention_mask

    def forward_member_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        tokens = self._image_tokens or inputs.shape[-1]
        per_sample = tokens * self._widest * self.head.weight.element_size()
        return run_in_chunks(self._member_logits, inputs, per_sample, self.inference_chunk_bytes)

    def _member_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        fam = FAMILIES[self.spec.family]
        key_mask = inputs != self.spec.pad_token_id if fam.text else None
        x = self.embed_norm(self._embed(inputs))
        attn_mask = self._attention_mask(key_mask, x.shape[2])
        for layer in self.layers:
            x = layer(x, attn_mask)
        if fam.pool == "cls":
            pooled = self.final_norm(x[:, :, 0])  # a per-token norm: pooling first is the same, and cheaper
        elif fam.pool == "mean_patches":
            pooled = self.final_norm(x)[:, :, 1:].mean(2)
        else:
            m = key_mask[None, :, :, None].to(x.dtype)
            pooled = (self.final_norm(x) * m).sum(2) / m.sum(2).clamp_min(1.0)  # [M, B, D]
        out = self.head(pooled)
        if not fam.zero_shot:
            return out
        return self.logit_scale * (out / out.norm(dim=-1, keepdim=True)) @ self.class_embeds.t()

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
            "MeanPoolClassifier(BertModel-like or CLIPTextModel), ViTForImageClassification, "
            "CLIPForImageClassification and ZeroShotCLIP (the plain merger handles any)"
        )
    fam = FAMILIES[family]
    m = len(masks)
    srcs = list(members) if members is not None else [base] * m
    if len(srcs) != m:
        raise ValueError(f"hydra merger: {m} masks but {len(srcs)} member models")
    heads_per_block = get_adapter(srcs[0]).heads_per_block()
    for i, mask in enumerate(masks):
        mask.validate(heads_per_block, allow_empty_blocks=True, where=f"hydra merger: mask {i}")
    parts = [_parts(s, fam) for s in srcs]
    config = _get(srcs[0], fam.config)
    depth = len(parts[0].layers)
    shared = {
        "embeddings": _same_module([p.embeddings for p in parts]),
        "head": _same_module([p.classifier for p in parts]),
    }
    for name in ("embed_norm", "final_norm"):
        if getattr(fam, name):
            shared[name] = _same_module([getattr(p, name) for p in parts])
    for i in range(depth):
        shared[f"layer.{i}.norm1"] = _same_module([_get(p.layers[i], fam.norm1) for p in parts])
        shared[f"layer.{i}.norm2"] = _same_module([_get(p.layers[i], fam.norm2) for p in parts])
    hidden = config.intermediate_size
    unit_keep = None
    if mlp_mode == "average":
        mlp_hidden = [[hidden]] * depth
    elif mlp_mode == "grouped":
        mlp_hidden = [[hidden] * m] * depth
    else:
        k = max(1, int(round((1.0 / m if mlp_keep_ratio is None else mlp_keep_ratio) * hidden)))
        unit_keep = [
            [
                top_units(_get(layer, fam.fc1).weight.norm(dim=1) * _get(layer, fam.fc2).weight.norm(dim=0), k)
                for layer in p.layers
            ]
            for p in parts
        ]
        mlp_hidden = [[k] * m] * depth
    if config.hidden_act not in ACT_NAMES:
        raise NotImplementedError(f"hydra merger: activation '{config.hidden_act}' is not supported")
    head_out = parts[0].classifier.out_features
    if fam.zero_shot and not all(
        torch.equal(s.class_embeds, srcs[0].class_embeds) and torch.equal(s.logit_scale, srcs[0].logit_scale)
        for s in srcs[1:]
    ):
        raise ValueError("hydra merger: zero-shot CLIP members must share their class embeddings and logit scale")
    spec = HydraHFSpec(
        members=m,
        family=family,
        encoder_config=config.to_dict(),
        num_classes=srcs[0].class_embeds.shape[0] if fam.zero_shot else head_out,
        projection_dim=head_out if fam.zero_shot else 0,
        head_dim=get_adapter(srcs[0]).head_dim(0),
        heads=[[mask.num_kept()[b] for mask in masks] for b in range(depth)],
        mlp_hidden=mlp_hidden,
        mlp_mode=mlp_mode,
        act=ACT_NAMES[config.hidden_act],
        eps=config.layer_norm_eps,
        pad_token_id=getattr(srcs[0], "pad_token_id", 0),
        shared=shared,
    )
    model = HydraHF(spec).to(dtype=parts[0].classifier.weight.dtype)
    _fill(model, srcs, parts, fam, masks, unit_keep)
    model.mlp_kept = unit_keep
    return model.eval()


@torch.no_grad()
def _fill(model: HydraHF, srcs, parts: list[_Parts], fam: _Family, masks, unit_keep) -> None:
    for i, emb in enumerate(model.embeddings):
        emb.load_state_dict(parts[i].embeddings.state_dict())
    if isinstance(model.head, GroupedLinear):
        for i, p in enumerate(parts):
            model.head.set_member(i, p.classifier.weight, p.classifier.bias)
    else:
        model.head.load_state_dict(parts[0].classifier.state_dict())
    if fam.zero_shot:
        model.class_embeds.copy_(srcs[0].class_embeds)
        model.logit_scale.copy_(srcs[0].logit_scale)
    for name in ("embed_norm", "final_norm"):
        if getattr(fam, name):
            _fill_norm(getattr(model, name), [getattr(p, name) for p in parts])
    adapters = [get_adapter(s) for s in srcs]
    for b, layer in enumerate(model.layers):
        src_layers = [p.layers[b] for p in parts]
        _fill_norm(layer.norm1, [_get(x, fam.norm1) for x in src_layers])
        _fill_norm(layer.norm2, [_get(x, fam.norm2) for x in src_layers])
        fill_attention(layer.attn, adapters, masks, b)
        fc1s, fc2s = [_get(x, fam.fc1) for x in src_layers], [_get(x, fam.fc2) for x in src_layers]
        fill_mlp(layer.mlp, fc1s, fc2s, unit_keep, b)
