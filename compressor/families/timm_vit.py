"""timm VisionTransformer: fused `qkv` Linear, `num_heads`/`head_dim`/`attn_dim`, `proj`, `Mlp`.

The architecture is described by timm's own arguments, derived from the model itself
(`timm.create_model(model_name, **kwargs)` rebuilds it), and checked against a rebuilt block.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from compressor.core.errors import ExportError, UnsupportedModelError
from compressor.core.registry import register
from compressor.families.base import Family
from compressor.families.parts import AttentionSlots, BlockParts, MlpSlots, Slot


def _vit_class() -> type:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer


def _is(module: nn.Module | None, cls: type = nn.Identity) -> bool:
    return isinstance(module, cls)


class TimmStem(nn.Module):
    """A ViT's patch embedding, class/register tokens, position embedding and pre-norm:
    images [B, C, H, W] -> tokens [B, T, D] (timm's own `_pos_embed` code)."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        for name in ("patch_embed", "pos_drop", "patch_drop", "norm_pre"):
            setattr(self, name, copy.deepcopy(getattr(vit, name)))
        for name in ("cls_token", "reg_token", "pos_embed"):
            value = getattr(vit, name)
            setattr(self, name, None if value is None else nn.Parameter(value.detach().clone()))
        self.dynamic_img_size = bool(vit.dynamic_img_size)
        self.no_embed_class = bool(vit.no_embed_class)
        self.num_prefix_tokens = int(vit.num_prefix_tokens)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        x = _vit_class()._pos_embed(self, self.patch_embed(x))
        return self.norm_pre(self.patch_drop(x)), None

    def tokens_per_sample(self, x: torch.Tensor) -> int:
        patch = self.patch_embed.patch_size
        return self.num_prefix_tokens + (x.shape[-2] // patch[0]) * (x.shape[-1] // patch[1])


class TimmHead(nn.Module):
    """A ViT's final norm, pooling (token, avg, attention pooling, ...), fc_norm and classifier:
    tokens [N, T, D] -> logits [N, C] (timm's own `pool` code)."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        for name in ("norm", "attn_pool", "fc_norm", "head_drop", "head"):
            setattr(self, name, copy.deepcopy(getattr(vit, name)))
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = int(vit.num_prefix_tokens)
        self.pool_include_prefix = bool(vit.pool_include_prefix)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = _vit_class().pool(self, self.norm(x))
        return self.head(self.head_drop(self.fc_norm(x)))

    def feature_layer(self) -> nn.Module:
        """The layer whose input is the pooled feature (feature-based OOD scores read it)."""
        return self.head


@register("family", "timm_vit")
class TimmViT(Family):
    """timm `VisionTransformer` with timm's standard `Attention` and `Mlp` blocks."""

    name = "timm_vit"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        for i, blk in enumerate(model.blocks):
            attn = blk.attn
            if not (hasattr(attn, "qkv") and hasattr(attn, "proj")):
                raise UnsupportedModelError(
                    f"timm ViT block {i}: attention {type(attn).__name__} has no fused qkv/proj"
                )
            if not _is(getattr(attn, "norm", None)):
                raise UnsupportedModelError(
                    f"timm ViT block {i}: scale_attn_norm mixes heads before proj; head gating would not be exact"
                )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        try:
            return isinstance(model, _vit_class())
        except ImportError:  # pragma: no cover
            return False

    # --- structure --------------------------------------------------------------------------
    def blocks(self) -> Sequence[nn.Module]:
        return self.model.blocks

    def attention(self, block: int) -> AttentionSlots:
        attn = self.model.blocks[block].attn
        gate = (Slot(attn, "gate"),) if getattr(attn, "gate", None) is not None else ()
        return AttentionSlots(qkv=(Slot(attn, "qkv"),), o=Slot(attn, "proj"), head_rows=gate)

    def head_dim(self, block: int) -> int:
        return int(self.model.blocks[block].attn.head_dim)

    def set_head_count(self, block: int, heads: int) -> None:
        attn = self.model.blocks[block].attn
        attn.num_heads = heads
        attn.attn_dim = heads * int(attn.head_dim)  # timm >= 1.0.23 reshapes by attn_dim

    def mlp(self, block: int) -> MlpSlots:
        mlp = self.model.blocks[block].mlp
        return MlpSlots(fc1=Slot(mlp, "fc1"), act=mlp.act, fc2=Slot(mlp, "fc2"))

    def block_parts(self, block: int) -> BlockParts:
        blk = self.model.blocks[block]
        attn, mlp = blk.attn, blk.mlp
        return BlockParts(
            norm1=blk.norm1,
            norm2=blk.norm2,
            ls1=None if _is(blk.ls1) else blk.ls1.gamma,
            ls2=None if _is(blk.ls2) else blk.ls2.gamma,
            q_norm=None if _is(attn.q_norm) else attn.q_norm,
            k_norm=None if _is(attn.k_norm) else attn.k_norm,
            attn_drop=float(attn.attn_drop.p),
            proj_drop=float(attn.proj_drop.p),
            mlp_act_drop=float(mlp.drop1.p),
            mlp_drop=float(mlp.drop2.p),
        )

    def activation(self) -> str:
        act = self.model.blocks[0].mlp.act
        if isinstance(act, nn.GELU):
            return "gelu_tanh" if act.approximate == "tanh" else "gelu"
        for name, cls in (("relu", nn.ReLU), ("silu", nn.SiLU)):
            if isinstance(act, cls):
                return name
        raise UnsupportedModelError(f"timm ViT: MLP activation {type(act).__name__} is not supported")

    def classifier(self) -> nn.Module:
        return self.model.head

    def input_size(self) -> tuple[int, ...]:
        pe = self.model.patch_embed
        return (int(pe.proj.in_channels), *map(int, pe.img_size))

    # --- standard blocks, stem and head ----------------------------------------------------
    def standard_block_problems(self) -> list[str]:
        from timm.layers import LayerNorm, Mlp

        where: dict[str, list[int]] = {}  # problem -> blocks that have it
        for i, blk in enumerate(self.model.blocks):
            attn, mlp = blk.attn, blk.mlp
            found = []
            if getattr(attn, "gate", None) is not None:
                found.append("gated attention")
            if type(mlp) is not Mlp or not _is(mlp.norm):
                found.append(f"MLP {type(mlp).__name__} (timm Mlp without scale_mlp_norm expected)")
            norms = [blk.norm1, blk.norm2] + [n for n in (attn.q_norm, attn.k_norm) if not _is(n)]
            found += [
                f"norm {type(n).__name__} (LayerNorm expected)"
                for n in norms
                if type(n) not in (LayerNorm, nn.LayerNorm)
            ]
            for problem in dict.fromkeys(found):
                where.setdefault(problem, []).append(i)
        problems = [f"{p} in blocks {', '.join(map(str, blocks))}" for p, blocks in where.items()]
        if not _is(self.model.patch_embed.norm):
            problems.append("a norm inside patch_embed")
        try:
            self.activation()
        except UnsupportedModelError as e:
            problems.append(str(e))
        return problems

    def stem_and_head(self) -> tuple[nn.Module, nn.Module]:
        return TimmStem(self.model), TimmHead(self.model)

    # --- export -----------------------------------------------------------------------------
    def standalone(self) -> dict:
        """`timm.create_model(**config["timm"])`, then each block's `attn` replaced by
        `timm.layers.Attention(dim, num_heads, attn_head_dim, **timm_attention, norm_layer=LayerNorm(eps))`
        and `mlp` by `timm.layers.Mlp(dim, mlp_hidden, act_layer, **timm_mlp)`: the README's snippet."""
        arch = self.describe()
        blk = self.model.blocks[0]
        return {
            "timm": {"model_name": arch["model_name"], **arch["kwargs"]},
            "timm_blocks": [
                {"num_heads": self.num_heads(b), "head_dim": self.head_dim(b), "mlp_hidden": w}
                for b, w in enumerate(self.mlp_widths())
            ],
            "timm_attention": {
                "qkv_bias": blk.attn.qkv.bias is not None,
                "qk_norm": not _is(blk.attn.q_norm),
                "proj_bias": blk.attn.proj.bias is not None,
            },
            "timm_mlp": {"bias": blk.mlp.fc1.bias is not None},
            "timm_norm_eps": float(blk.norm1.eps),
            "timm_act_layer": self.activation(),
        }

    def describe(self) -> dict:
        """timm.create_model arguments that rebuild this architecture (unpruned; the per-block
        head counts are recorded beside it by the merger)."""
        vit = self.model
        pe, blk = vit.patch_embed, vit.blocks[0]
        attn = blk.attn
        dim = int(vit.embed_dim)
        final_norm = not (_is(vit.norm) and _is(vit.fc_norm))
        drop_path = getattr(vit.blocks[-1].drop_path1, "drop_prob", 0.0)
        kwargs = {
            "img_size": list(pe.img_size),
            "patch_size": list(pe.patch_size),
            "in_chans": int(pe.proj.in_channels),
            "num_classes": int(vit.num_classes),
            "global_pool": vit.global_pool,
            "embed_dim": dim,
            "depth": len(vit.blocks),
            "num_heads": dim // int(attn.head_dim),
            "mlp_ratio": _ratio_for(max(self.mlp_widths()), dim),
            "qkv_bias": attn.qkv.bias is not None,
            "qk_norm": not _is(attn.q_norm),
            "proj_bias": attn.proj.bias is not None,
            "init_values": None if _is(blk.ls1) else 1.0,
            "class_token": vit.cls_token is not None,
            "no_embed_class": bool(vit.no_embed_class),
            "reg_tokens": int(vit.num_reg_tokens),
            "pos_embed": "learn" if vit.pos_embed is not None else "none",
            "pre_norm": not _is(vit.norm_pre),
            "final_norm": final_norm,
            "fc_norm": final_norm and not _is(vit.fc_norm),
            "pool_include_prefix": bool(vit.pool_include_prefix),
            "dynamic_img_size": bool(vit.dynamic_img_size),
            "drop_rate": float(vit.head_drop.p),
            "pos_drop_rate": float(vit.pos_drop.p),
            "patch_drop_rate": float(getattr(vit.patch_drop, "prob", 0.0)),
            "proj_drop_rate": float(attn.proj_drop.p),
            "attn_drop_rate": float(attn.attn_drop.p),
            "drop_path_rate": float(drop_path),
        }
        cfg = getattr(vit, "pretrained_cfg", None) or {}
        arch = {"model_name": cfg.get("architecture") or "vit_base_patch16_224", "kwargs": kwargs}
        self._check_rebuild(arch)
        return arch

    def _check_rebuild(self, arch: dict) -> None:
        """Refuse a description whose rebuilt model would differ in a way weights do not carry
        (a norm's eps, an activation): build one block of it and compare module settings."""
        rebuilt = self.empty(arch, depth=1)
        mine = _settings(self.model, upto_block=1)
        theirs = _settings(rebuilt, upto_block=1)
        if mine != theirs:
            diff = sorted(set(mine.items()) ^ set(theirs.items()))[:4]
            raise UnsupportedModelError(
                f"timm ViT: timm.create_model('{arch['model_name']}', ...) does not rebuild this model "
                f"(differs in {diff}); create it with timm.create_model so that its name describes it"
            )

    @classmethod
    def empty(cls, arch: dict, depth: int | None = None) -> nn.Module:
        """The architecture from timm's own arguments; only the architecture arguments `describe`
        writes are accepted (no checkpoint paths, no pretrained weights)."""
        import timm

        name, kwargs = arch.get("model_name"), arch.get("kwargs")
        if not (isinstance(name, str) and timm.is_model(name)):
            raise ExportError(f"arch.model_name: expected a timm model name, got {name!r}")
        if not isinstance(kwargs, dict):
            raise ExportError(f"arch.kwargs: expected a mapping, got {kwargs!r}")
        unknown = sorted(set(kwargs) - ARCH_KWARGS)
        if unknown:
            allowed = ", ".join(sorted(ARCH_KWARGS))
            raise ExportError(f"arch.kwargs.{unknown[0]}: not an architecture argument; expected one of {allowed}")
        kwargs = dict(kwargs)
        if depth is not None:
            kwargs["depth"] = depth
        try:
            return timm.create_model(name, pretrained=False, **kwargs).eval()
        except (TypeError, ValueError, AssertionError) as e:
            raise ExportError(f"arch.kwargs: timm.create_model('{name}', ...) refused them: {e}") from e


# the timm VisionTransformer arguments `TimmViT.describe` writes: an export may hold nothing else
ARCH_KWARGS = frozenset(
    "img_size patch_size in_chans num_classes global_pool embed_dim depth num_heads mlp_ratio qkv_bias qk_norm "
    "proj_bias init_values class_token no_embed_class reg_tokens pos_embed pre_norm final_norm fc_norm "
    "pool_include_prefix dynamic_img_size drop_rate pos_drop_rate patch_drop_rate proj_drop_rate attn_drop_rate "
    "drop_path_rate".split()
)


def _ratio_for(width: int, dim: int) -> float:
    """An mlp_ratio for which timm's int(dim * mlp_ratio) is exactly `width`."""
    ratio = width / dim
    return ratio if int(dim * ratio) == width else (width + 0.5) / dim


def _settings(vit: nn.Module, upto_block: int) -> dict[str, str]:
    """Module classes and the settings weights do not carry, by name (stem, head, first blocks)."""
    out = {}
    for name, mod in vit.named_modules():
        if name.startswith("blocks.") and int(name.split(".")[1]) >= upto_block:
            continue
        extra = [getattr(mod, a, None) for a in ("eps", "approximate", "p", "drop_prob", "normalized_shape")]
        out[name] = f"{type(mod).__name__}{extra}"
    return out
