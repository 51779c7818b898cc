"""The prune step: score heads and choose each member's heads (M head masks)."""

from __future__ import annotations

from compressor.core.distributed import is_main
from compressor.core.errors import InputError
from compressor.core.io import atomic_write_text, json_text
from compressor.core.masks import HeadMask, save_masks
from compressor.core.modes import evaluating
from compressor.core.registry import resolve
from compressor.core.schema import Field
from compressor.families import Family
from compressor.run.context import RunContext
from compressor.run.recipe import plugin_options
from compressor.run.steps.base import register_step
from compressor.surgery.budget import ALLOCATIONS, iterative_budget_mask
from compressor.surgery.mask_checks import check_pruner_masks
from compressor.surgery.mlp_units import TP_CRITERIA, unit_scores, with_disjoint_units, with_top_units


def _target(v: dict | None) -> str | None:
    if v is None:
        return None
    ok = len(v) == 1 and next(iter(v)) in ("flops", "params") and isinstance(next(iter(v.values())), (int, float))
    return None if ok and 0 < next(iter(v.values())) < 1 else "{flops: r} or {params: r} with r in (0, 1)"


SCHEMA = {
    "pruner": Field((str,), required=True, doc="registered name or 'package.module:Class'"),
    "mlp_keep_ratio": Field(
        (int, float, type(None)),
        None,
        check=lambda v: None if v is None or 0 < v <= 1 else "a number in (0, 1]",
        doc="also choose each member's MLP units: this share per block, by the member's own unit importance",
    ),
    "mlp_importance": Field(
        (str,),
        "activation",
        choices=("activation", *TP_CRITERIA),
        doc="MLP-unit importance: activation, or torch-pruning's taylor, magnitude, hessian",
    ),
    "target": Field(
        (dict, type(None)),
        None,
        check=_target,
        doc="{flops: r} or {params: r}: remove heads and MLP units together until this share is left",
    ),
    "allocation": Field(
        (str,),
        "uniform",
        choices=ALLOCATIONS,
        doc="with target: the same share of heads and units in every block, or global ranking across blocks",
    ),
    "iterative_steps": Field(
        (int,),
        1,
        check=lambda v: None if v >= 1 else "an integer >= 1",
        doc="with target: reach it in this many steps, re-scoring heads and units on what is left",
    ),
    "shared_blocks": Field(
        (int,),
        0,
        check=lambda v: None if not isinstance(v, bool) and v >= 0 else "an integer >= 0",
        doc="a shared trunk: the first k blocks stay the base's, whole and identical in every member (frozen "
        "in member fine-tunes); the fused model runs them once, on one stream",
    ),
    "mlp_split": Field(
        (str,),
        "top",
        choices=("top", "disjoint"),
        doc="top: each member's own best units (mlp_keep_ratio of them); disjoint: every unit to one member",
    ),
}


STEP_KEYS = (
    "mlp_keep_ratio",
    "mlp_importance",
    "target",
    "allocation",
    "iterative_steps",
    "mlp_split",
    "shared_blocks",
)


def _budget_masks(ctx: RunContext, family: Family, pruner, cfg: dict, calib: list, heldout: list) -> list:
    """Each member's heads and MLP units chosen together to meet the step's `target` (in
    `iterative_steps` steps, the pruner re-scoring the heads left after each)."""
    if pruner.last_scores is None:
        raise InputError(f"prune.target: pruner '{cfg['pruner']}' gives no head scores; use a scored pruner")
    tokens = family.tokens_per_sample(calib[0][0])
    masks = []
    for m, mask in enumerate(ctx.masks):

        def scores_of(current: HeadMask | None, m: int = m, mask: HeadMask = mask) -> tuple[list, list]:
            if current is None:
                return pruner.last_scores[m], unit_scores(family, mask, calib, cfg["mlp_importance"])
            with family.masked(current), evaluating(family.model):
                heads = pruner.member_scores(family, calib, heldout, m)
            return heads, unit_scores(family, current, calib, cfg["mlp_importance"])

        masks.append(
            iterative_budget_mask(family, scores_of, cfg["target"], tokens, cfg["allocation"], cfg["iterative_steps"])
        )
    return masks


def _preflight(cfg: dict, family: Family) -> None:
    """The pruner can produce masks for this model's head counts (Pruner.preflight), and can
    re-score heads when the target is reached in steps."""
    pruner = resolve("pruner", cfg["pruner"])(**plugin_options(cfg, "pruner", *STEP_KEYS))
    pruner.preflight(family)
    if cfg["shared_blocks"] > family.num_blocks - 1:
        raise InputError(
            f"shared_blocks: expected an integer in 0..{family.num_blocks - 1} "
            f"(the model has {family.num_blocks} blocks; at least one must differ between members), "
            f"got {cfg['shared_blocks']}"
        )
    if cfg["iterative_steps"] > 1 and not pruner.can_rescore:
        raise InputError(f"prune.iterative_steps: pruner '{cfg['pruner']}' cannot re-score heads; use 1")


@register_step("prune", SCHEMA, plugin=("pruner", "pruner"), preflight=_preflight)
def prune(ctx: RunContext, cfg: dict) -> None:
    """Score the base model's heads and choose each member's heads (writes masks.json)."""
    options = plugin_options(cfg, "pruner", *STEP_KEYS)
    options.setdefault("seed", ctx.recipe.seed)
    pruner = resolve("pruner", cfg["pruner"])(**options)
    pruner.outliers = ctx.outlier_batches()
    calib, heldout = ctx.calibration()
    family = ctx.family
    ctx.masks = check_pruner_masks(pruner.prune(family, calib, heldout), family, pruner, cfg["pruner"])
    family.apply_mask(None)
    if cfg["target"] is not None:
        ctx.masks = _budget_masks(ctx, family, pruner, cfg, calib, heldout)
    elif cfg["mlp_split"] == "disjoint":
        ctx.masks = with_disjoint_units(family, ctx.masks, [b[0] for b in calib])
    elif cfg["mlp_keep_ratio"] is not None:
        ctx.masks = with_top_units(family, ctx.masks, cfg["mlp_keep_ratio"], calib, cfg["mlp_importance"])
    if cfg["shared_blocks"]:
        ctx.masks = [mask.with_whole_blocks(cfg["shared_blocks"]) for mask in ctx.masks]
    ctx.scores, ctx.members, ctx.shared_blocks = pruner.last_scores, None, cfg["shared_blocks"]
    if is_main():
        save_masks(ctx.out / "masks.json", ctx.masks)
        if ctx.scores is not None:
            payload = [[s.tolist() for s in member] for member in ctx.scores]
            atomic_write_text(ctx.out / "head_scores.json", json_text(payload, indent=None))
    kept = [sum(m.num_kept()) for m in ctx.masks]
    line = f"{cfg['pruner']}: {len(ctx.masks)} members keeping {kept} of {sum(family.heads_per_block())} heads"
    if ctx.masks[0].units is not None:
        line += f" and {[sum(len(m.kept_units(b)) for b in range(m.num_blocks)) for m in ctx.masks]} MLP units"
    if ctx.shared_blocks:
        line += f"; the first {ctx.shared_blocks} blocks shared whole (the trunk)"
    ctx.outcomes["prune"] = line
    ctx.say(f"prune: {line}")
