"""Build a HydraModel from a base model, M head masks and (optionally) M fine-tuned members.

Everything model-specific is asked of the family layer; this file only decides what is shared,
which MLP units each member keeps, and copies weights into the fused layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from compressor.core.errors import OptionError, UnsupportedModelError
from compressor.core.masks import HeadMask
from compressor.families import Family, family_of
from compressor.surgery.mlp_units import with_top_units
from mergers.hydra.layers import HydraAttention, MemberAffine, MemberLayerNorm, SharedMLP
from mergers.hydra.model import MLP_MODES, HydraModel, HydraSpec


def _same(tensors: Sequence[torch.Tensor | None]) -> bool:
    first = tensors[0]
    if first is None:
        return all(t is None for t in tensors)
    return all(t is not None and t.shape == first.shape and torch.equal(t, first) for t in tensors[1:])


def _same_state(mods: Sequence[nn.Module]) -> bool:
    states = [m.state_dict() for m in mods]
    return all(s.keys() == states[0].keys() for s in states) and all(_same([s[k] for s in states]) for k in states[0])


@torch.no_grad()
def _fill_norm(dst: nn.Module, srcs: Sequence[nn.Module]) -> None:
    if isinstance(dst, MemberLayerNorm):
        for m, s in enumerate(srcs):
            dst.affine.weight[m].copy_(s.weight)
            dst.affine.bias[m].copy_(s.bias)
    elif isinstance(dst, nn.LayerNorm):
        dst.load_state_dict(srcs[0].state_dict())


@torch.no_grad()
def _fill_scale(dst: nn.Module, gammas: Sequence[torch.Tensor | None]) -> None:
    if isinstance(dst, MemberAffine):
        for m in range(dst.weight.shape[0]):
            dst.weight[m].copy_(gammas[m])


@torch.no_grad()
def fill_attention(attn: HydraAttention, families: Sequence[Family], masks: Sequence[HeadMask], block: int) -> None:
    """Copy every member's kept heads of `block` into the fused attention."""
    for i, (fam, mask) in enumerate(zip(families, masks)):
        w = fam.head_weights(block)
        keep = torch.as_tensor(mask.kept_indices(block), dtype=torch.long)
        d = w.o.shape[0]
        qkv_w = torch.cat([t[keep].reshape(-1, d) for t in (w.q, w.k, w.v)])
        qkv_b = None if w.q_bias is None else torch.cat([t[keep].reshape(-1) for t in (w.q_bias, w.k_bias, w.v_bias)])
        attn.qkv.set_member(i, qkv_w, qkv_b)
        attn.proj.set_member(i, w.o[:, keep].reshape(d, -1), w.o_bias)


@torch.no_grad()
def fill_mlp(
    mlp: nn.Module, families: Sequence[Family], unit_keep: list[list[torch.Tensor]] | None, block: int
) -> None:
    """Copy the members' MLPs of `block` into the fused one: averaged (SharedMLP) or per member
    (keeping `unit_keep[member][block]` hidden units when width-pruned)."""
    fc1s = [f.mlp(block).fc1.get() for f in families]
    fc2s = [f.mlp(block).fc2.get() for f in families]
    if isinstance(mlp, SharedMLP):
        for dst, srcs in ((mlp.fc1, fc1s), (mlp.fc2, fc2s)):
            dst.weight.copy_(torch.stack([f.weight for f in srcs]).mean(0))
            if dst.bias is not None:
                dst.bias.copy_(torch.stack([f.bias for f in srcs]).mean(0))
        return
    for i, (f1, f2) in enumerate(zip(fc1s, fc2s)):
        units = unit_keep[i][block] if unit_keep is not None else torch.arange(f1.out_features)
        mlp.fc1.set_member(i, f1.weight[units], None if f1.bias is None else f1.bias[units])
        mlp.fc2.set_member(i, f2.weight[:, units], f2.bias)


