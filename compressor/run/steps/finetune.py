"""The finetune step: a short training run of the members (before merging) or of the merged model."""

from __future__ import annotations

import torch
from torch import nn

from compressor.core.errors import InputError
from compressor.core.registry import resolve
from compressor.core.schema import NUM, Field, positive
from compressor.families import Family, family_of, masked_member
from compressor.run.context import RunContext
from compressor.run.recipe import TRAIN_FIELDS
from compressor.run.steps.base import StepList, register_step
from compressor.training.config import TrainConfig
from compressor.training.loop import train

SCHEMA = {
    "target": Field(
        (str,),
        "auto",
        choices=("auto", "members", "merged"),
        doc="members: each masked member before merging; merged: the merged model",
    ),
    **TRAIN_FIELDS,
    "steps": Field((int,), 100, check=lambda v: None if 0 < v <= 2000 else "an integer in 1..2000"),
    "lr": Field(NUM, 5e-4, check=positive),
    "bootstrap": Field(
        (bool,), False, doc="ensembles: each member sees its own bootstrap weighting of every batch (bagging)"
    ),
    "reinit_head": Field((bool,), False, doc="each member's classifier re-initialised (its seed)"),
    "reinit_blocks": Field(
        (int, str),
        0,
        check=lambda v: None if v == "all" or (isinstance(v, int) and v >= 0) else "an integer >= 0 or 'all'",
        doc="each member's last N transformer blocks ('all': every block) re-initialised (its seed), so "
        "members differ in more than their heads, as Deep Ensemble members do; with target merged the "
        "re-initialised members are fused again and trained as one model",
    ),
    "freeze_embeddings": Field(
        (bool,),
        False,
        doc="keep the embeddings (every weight outside the blocks and the classifier) as the base's, so that "
        "the fused model holds one shared copy: with a large vocabulary they are most of a text model's parameters",
    ),
    "distill": Field(
        (dict, type(None)),
        None,
        schema={
            "teacher": Field((str,), "base", choices=("base",), doc="the unpruned base model"),
            "alpha": Field(NUM, 0.5, check=lambda v: None if 0 <= v <= 1 else "a number in [0, 1]"),
            "temperature": Field(NUM, 2.0, check=positive),
        },
        doc="logit distillation from the base: (1 - alpha) CE + alpha T^2 KL",
    ),
    "disagreement": Field(
        NUM,
        0.0,
        check=lambda v: None if v >= 0 else "a number >= 0",
        doc="ensembles: reward for member disagreement on synthetic outliers of each batch",
    ),
}


def _check(cfg: dict, earlier: StepList, later: StepList) -> str | None:
    before, after = {n for n, _ in earlier}, {n for n, _ in later}
    target = cfg["target"]
    if target == "merged" and "merge" not in before:
        return "target 'merged' needs a 'merge' step before it"
    if target == "members" and "prune" not in before:
        return "target 'members' needs a 'prune' step before it"
    if target == "members" and "merge" in before and "merge" not in after:
        return (
            "target 'members' after the merge would be lost (the merged model is already built); "
            "put it before 'merge', or add a 'merge' step after it"
        )
    if target == "auto" and not before & {"prune", "merge"}:
        return "needs a 'prune' or 'merge' step before it"
    merged = target == "merged" or (target == "auto" and "merge" in before)
    if cfg["freeze_embeddings"] and merged:
        return "freeze_embeddings needs target 'members' (a merged model's members share their embeddings already)"
    shared = next((c.get("shared_blocks", 0) for n, c in reversed(earlier) if n == "prune"), 0)
    if shared and cfg["reinit_blocks"] == "all":
        return f"reinit_blocks 'all' would redraw the {shared} blocks prune.shared_blocks keeps as the base's"
    if cfg["disagreement"] and not merged:
        return (
            "disagreement rewards members for disagreeing inside one fused model: it needs target 'merged' "
            "(a finetune after the merge); members fine-tuned one by one have no other member to disagree with"
        )
    return None


def _preflight(cfg: dict, family: Family) -> None:
    """reinit_blocks fits the model's depth."""
    if reinit_count(cfg["reinit_blocks"], family) > family.num_blocks:
        raise InputError(f"reinit_blocks: {cfg['reinit_blocks']} is more than the model's {family.num_blocks} blocks")


def reinit_count(reinit_blocks: int | str, family: Family) -> int:
    """How many of the last blocks `reinit_blocks` redraws (0: none, 'all': every block)."""
    return family.num_blocks if reinit_blocks == "all" else reinit_blocks


