"""The evaluate step: accuracy, calibration and OOD metrics of the result beside baselines."""

from __future__ import annotations

from compressor.core.distributed import is_main
from compressor.core.schema import Field
from compressor.run.baselines import BASELINES, baseline_models, result_model
from compressor.run.context import RunContext
from compressor.run.steps.base import register_step
from compressor.uq.evaluate import evaluate_models
from compressor.uq.plots import (
    finetune_curves,
    head_importance_heatmaps,
    ood_plot,
    reliability_diagram,
    reliability_overlay,
    risk_coverage_plot,
)


def _known_baselines(v: list) -> str | None:
    bad = [b for b in v if b not in BASELINES]
    return f"a list of {', '.join(BASELINES)} (unknown: {', '.join(map(str, bad))})" if bad else None


SCHEMA = {
    "baselines": Field((list,), ["base"], check=_known_baselines, doc="also evaluate: " + ", ".join(BASELINES)),
    "deep_ensemble_size": Field(
        (int, type(None)),
        None,
        check=lambda v: None if v is None or 1 <= v <= 16 else "an integer in 1..16",
        doc="models in the deep_ensemble baseline (default M)",
    ),
    "deep_ensemble_seeds": Field(
        (list, type(None)),
        None,
        check=lambda v: None if v is None or (v and all(isinstance(s, int) for s in v)) else "a list of integers",
        doc="seeds of the deep_ensemble baseline's other models (default: the recipe's seed + 1000, + 2000, ...)",
    ),
    "mc_dropout_samples": Field(
        (int, type(None)),
        None,
        check=lambda v: None if v is None or 1 <= v <= 64 else "an integer in 1..64",
        doc="stochastic passes of the mc_dropout baseline (default deep_ensemble_size, else 8)",
    ),
    "plots": Field((bool,), True),
}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def write_plots(ctx: RunContext, arrays: dict[str, dict]) -> list[str]:
    """Every evaluate plot from the probabilities the evaluation already computed; their paths."""
    plots = ctx.out / "plots"
    written = []
    tests = {name: a["test"] for name, a in arrays.items()}
    for name, (probs, labels) in tests.items():
        reliability_diagram(probs, labels, name, plots / f"reliability_{_safe(name)}.png")
        written.append(f"plots/reliability_{_safe(name)}.png")
    reliability_overlay(tests, plots / "reliability_all.png")
    risk_coverage_plot(tests, plots / "risk_coverage.png")
    written += ["plots/reliability_all.png", "plots/risk_coverage.png"]
    for set_name in ctx.data.ood:
        pairs = {name: (a["test"][0], a["ood"][set_name]) for name, a in arrays.items()}
        ood_plot(set_name, pairs, plots / f"ood_{_safe(set_name)}.png")
        written.append(f"plots/ood_{_safe(set_name)}.png")
    if ctx.masks and ctx.scores:
        head_importance_heatmaps(ctx.scores, ctx.masks, plots / "head_importance.png")
        written.append("plots/head_importance.png")
    tunes = {k: h for k, h in ctx.log.items() if k.startswith("finetune") and isinstance(h, dict) and h.get("loss")}
    if tunes:
        finetune_curves(tunes, plots / "finetune.png")
        written.append("plots/finetune.png")
    return written


def _something_to_evaluate(cfg: dict, earlier: list, later: list) -> str | None:
    """Without a merge before it, the baselines are all there is to evaluate."""
    if not cfg["baselines"] and not any(name == "merge" for name, _ in earlier):
        return "has nothing to evaluate: no merge step before it and no baselines; expected e.g. baselines: [base]"
    return None


@register_step("evaluate", SCHEMA, check=_something_to_evaluate)
def evaluate(ctx: RunContext, cfg: dict) -> None:
    """Evaluate the result and the baselines on test, OOD and shifted data (metrics.json, plots/)."""
    models = {}
    result = result_model(ctx)
    if result is not None:
        models[result[0]] = result[1]
    models.update(
        baseline_models(
            ctx, cfg["baselines"], cfg["deep_ensemble_size"], cfg["deep_ensemble_seeds"], cfg["mc_dropout_samples"]
        )
    )
    reference = "base" if "base" in models else None
    ctx.metrics = evaluate_models(models, ctx.data, ctx.out, ctx.recipe.data["batch_size"], reference, write=is_main())
    if cfg["plots"] and is_main():
        ctx.log["plots"] = write_plots(ctx, ctx.metrics["arrays"])
    ctx.outcomes["evaluate"] = f"{len(models)} models: {', '.join(models)}"
    ctx.say("evaluate:\n" + ctx.metrics["table"])
