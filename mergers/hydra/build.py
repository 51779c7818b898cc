"""Fill a HydraViT from a base timm ViT, M head masks and (optionally) M fine-tuned members."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from compressor.adapters import TimmViTAdapter
from compressor.distributed import all_reduce_sum
from compressor.masks import HeadMask
from mergers.hydra.layers import GroupedLinear, HydraAttention, MemberAffine, MemberLayerNorm, SharedMLP
from mergers.hydra.model import HydraSpec, HydraViT

MLP_MODES = ("average", "grouped", "pruned")


def _act_name(act: nn.Module) -> str:
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    for name, cls in (("relu", nn.ReLU), ("silu", nn.SiLU)):
        if isinstance(act, cls):
            return name
    raise NotImplementedError(f"MLP activation {type(act).__name__} is not supported by the hydra merger")


def _check_supported(vit: nn.Module) -> None:
    problems = []
    if getattr(vit, "reg_token", None) is not None:
        problems.append("register tokens")
    if getattr(vit, "attn_pool", None) is not None:
        problems.append("attention pooling")
    if getattr(vit, "dynamic_img_size", False):
        problems.append("dynamic_img_size")
    for name in ("norm_pre",):
        if not isinstance(getattr(vit, name), nn.Identity):
            problems.append(name)
    if not isinstance(getattr(vit.patch_embed, "norm", nn.Identity()), nn.Identity):
        problems.append("patch_embed.norm")
    for i, blk in enumerate(vit.blocks):
        attn = blk.attn
        if getattr(attn, "gate", None) is not None:
            problems.append(f"blocks.{i}: gated attention")
        if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
            problems.append(f"blocks.{i}: qk_norm")
        if not isinstance(getattr(blk.mlp, "norm", nn.Identity()), nn.Identity) or not hasattr(blk.mlp, "fc1"):
            problems.append(f"blocks.{i}: non-standard MLP")
    if vit.global_pool not in ("token", "avg"):
        problems.append(f"global_pool '{vit.global_pool}'")
    if problems:
        raise NotImplementedError("hydra merger does not support: " + ", ".join(problems))


def _same(tensors: Sequence[torch.Tensor | None]) -> bool:
    first = tensors[0]
    if first is None:
        return all(t is None for t in tensors)
    return all(t is not None and t.shape == first.shape and torch.equal(t, first) for t in tensors[1:])


def _module_tensors(mod: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in mod.parameters()]


def _same_module(mods: Sequence[nn.Module]) -> bool:
    params = [_module_tensors(m) for m in mods]
    return all(len(p) == len(params[0]) for p in params) and all(
        _same([p[i] for p in params]) for i in range(len(params[0]))
    )


def _fill_norm(dst: nn.Module, srcs: Sequence[nn.Module]) -> None:
    with torch.no_grad():
        if isinstance(dst, nn.LayerNorm):
            dst.weight.copy_(srcs[0].weight)
            dst.bias.copy_(srcs[0].bias)
        elif isinstance(dst, MemberLayerNorm):
            for m, s in enumerate(srcs):
                dst.affine.weight[m].copy_(s.weight)
                dst.affine.bias[m].copy_(s.bias)


def _fill_scale(dst: nn.Module, srcs: Sequence[nn.Module]) -> None:
    if isinstance(dst, MemberAffine):
        with torch.no_grad():
            for m in range(dst.weight.shape[0]):
                dst.weight[m].copy_(srcs[m].gamma)


@torch.no_grad()
def fill_attention(attn: HydraAttention, adapters: Sequence, masks: Sequence[HeadMask], block: int) -> None:
    """Copy every member's kept heads of `block` (through its adapter) into the fused attention."""
    for i, (ad, mask) in enumerate(zip(adapters, masks)):
        w = ad.head_weights(block)
        keep = torch.as_tensor(mask.kept_indices(block), dtype=torch.long)
        d = w.o.shape[0]
        qkv_w = torch.cat([t[keep].reshape(-1, d) for t in (w.q, w.k, w.v)])
        qkv_b = None if w.q_bias is None else torch.cat([t[keep].reshape(-1) for t in (w.q_bias, w.k_bias, w.v_bias)])
        attn.qkv.set_member(i, qkv_w, qkv_b)
        attn.proj.set_member(i, w.o[:, keep].reshape(d, -1), w.o_bias)