def _mlp_layout(
    families: Sequence[Family],
    masks: Sequence[HeadMask],
    mode: str,
    keep_ratio: float | None,
    calibration: Sequence[torch.Tensor] | None,
    trunk: int = 0,
) -> tuple[list[list[int]], list[list[torch.Tensor]] | None]:
    """Per block, the MLP widths of the fused model, and which units each member keeps ('pruned':
    the units the masks name, else each member's top `keep_ratio` (default 1/M) by its own scores;
    the first `trunk` blocks, shared whole by every member, keep every unit)."""
    widths, m = families[0].mlp_widths(), len(masks)
    if mode != "pruned" and any(mask.units is not None for mask in masks):
        raise OptionError(
            f"mlp: '{mode}' runs every member's full MLP and would discard the MLP units the masks name; "
            "use mlp: pruned (or masks without units)"
        )
    if keep_ratio is not None and all(mask.units is not None for mask in masks):
        raise OptionError("mlp_keep_ratio: the masks already name each member's MLP units (chosen by the prune step)")
    if mode == "average":
        return [[w] for w in widths], None
    if mode == "grouped":
        return [[w] * m for w in widths], None
    if not all(mask.units is not None for mask in masks):
        ratio = 1.0 / m if keep_ratio is None else float(keep_ratio)
        if not 0.0 < ratio <= 1.0:
            raise OptionError(f"mlp_keep_ratio: expected a number in (0, 1], got {ratio}")
        masks = [
            with_top_units(fam, [mask], ratio, calibration)[0].with_whole_blocks(trunk)
            for fam, mask in zip(families, masks)
        ]
    unit_keep = [[torch.as_tensor(mask.kept_units(b), dtype=torch.long) for b in range(len(widths))] for mask in masks]
    return [[len(unit_keep[i][b]) for i in range(m)] for b in range(len(widths))], unit_keep


def shared_trunk(families: Sequence[Family], masks: Sequence[HeadMask], stem_shared: bool) -> int:
    """How many leading blocks every member has whole (every head and MLP unit kept) and with the
    same weights, behind one shared stem: the fused model runs them once (at most depth - 1)."""
    if len(masks) < 2 or not stem_shared:
        return 0
    trunk = 0
    for b in range(families[0].num_blocks - 1):
        whole = all(bool(m.blocks[b].all()) and (m.units is None or bool(m.units[b].all())) for m in masks)
        if not whole or not _same_state([f.blocks()[b] for f in families]):
            break
        trunk += 1
    return trunk


def hydra_problems(family: Family) -> list[str]:
    """Why the fused model cannot reproduce this model (empty when it can)."""
    problems = list(family.standard_block_problems())
    if problems:
        return problems
    eps = {float(getattr(family.block_parts(b).norm1, "eps", -1)) for b in range(family.num_blocks)}
    if len(eps) > 1:
        problems.append(f"blocks with different norm eps {sorted(eps)}")
    return problems


