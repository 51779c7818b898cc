"""The merge step: fuse the members (hydra) or cut one of them out (plain)."""

from __future__ import annotations

from compressor.core.errors import InputError
from compressor.core.registry import resolve
from compressor.core.schema import Field
from compressor.families import Family
from compressor.run.context import RunContext
from compressor.run.recipe import plugin_options
from compressor.run.steps.base import StepList, needs_earlier, register_step

SCHEMA = {"merger": Field((str,), required=True, doc="registered name or 'package.module:Class'")}


def _preflight(cfg: dict, family: Family) -> None:
    """The merger can handle this architecture (the hydra merger refuses what it cannot fuse exactly)."""
    resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger")).check(family)


def _check(cfg: dict, earlier: StepList, later: StepList) -> str | None:
    problem = needs_earlier("prune")(cfg, earlier, later)
    if problem:
        return problem
    prune = [c for n, c in earlier if n == "prune"][-1]
    members = prune.get("members", 3)
    merger = resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger"))
    if isinstance(members, int) and merger.min_members() > members:
        need = merger.min_members()
        return f"merger '{cfg['merger']}' needs {need} member masks; the prune step before it makes {members}"
    chooser = next((k for k in ("mlp_keep_ratio", "target") if prune.get(k) is not None), None)
    chooser = chooser or ("mlp_split" if prune.get("mlp_split") == "disjoint" else None)
    if chooser and not merger.honours_mlp_units():
        return (
            f"with this merger runs full MLPs and would discard the MLP units prune.{chooser} chooses "
            "(hydra: use mlp: pruned, or drop the prune step's unit choice)"
        )
    if chooser and merger.chooses_mlp_units():
        return f"would choose MLP units a second time: prune.{chooser} already does (drop the merger's mlp_keep_ratio)"
    return None


@register_step("merge", SCHEMA, plugin=("merger", "merger"), check=_check, preflight=_preflight)
def merge(ctx: RunContext, cfg: dict) -> None:
    """Turn the base model and the masks (or fine-tuned members) into one model."""
    options = plugin_options(cfg, "merger")
    merger = resolve("merger", cfg["merger"])(**options)
    calib, _ = ctx.calibration()
    ctx.merged = merger.merge(ctx.base, ctx.masks, ctx.members, [b[0] for b in calib])
    ctx.merger_name, ctx.merger_options = cfg["merger"], options
    trunk = merger.shared_trunk(ctx.merged)
    if ctx.shared_blocks and trunk is not None and trunk < ctx.shared_blocks:
        raise InputError(
            f"merge: prune.shared_blocks is {ctx.shared_blocks} but the members' first blocks differ "
            f"(the fused model shares {trunk}); expected them whole and frozen in every member"
        )
    params = sum(p.numel() for p in ctx.merged.parameters())
    line = f"{cfg['merger']} -> {type(ctx.merged).__name__}, {params / 1e6:.2f}M parameters"
    ctx.outcomes["merge"] = line
    ctx.say(f"merge: {line}")
