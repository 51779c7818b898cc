"""The prune step: score heads and choose each member's heads (M head masks)."""

from __future__ import annotations

import json

from compressor.context import RunContext
from compressor.distributed import is_main
from compressor.families import Family
from compressor.io import atomic_write_text
from compressor.masks import save_masks
from compressor.recipe import plugin_options
from compressor.registry import resolve
from compressor.schema import Field
from compressor.steps.base import register_step

SCHEMA = {"pruner": Field((str,), required=True, doc="registered name or 'package.module:Class'")}


def _preflight(cfg: dict, family: Family) -> None:
    """The pruner can produce masks for this model's head counts (Pruner.preflight)."""
    resolve("pruner", cfg["pruner"])(**plugin_options(cfg, "pruner")).preflight(family)


@register_step("prune", SCHEMA, plugin=("pruner", "pruner"), preflight=_preflight)
def prune(ctx: RunContext, cfg: dict) -> None:
    """Score the base model's heads and choose each member's heads (writes masks.json)."""
    options = plugin_options(cfg, "pruner")
    options.setdefault("seed", ctx.recipe.seed)
    pruner = resolve("pruner", cfg["pruner"])(**options)
    calib, heldout = ctx.calibration()
    family = ctx.family
    ctx.masks = pruner.prune(family, calib, heldout)
    family.apply_mask(None)
    ctx.scores, ctx.members = pruner.last_scores, None
    if is_main():
        save_masks(ctx.out / "masks.json", ctx.masks)
        if ctx.scores is not None:
            payload = [[s.tolist() for s in member] for member in ctx.scores]
            atomic_write_text(ctx.out / "head_scores.json", json.dumps(payload))
    kept = [sum(m.num_kept()) for m in ctx.masks]
    line = f"{cfg['pruner']}: {len(ctx.masks)} members keeping {kept} of {sum(family.heads_per_block())} heads"
    ctx.outcomes["prune"] = line
    ctx.say(f"prune: {line}")