def reinitialise(modules: list[nn.Module], seed: int) -> None:
    """Fresh weights (each layer's own `reset_parameters`) for every layer under `modules`, drawn
    from `seed`: what makes members trained from one base differ as Deep Ensemble members do."""
    torch.manual_seed(seed)
    for root in modules:
        for module in root.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()


def outside_blocks(model: nn.Module) -> list[nn.Parameter]:
    """The parameters outside the transformer blocks and the classifier: the embeddings (and the
    final norm where a family has one)."""
    family = family_of(model)
    inside = {id(p) for block in family.blocks() for p in block.parameters()}
    inside |= {id(p) for p in family.classifier().parameters()}
    return [p for p in model.parameters() if id(p) not in inside]


def redraw(member: nn.Module, cfg: dict, seed: int, shared_blocks: int) -> Family:
    """Re-initialise the member's last `reinit_blocks` blocks (and classifier, with `reinit_head`)
    from `seed`, never a block of the shared trunk; return its family."""
    family = family_of(member)
    redrawn = reinit_count(cfg["reinit_blocks"], family)
    if redrawn > family.num_blocks - shared_blocks:
        raise InputError(
            f"finetune.reinit_blocks: {cfg['reinit_blocks']} would redraw blocks of the shared trunk "
            f"(prune.shared_blocks: {shared_blocks} of {family.num_blocks}); expected at most "
            f"{family.num_blocks - shared_blocks}"
        )
    fresh = list(family.blocks()[family.num_blocks - redrawn :])
    if cfg["reinit_head"]:
        fresh.append(family.classifier())
    if fresh:
        reinitialise(fresh, seed)
    return family


def fused_fresh_members(ctx: RunContext, cfg: dict, seed: int) -> nn.Module:
    """The merged model rebuilt, by the merger that built it, from members re-initialised as a
    members fine-tune would (member i from seed + i): the packed pipeline trained as one model."""
    if ctx.merger_name is None or ctx.masks is None:
        raise InputError("finetune: reinit_blocks/reinit_head with target merged need the merge step's masks")
    members = [masked_member(ctx.base, mask) for mask in ctx.masks]
    for i, member in enumerate(members):
        redraw(member, cfg, seed + i, ctx.shared_blocks)
    merger = resolve("merger", ctx.merger_name)(**ctx.merger_options)
    calib, _ = ctx.calibration()
    return merger.merge(ctx.base, ctx.masks, members, [b[0] for b in calib])


def train_config(ctx: RunContext, cfg: dict) -> TrainConfig:
    keys = TrainConfig.__dataclass_fields__
    tc = TrainConfig(**{k: v for k, v in cfg.items() if k in keys and k != "seed"}, seed=ctx.recipe.seed)
    if cfg.get("distill"):
        tc.distill_alpha, tc.distill_temperature = cfg["distill"]["alpha"], cfg["distill"]["temperature"]
    return tc


@register_step("finetune", SCHEMA, check=_check, preflight=_preflight)
def finetune(ctx: RunContext, cfg: dict) -> None:
    """Fine-tune the merged model, or each head-masked member (then merge them)."""
    target = cfg["target"]
    if target == "auto":
        target = "merged" if ctx.merged is not None else "members"
    tc = train_config(ctx, cfg)
    teacher = ctx.base if cfg.get("distill") else None
    if target == "merged":
        if cfg["reinit_head"] or cfg["reinit_blocks"]:
            ctx.merged = fused_fresh_members(ctx, cfg, tc.seed)
        ctx.log["finetune merged"] = train(
            ctx.merged,
            ctx.data.train,
            ctx.data.val,
            tc,
            desc="finetune merged",
            make_outliers=ctx.data.make_outliers,
            teacher=teacher,
        )
        ctx.outcomes["finetune"] = f"merged model, {len(ctx.log['finetune merged']['loss'])} steps"
        return
    members = ctx.members or [masked_member(ctx.base, m) for m in ctx.masks]
    for i, member in enumerate(members):
        tc_i = TrainConfig(**{**tc.__dict__, "seed": tc.seed + i, "ensemble_member": len(members) > 1})
        family = redraw(member, cfg, tc_i.seed, ctx.shared_blocks)
        frozen = outside_blocks(member) if cfg["freeze_embeddings"] or ctx.shared_blocks else []
        frozen += [p for block in family.blocks()[: ctx.shared_blocks] for p in block.parameters()]
        for p in frozen:
            p.requires_grad_(False)
        try:
            ctx.log[f"finetune member {i}"] = train(
                member, ctx.data.train, ctx.data.val, tc_i, desc=f"finetune member {i}", teacher=teacher
            )
        finally:
            for p in frozen:
                p.requires_grad_(True)
    ctx.members = members
    ctx.outcomes["finetune"] = f"{len(members)} members, {tc.steps} steps each"