def build_hydra(
    base: nn.Module,
    masks: Sequence[HeadMask],
    members: Sequence[nn.Module] | None = None,
    mlp_mode: str = "average",
    mlp_keep_ratio: float | None = None,
    calibration: Sequence[torch.Tensor] | None = None,
) -> HydraModel:
    """Fuse M members (base with each head mask, or the given fine-tuned members) into a HydraModel.

    mlp_mode: 'average' (paper: one MLP with the members' averaged weights), 'grouped' (each
    member's own MLP; exact in every case) or 'pruned' (each member's MLP width-pruned to
    `mlp_keep_ratio`, default 1/M, by that member's `mlp_unit_scores` on `calibration`).
    """
    if mlp_mode not in MLP_MODES:
        raise OptionError(f"mlp: expected one of {', '.join(MLP_MODES)}, got '{mlp_mode}'")
    m = len(masks)
    if m < 1:
        raise OptionError("hydra merger: needs at least one head mask")
    srcs = list(members) if members is not None else [base] * m
    if len(srcs) != m:
        raise OptionError(f"hydra merger: {m} masks but {len(srcs)} member models")
    families = [family_of(s) for s in srcs]
    problems = hydra_problems(families[0])
    if problems:
        raise UnsupportedModelError("hydra merger does not support: " + "; ".join(problems))
    heads_per_block = families[0].heads_per_block()
    for i, mask in enumerate(masks):
        mask.validate(heads_per_block, True, where=f"hydra merger: mask {i}", mlp_widths=families[0].mlp_widths())
    depth = families[0].num_blocks
    ends = [f.stem_and_head() for f in families]
    parts = [[f.block_parts(b) for f in families] for b in range(depth)]
    shared = {"stem": _same_state([e[0] for e in ends]), "head": _same_state([e[1] for e in ends])}
    for b in range(depth):
        for name in ("norm1", "norm2", "q_norm", "k_norm"):
            mods = [getattr(p, name) for p in parts[b]]
            if mods[0] is not None:
                shared[f"blocks.{b}.{name}"] = _same_state(mods)
        for name in ("ls1", "ls2"):
            if getattr(parts[b][0], name) is not None:
                shared[f"blocks.{b}.{name}"] = _same([getattr(p, name) for p in parts[b]])
    trunk = shared_trunk(families, masks, shared["stem"])
    mlp_hidden, unit_keep = _mlp_layout(families, masks, mlp_mode, mlp_keep_ratio, calibration, trunk)
    heads = [[mask.num_kept()[b] for mask in masks][: 1 if b < trunk else m] for b in range(depth)]
    mlp_hidden = [w[:1] if b < trunk else w for b, w in enumerate(mlp_hidden)]
    p0, attn0, mlp0 = parts[0][0], families[0].attention(0), families[0].mlp(0)
    spec = HydraSpec(
        family=families[0].name,
        arch=families[0].describe(),
        members=m,
        dim=int(attn0.o.get().out_features),
        head_dim=families[0].head_dim(0),
        heads=heads,
        mlp_hidden=mlp_hidden,
        mlp_mode=mlp_mode,
        act=families[0].activation(),
        pre_norm=families[0].pre_norm,
        causal=families[0].causal,
        eps=float(p0.norm1.eps),
        qk_norm_eps=None if p0.q_norm is None else float(p0.q_norm.eps),
        layer_scale=p0.ls1 is not None,
        qkv_bias=attn0.qkv[0].get().bias is not None,
        proj_bias=attn0.o.get().bias is not None,
        mlp_bias=mlp0.fc1.get().bias is not None,
        attn_drop=p0.attn_drop,
        proj_drop=p0.proj_drop,
        mlp_act_drop=p0.mlp_act_drop,
        mlp_drop=p0.mlp_drop,
        shared=shared,
        trunk=trunk,
    )
    ref = next(base.parameters())
    model = HydraModel(spec).to(dtype=ref.dtype, device=ref.device)
    _fill(model, families, ends, parts, masks, unit_keep)
    model.mlp_kept = unit_keep
    return model.train(base.training)


@torch.no_grad()
def _fill(
    model: HydraModel,
    families: Sequence[Family],
    ends: Sequence[tuple[nn.Module, nn.Module]],
    parts: Sequence[Sequence],
    masks: Sequence[HeadMask],
    unit_keep: list[list[torch.Tensor]] | None,
) -> None:
    for i, stem in enumerate(model.stems):
        stem.load_state_dict(ends[i][0].state_dict())
    for i, head in enumerate(model.heads):
        head.load_state_dict(ends[i][1].state_dict())
    for b, blk in enumerate(model.blocks):  # a trunk block (one stream): member 0's, the same in every member
        n = model.spec.streams(b)
        src, fams, units = parts[b][:n], families[:n], None if unit_keep is None else unit_keep[:n]
        _fill_norm(blk.norm1, [p.norm1 for p in src])
        _fill_norm(blk.norm2, [p.norm2 for p in src])
        _fill_norm(blk.attn.q_norm, [p.q_norm for p in src])
        _fill_norm(blk.attn.k_norm, [p.k_norm for p in src])
        _fill_scale(blk.ls1, [p.ls1 for p in src])
        _fill_scale(blk.ls2, [p.ls2 for p in src])
        fill_attention(blk.attn, fams, masks[:n], b)
        fill_mlp(blk.mlp, fams, units, b)
