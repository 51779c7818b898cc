"""Hydra for BERT-style text classifiers (transformers BertModel inside a MeanPoolClassifier).

Same fusion as the ViT version: member streams [M, B, T, D], grouped Q/K/V, one attention call
(with the padding mask), grouped output projection; BERT's blocks are post-norm:
x = LN1(x + attn(x)); x = LN2(x + mlp(x)). The embeddings run once when members share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from compressor.adapters import get_adapter
from compressor.masks import HeadMask
from mergers.hydra.build import _fill_norm, _same_module
from mergers.hydra.layers import GroupedLinear, HydraAttention, HydraMLP, MemberLayerNorm, SharedMLP
from mergers.hydra.model import ACTIVATIONS, HydraOutput

ACT_NAMES = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


@dataclass
class HydraBertSpec:
    members: int
    encoder_config: dict  # the BertConfig, to rebuild the embeddings
    num_classes: int
    pad_token_id: int
    head_dim: int
    heads: list[list[int]]
    mlp_hidden: list[list[int]]
    mlp_mode: str = "average"
    act: str = "gelu"
    eps: float = 1e-12
    shared: dict[str, bool] = field(default_factory=dict)
    kind: str = "hydra_bert"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HydraBertSpec:
        return cls(**d)


def _norm(spec: HydraBertSpec, name: str, dim: int) -> nn.Module:
    if spec.shared.get(name, True):
        return nn.LayerNorm(dim, eps=spec.eps)
    return MemberLayerNorm(spec.members, dim, eps=spec.eps)


class HydraBertLayer(nn.Module):
    def __init__(self, spec: HydraBertSpec, index: int, dim: int) -> None:
        super().__init__()
        p = f"layer.{index}."
        self.attn = HydraAttention(dim, spec.heads[index], spec.head_dim)
        self.norm1 = _norm(spec, p + "norm1", dim)
        act = ACTIVATIONS[spec.act]()
        hidden = spec.mlp_hidden[index]
        self.mlp = SharedMLP(dim, hidden[0], act) if spec.mlp_mode == "average" else HydraMLP(dim, hidden, act)
        self.norm2 = _norm(spec, p + "norm2", dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, key_mask))
        return self.norm2(x + self.mlp(x))


class HydraBert(nn.Module):
    """M BERT-style classifiers in one module: input ids [B, L] -> HydraOutput."""

    def __init__(self, spec: HydraBertSpec) -> None:
        super().__init__()
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertEmbeddings

        self.spec = spec
        self.members = spec.members
        config = BertConfig(**spec.encoder_config)
        dim = config.hidden_size
        n_emb = 1 if spec.shared.get("embeddings", True) else spec.members
        self.embeddings = nn.ModuleList(BertEmbeddings(config) for _ in range(n_emb))
        self.layers = nn.ModuleList(HydraBertLayer(spec, i, dim) for i in range(len(spec.heads)))
        if spec.shared.get("head", True):
            self.head = nn.Linear(dim, spec.num_classes)
        else:
            self.head = GroupedLinear([dim] * spec.members, [spec.num_classes] * spec.members)

    def forward_member_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        key_mask = input_ids != self.spec.pad_token_id
        if len(self.embeddings) == 1:
            e = self.embeddings[0](input_ids=input_ids)
            x = e.unsqueeze(0).expand(self.members, *e.shape)
        else:  # fine-tuned members with their own embeddings: a lookup each, before the fused blocks
            x = torch.stack([emb(input_ids=input_ids) for emb in self.embeddings])
        for layer in self.layers:
            x = layer(x, key_mask)
        m = key_mask[None, :, :, None].to(x.dtype)
        pooled = (x * m).sum(2) / m.sum(2).clamp_min(1.0)  # [M, B, D]
        return self.head(pooled)

    def forward(self, input_ids: torch.Tensor) -> HydraOutput:
        logits = self.forward_member_logits(input_ids)
        return HydraOutput(logits, F.softmax(logits, dim=-1).mean(dim=0))


def is_bert_classifier(model: nn.Module) -> bool:
    from compressor.text import MeanPoolClassifier

    enc = getattr(model, "encoder", None)
    return isinstance(model, MeanPoolClassifier) and hasattr(enc, "embeddings") and hasattr(enc, "encoder")


def build_hydra_bert(
    base: nn.Module,
    masks: Sequence[HeadMask],
    members: Sequence[nn.Module] | None = None,
    mlp_mode: str = "average",
    mlp_keep_ratio: float | None = None,
) -> HydraBert:
    """Fuse M MeanPoolClassifier(BertModel) members (base + masks, or fine-tuned members)."""
    m = len(masks)
    srcs = list(members) if members is not None else [base] * m
    if len(srcs) != m:
        raise ValueError(f"hydra merger: {m} masks but {len(srcs)} member models")
    heads_per_block = get_adapter(srcs[0]).heads_per_block()
    for i, mask in enumerate(masks):
        mask.validate(heads_per_block, allow_empty_blocks=True, where=f"hydra merger: mask {i}")
    encs = [s.encoder for s in srcs]
    cfg = encs[0].config
    layers = [[e.encoder.layer[i] for e in encs] for i in range(cfg.num_hidden_layers)]
    shared = {"embeddings": _same_module([e.embeddings for e in encs]), "head": _same_module([s.head for s in srcs])}
    for i, ls in enumerate(layers):
        shared[f"layer.{i}.norm1"] = _same_module([x.attention.output.LayerNorm for x in ls])
        shared[f"layer.{i}.norm2"] = _same_module([x.output.LayerNorm for x in ls])
    hidden = cfg.intermediate_size
    unit_keep = None
    if mlp_mode == "average":
        mlp_hidden = [[hidden]] * cfg.num_hidden_layers
    elif mlp_mode == "grouped":
        mlp_hidden = [[hidden] * m] * cfg.num_hidden_layers
    else:
        k = max(1, int(round((1.0 / m if mlp_keep_ratio is None else mlp_keep_ratio) * hidden)))
        unit_keep = []
        for s in srcs:
            per = []
            for layer in s.encoder.encoder.layer:
                score = layer.intermediate.dense.weight.norm(dim=1) * layer.output.dense.weight.norm(dim=0)
                per.append(torch.sort(torch.argsort(-score.double(), stable=True)[:k]).values)
            unit_keep.append(per)
        mlp_hidden = [[k] * m] * cfg.num_hidden_layers
    if cfg.hidden_act not in ACT_NAMES:
        raise NotImplementedError(f"hydra merger: activation '{cfg.hidden_act}' is not supported")
    spec = HydraBertSpec(
        members=m, encoder_config=cfg.to_dict(), num_classes=srcs[0].head.out_features,
        pad_token_id=srcs[0].pad_token_id, head_dim=get_adapter(srcs[0]).head_dim(0),
        heads=[[mask.num_kept()[b] for mask in masks] for b in range(cfg.num_hidden_layers)],
        mlp_hidden=mlp_hidden, mlp_mode=mlp_mode, act=ACT_NAMES[cfg.hidden_act], eps=cfg.layer_norm_eps,
        shared=shared,
    )
    model = HydraBert(spec)
    _fill_bert(model, srcs, masks, unit_keep)
    model.mlp_kept = unit_keep
    return model.eval()


@torch.no_grad()
def _fill_bert(model: HydraBert, srcs, masks, unit_keep) -> None:
    for i, emb in enumerate(model.embeddings):
        emb.load_state_dict(srcs[i].encoder.embeddings.state_dict())
    if isinstance(model.head, GroupedLinear):
        for i, s in enumerate(srcs):
            model.head.set_member(i, s.head.weight, s.head.bias)
    else:
        model.head.load_state_dict(srcs[0].head.state_dict())
    adapters = [get_adapter(s) for s in srcs]
    for b, layer in enumerate(model.layers):
        src_layers = [s.encoder.encoder.layer[b] for s in srcs]
        _fill_norm(layer.norm1, [x.attention.output.LayerNorm for x in src_layers])
        _fill_norm(layer.norm2, [x.output.LayerNorm for x in src_layers])
        for i, (ad, mask) in enumerate(zip(adapters, masks)):
            w = ad.head_weights(b)
            keep = torch.as_tensor(mask.kept_indices(b), dtype=torch.long)
            d = w.o.shape[0]
            layer.attn.qkv.set_member(i, torch.cat([t[keep].reshape(-1, d) for t in (w.q, w.k, w.v)]),
                                      torch.cat([t[keep].reshape(-1) for t in (w.q_bias, w.k_bias, w.v_bias)]))
            layer.attn.proj.set_member(i, w.o[:, keep].reshape(d, -1), w.o_bias)
        fc1s = [x.intermediate.dense for x in src_layers]
        fc2s = [x.output.dense for x in src_layers]
        if isinstance(layer.mlp, SharedMLP):
            layer.mlp.fc1.weight.copy_(torch.stack([f.weight for f in fc1s]).mean(0))
            layer.mlp.fc1.bias.copy_(torch.stack([f.bias for f in fc1s]).mean(0))
            layer.mlp.fc2.weight.copy_(torch.stack([f.weight for f in fc2s]).mean(0))
            layer.mlp.fc2.bias.copy_(torch.stack([f.bias for f in fc2s]).mean(0))
        else:
            for i, (f1, f2) in enumerate(zip(fc1s, fc2s)):
                units = unit_keep[i][b] if unit_keep is not None else torch.arange(f1.out_features)
                layer.mlp.fc1.set_member(i, f1.weight[units], f1.bias[units])
                layer.mlp.fc2.set_member(i, f2.weight[:, units], f2.bias)
