"""The merge step: fuse the members (hydra) or cut one of them out (plain)."""

from __future__ import annotations

from compressor.context import RunContext
from compressor.families import Family
from compressor.recipe import plugin_options
from compressor.registry import resolve
from compressor.schema import Field
from compressor.steps.base import StepList, needs_earlier, register_step

SCHEMA = {"merger": Field((str,), required=True, doc="registered name or 'package.module:Class'")}


def _preflight(cfg: dict, family: Family) -> None:
    """The merger can handle this architecture (the hydra merger refuses what it cannot fuse exactly)."""
    resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger")).check(family)


def _check(cfg: dict, earlier: StepList, later: StepList) -> str | None:
    problem = needs_earlier("prune")(cfg, earlier, later)
    if problem:
        return problem
    members = [c.get("members", 3) for n, c in earlier if n == "prune"][-1]
    need = resolve("merger", cfg["merger"])(**plugin_options(cfg, "merger")).min_members()
    if isinstance(members, int) and need > members:
        return f"merger '{cfg['merger']}' needs {need} member masks; the prune step before it makes {members}"
    return None


@register_step("merge", SCHEMA, plugin=("merger", "merger"), check=_check, preflight=_preflight)
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