@torch.no_grad()
def fill_mlp(
    mlp: nn.Module,
    fc1s: Sequence[nn.Linear],
    fc2s: Sequence[nn.Linear],
    unit_keep: list[list[torch.Tensor]] | None,
    block: int,
) -> None:
    """Copy the members' MLPs of `block` into the fused one: averaged (SharedMLP) or per member
    (HydraMLP, keeping `unit_keep[member][block]` hidden units when width-pruned)."""
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


def top_units(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest-scored MLP units, in increasing order (ties broken by index)."""
    return torch.sort(torch.argsort(-score.double(), stable=True)[:k]).values


@torch.no_grad()
def mlp_unit_scores(
    vit: nn.Module, mask: HeadMask, calibration: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Importance of each MLP hidden unit, per block, for one member.

    With calibration inputs: mean |activation| of the unit (through the member's head mask) times
    the norm of its output weights; without: the product of its input and output weight norms.
    Under torch.distributed the activation sums of every rank's shard are all-reduced.
    """
    fc2_norms = [blk.mlp.fc2.weight.norm(dim=0) for blk in vit.blocks]
    if not calibration:
        return [blk.mlp.fc1.weight.norm(dim=1) * n for blk, n in zip(vit.blocks, fc2_norms)]
    adapter = TimmViTAdapter(vit)
    previous = [g.detach().clone() for g in adapter.install_gates()]
    adapter.apply_mask(mask)
    sums = [torch.zeros_like(n) for n in fc2_norms]
    counts = [0]
    hooks = []
    for i, blk in enumerate(vit.blocks):

        def hook(_mod, _inp, out, i=i):
            sums[i] += out.detach().abs().reshape(-1, out.shape[-1]).sum(0)
            if i == 0:
                counts[0] += out.reshape(-1, out.shape[-1]).shape[0]

        hooks.append(blk.mlp.act.register_forward_hook(hook))
    was_training = vit.training
    vit.eval()
    try:
        for x in calibration:
            if len(x):
                vit(x)
    finally:
        for h in hooks:
            h.remove()
        adapter.set_gates(previous)
        vit.train(was_training)
    count = float(all_reduce_sum(torch.tensor([float(counts[0])], dtype=torch.float64)))
    return [all_reduce_sum(s) / max(count, 1.0) * n for s, n in zip(sums, fc2_norms)]


def build_hydra_vit(
    base: nn.Module,
    masks: Sequence[HeadMask],
    members: Sequence[nn.Module] | None = None,
    mlp_mode: str = "average",
    mlp_keep_ratio: float | None = None,
    calibration: Sequence[torch.Tensor] | None = None,
) -> HydraViT:
    """Fuse M members (base with each head mask, or the given fine-tuned members) into a HydraViT.

    mlp_mode: 'average' (paper: one MLP with the members' averaged weights), 'grouped' (each
    member's own MLP; exact in every case) or 'pruned' (each member's MLP width-pruned to
    `mlp_keep_ratio`, default 1/M, by `mlp_unit_scores`).
    """
    if mlp_mode not in MLP_MODES:
        raise ValueError(f"mlp_mode: expected one of {', '.join(MLP_MODES)}, got '{mlp_mode}'")
    m = len(masks)
    if m < 1:
        raise ValueError("hydra merger: needs at least one head mask")
    srcs = list(members) if members is not None else [base] * m
    if len(srcs) != m:
        raise ValueError(f"hydra merger: {m} masks but {len(srcs)} member models")
    _check_supported(base)
    adapters = [TimmViTAdapter(s) for s in srcs]
    heads_per_block = adapters[0].heads_per_block()
    for i, mask in enumerate(masks):
        mask.validate(heads_per_block, allow_empty_blocks=True, where=f"hydra merger: mask {i}")
    depth, d = len(base.blocks), int(base.embed_dim)
    blocks_of = lambda attr: [[getattr(s.blocks[b], attr) for s in srcs] for b in range(depth)]  # noqa: E731
    shared: dict[str, bool] = {
        "patch_embed": _same_module([s.patch_embed.proj for s in srcs]),
        "cls_token": _same([s.cls_token for s in srcs]),
        "pos_embed": _same([s.pos_embed for s in srcs]),
        "norm": _same_module([s.norm for s in srcs]),
        "fc_norm": _same_module([s.fc_norm for s in srcs]),
        "head": _same_module([s.head for s in srcs]),
    }
    for b in range(depth):
        for attr in ("norm1", "norm2", "ls1", "ls2"):
            shared[f"blocks.{b}.{attr}"] = _same_module(blocks_of(attr)[b])

    hidden = int(base.blocks[0].mlp.fc1.out_features)
    unit_keep: list[list[torch.Tensor]] | None = None
    if mlp_mode == "average":
        mlp_hidden = [[int(blk.mlp.fc1.out_features)] for blk in base.blocks]
    elif mlp_mode == "grouped":
        mlp_hidden = [[int(blk.mlp.fc1.out_features)] * m for blk in base.blocks]
    else:
        ratio = 1.0 / m if mlp_keep_ratio is None else float(mlp_keep_ratio)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"mlp_keep_ratio: expected a number in (0, 1], got {ratio}")
        k = max(1, int(round(ratio * hidden)))
        unit_keep = []
        for i, s in enumerate(srcs):
            scores = mlp_unit_scores(s, masks[i], calibration)
            unit_keep.append([top_units(sc, k) for sc in scores])
        mlp_hidden = [[k] * m for _ in range(depth)]

    attn0 = base.blocks[0].attn
    pe = base.patch_embed
    spec = HydraSpec(
        members=m,
        embed_dim=d,
        num_classes=int(base.num_classes),
        in_chans=int(pe.proj.in_channels),
        patch_size=list(pe.proj.kernel_size),
        grid_size=list(pe.grid_size),
        head_dim=int(attn0.head_dim),
        heads=[[mask.num_kept()[b] for mask in masks] for b in range(depth)],
        mlp_hidden=mlp_hidden,
        mlp_mode=mlp_mode,
        num_prefix_tokens=int(base.num_prefix_tokens),
        has_cls_token=base.cls_token is not None,
        no_embed_class=bool(base.no_embed_class),
        global_pool=str(base.global_pool),
        qkv_bias=attn0.qkv.bias is not None,
        proj_bias=attn0.proj.bias is not None,
        patch_bias=pe.proj.bias is not None,
        eps=float(base.blocks[0].norm1.eps),
        act=_act_name(base.blocks[0].mlp.act),
        fc_norm=not isinstance(base.fc_norm, nn.Identity),
        final_norm=not isinstance(base.norm, nn.Identity),
        layer_scale=not isinstance(base.blocks[0].ls1, nn.Identity),
        attn_drop=float(attn0.attn_drop.p),
        proj_drop=float(attn0.proj_drop.p),
        shared=shared,
    )
    model = HydraViT(spec).to(dtype=base.pos_embed.dtype, device=base.pos_embed.device)
    _fill(model, srcs, adapters, masks, unit_keep)
    model.mlp_kept = unit_keep  # which MLP units each member kept ('pruned' mode), for inspection
    return model


