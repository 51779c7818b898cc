"""The prune step: score heads and choose each member's heads (M head masks)."""

from __future__ import annotations

from compressor.context import RunContext
from compressor.distributed import is_main
from compressor.families import Family
from compressor.io import atomic_write_text, json_text
from compressor.mask_checks import check_pruner_masks
from compressor.masks import save_masks
from compressor.mlp_units import with_disjoint_units, with_top_units
from compressor.recipe import plugin_options
from compressor.registry import resolve
from compressor.schema import Field
from compressor.steps.base import register_step

SCHEMA = {
    "pruner": Field((str,), required=True, doc="registered name or 'package.module:Class'"),
    "mlp_keep_ratio": Field(
        (int, float, type(None)),
        None,
        check=lambda v: None if v is None or 0 < v <= 1 else "a number in (0, 1]",
        doc="also choose each member's MLP units: this share per block, by the member's own unit importance",
    ),
    "mlp_split": Field(
        (str,),
        "top",
        choices=("top", "disjoint"),
        doc="top: each member's own best units (mlp_keep_ratio of them); disjoint: every unit to one member",
    ),
}


def _preflight(cfg: dict, family: Family) -> None:
    """The pruner can produce masks for this model's head counts (Pruner.preflight)."""
    resolve("pruner", cfg["pruner"])(**plugin_options(cfg, "pruner", "mlp_keep_ratio", "mlp_split")).preflight(family)


@register_step("prune", SCHEMA, plugin=("pruner", "pruner"), preflight=_preflight)
def prune(ctx: RunContext, cfg: dict) -> None:
    """Score the base model's heads and choose each member's heads (writes masks.json)."""
    options = plugin_options(cfg, "pruner", "mlp_keep_ratio", "mlp_split")
    options.setdefault("seed", ctx.recipe.seed)
    pruner = resolve("pruner", cfg["pruner"])(**options)
    pruner.outliers = ctx.outlier_batches()
    calib, heldout = ctx.calibration()
    family = ctx.family
    ctx.masks = check_pruner_masks(pruner.prune(family, calib, heldout), family, pruner, cfg["pruner"])
    family.apply_mask(None)
    inputs = [b[0] for b in calib]
    if cfg["mlp_split"] == "disjoint":
        ctx.masks = with_disjoint_units(family, ctx.masks, inputs)
    elif cfg["mlp_keep_ratio"] is not None:
        ctx.masks = with_top_units(family, ctx.masks, cfg["mlp_keep_ratio"], inputs)
    ctx.scores, ctx.members = pruner.last_scores, None
    if is_main():
        save_masks(ctx.out / "masks.json", ctx.masks)
        if ctx.scores is not None:
            payload = [[s.tolist() for s in member] for member in ctx.scores]
            atomic_write_text(ctx.out / "head_scores.json", json_text(payload, indent=None))
    kept = [sum(m.num_kept()) for m in ctx.masks]
    line = f"{cfg['pruner']}: {len(ctx.masks)} members keeping {kept} of {sum(family.heads_per_block())} heads"
    if ctx.masks[0].units is not None:
        line += f" and {[sum(len(m.kept_units(b)) for b in range(m.num_blocks)) for m in ctx.masks]} MLP units"
    ctx.outcomes["prune"] = line
    ctx.say(f"prune: {line}")
