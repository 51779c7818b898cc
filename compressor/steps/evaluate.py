"""The evaluate step: accuracy, calibration and OOD metrics of the result beside baselines."""

from __future__ import annotations

from compressor.baselines import BASELINES, baseline_models, result_model
from compressor.context import RunContext
from compressor.distributed import is_main
from compressor.evaluate import evaluate_models
from compressor.plots import head_importance_heatmaps, reliability_diagram
from compressor.predict import predict
from compressor.schema import Field
from compressor.steps.base import register_step


def _known_baselines(v: list) -> str | None:
    bad = [b for b in v if b not in BASELINES]
    return f"a list of {', '.join(BASELINES)} (unknown: {', '.join(map(str, bad))})" if bad else None


SCHEMA = {
    "baselines": Field((list,), ["base"], check=_known_baselines, doc="also evaluate: " + ", ".join(BASELINES)),
    "deep_ensemble_size": Field((int, type(None)), None, doc="models in the deep_ensemble baseline (default M)"),
    "plots": Field((bool,), True),
}


@register_step("evaluate", SCHEMA)
def evaluate(ctx: RunContext, cfg: dict) -> None:
    """Evaluate the result and the baselines on test, OOD and shifted data (metrics.json, plots/)."""
    models = {}
    result = result_model(ctx)
    if result is not None:
        models[result[0]] = result[1]
    models.update(baseline_models(ctx, cfg["baselines"], cfg["deep_ensemble_size"]))
    reference = "base" if "base" in models else None
    ctx.metrics = evaluate_models(models, ctx.data, ctx.out, ctx.recipe.data["batch_size"], reference, write=is_main())
    if cfg["plots"]:
        plots = ctx.out / "plots"
        for name, model in models.items():
            probs, labels = predict(model, ctx.data.test)  # on every rank: predict gathers
            safe = "".join(c if c.isalnum() else "_" for c in name)
            if is_main():
                reliability_diagram(probs.mean(0), labels, name, plots / f"reliability_{safe}.png")
        if ctx.masks and ctx.scores and is_main():
            head_importance_heatmaps(ctx.scores, ctx.masks, plots / "head_importance.png")
    ctx.outcomes["evaluate"] = f"{len(models)} models: {', '.join(models)}"
    ctx.say("evaluate:\n" + ctx.metrics["table"])