@torch.no_grad()
def _fill(
    model: HydraViT,
    srcs: Sequence[nn.Module],
    adapters: Sequence[TimmViTAdapter],
    masks: Sequence[HeadMask],
    unit_keep: list[list[torch.Tensor]] | None,
) -> None:
    if model.patch_shared:
        model.patch_proj.weight.copy_(srcs[0].patch_embed.proj.weight)
        if model.patch_proj.bias is not None:
            model.patch_proj.bias.copy_(srcs[0].patch_embed.proj.bias)
    else:
        model.patch_proj.weight.copy_(torch.cat([s.patch_embed.proj.weight for s in srcs]))
        if model.patch_proj.bias is not None:
            model.patch_proj.bias.copy_(torch.cat([s.patch_embed.proj.bias for s in srcs]))
    for name in ("cls_token", "pos_embed"):
        dst = getattr(model, name)
        if dst is not None:
            dst.copy_(torch.stack([getattr(s, name) for s in srcs[: dst.shape[0]]]))
    _fill_norm(model.norm, [s.norm for s in srcs])
    _fill_norm(model.fc_norm, [s.fc_norm for s in srcs])
    if isinstance(model.head, GroupedLinear):
        for i, s in enumerate(srcs):
            model.head.set_member(i, s.head.weight, s.head.bias)
    else:
        model.head.weight.copy_(srcs[0].head.weight)
        model.head.bias.copy_(srcs[0].head.bias)

    for b, blk in enumerate(model.blocks):
        src_blocks = [s.blocks[b] for s in srcs]
        _fill_norm(blk.norm1, [sb.norm1 for sb in src_blocks])
        _fill_norm(blk.norm2, [sb.norm2 for sb in src_blocks])
        _fill_scale(blk.ls1, [sb.ls1 for sb in src_blocks])
        _fill_scale(blk.ls2, [sb.ls2 for sb in src_blocks])
        fill_attention(blk.attn, adapters, masks, b)
        fill_mlp(blk.mlp, [sb.mlp.fc1 for sb in src_blocks], [sb.mlp.fc2 for sb in src_blocks], unit_keep, b)
