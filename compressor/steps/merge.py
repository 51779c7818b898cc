"""The merge step: fuse the members (hydra) or cut one of them out (plain)."""

from __future__ import annotations

from compressor.context import RunContext
from compressor.families import Family
from compressor.recipe import plugin_options
from compressor.registry import resolve
from compressor.schema import Field
from compressor.steps.base import needs_earlier, register_step

SCHEMA = {"merger": Field((str,), required=True, doc="registered name or 'package.module:Class'")}


def _preflight(cfg: dict, family: Family) -> None:
    """The merger can handle this architecture (the hydra merger refuses what it cannot fuse exactly)."""
    resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger")).check(family)


@register_step("merge", SCHEMA, plugin=("merger", "merger"), check=needs_earlier("prune"), preflight=_preflight)
def merge(ctx: RunContext, cfg: dict) -> None:
    """Turn the base model and the masks (or fine-tuned members) into one model."""
    merger = resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger"))
    calib, _ = ctx.calibration()
    ctx.merged = merger.merge(ctx.base, ctx.masks, ctx.members, [b[0] for b in calib])
    ctx.merger_name = cfg["merger"]
    params = sum(p.numel() for p in ctx.merged.parameters())
    line = f"{cfg['merger']} -> {type(ctx.merged).__name__}, {params / 1e6:.2f}M parameters"
    ctx.outcomes["merge"] = line
    ctx.say(f"merge: {line}")
