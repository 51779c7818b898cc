"""Baselines the evaluate step puts beside the result: the base model, the members run
separately, the result before its calibrate step, a Deep Ensemble of independently trained
bases, and MC dropout."""

from __future__ import annotations

from torch import nn

from compressor.families import masked_member
from compressor.run.context import RunContext
from compressor.uq.calibrated import Calibrated
from compressor.uq.outputs import DeepEnsemble, MCDropout

BASELINES = ("base", "members", "uncalibrated", "deep_ensemble", "mc_dropout")


def result_model(ctx: RunContext) -> tuple[str, nn.Module] | None:
    """The run's result so far: the merged model, else the members (fine-tuned or masked)."""
    if ctx.merged is not None:
        return ctx.merger_name or "merged", ctx.merged
    if ctx.members is not None:
        return "members", DeepEnsemble(ctx.members)
    if ctx.masks is not None:
        return "masked", DeepEnsemble([masked_member(ctx.base, m) for m in ctx.masks])
    return None


def baseline_models(
    ctx: RunContext, names: list[str], size: int | None, seeds: list[int] | None = None, mc_samples: int | None = None
) -> dict[str, nn.Module]:
    """The named baselines; a Deep Ensemble trains `size` - 1 more bases (cached), from `seeds`
    (default: the recipe's seed + 1000, + 2000, ...); MC dropout takes `mc_samples` passes (default
    `size`, else 8)."""
    from compressor.run.models import build_base

    out: dict[str, nn.Module] = {}
    m = len(ctx.masks) if ctx.masks else 3
    for name in names:
        if name == "base":
            out["base"] = ctx.base
        elif name == "members" and ctx.masks:
            out["members (separate)"] = DeepEnsemble(ctx.members or [masked_member(ctx.base, k) for k in ctx.masks])
        elif name == "uncalibrated" and isinstance(ctx.merged, Calibrated):
            out["uncalibrated"] = ctx.merged.model
        elif name == "deep_ensemble":
            r = ctx.recipe
            others = seeds or [r.seed + 1000 * (i + 1) for i in range((size or m) - 1)]
            models = [ctx.base] + [
                build_base(r.model, ctx.data, r.data, seed, ctx.cache_dir, device=ctx.device) for seed in others
            ]
            out[f"deep_ensemble x{len(models)}"] = DeepEnsemble(models)
        elif name == "mc_dropout":
            out["mc_dropout"] = MCDropout(ctx.base, samples=mc_samples or size or 8)
    return out
