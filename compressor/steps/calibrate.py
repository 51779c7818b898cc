"""The calibrate step: temperature scaling and an OOD threshold, fitted on the held-out split."""

from __future__ import annotations

from compressor.calibration import OOD_SCORES, Calibrated, fit_temperature, ood_scores, ood_threshold
from compressor.context import RunContext
from compressor.errors import InputError
from compressor.inference import predict_logits
from compressor.metrics import accuracy, ece, nll
from compressor.schema import NUM, Field
from compressor.steps.base import needs_earlier, register_step

SCHEMA = {
    "temperature": Field((bool,), True, doc="fit temperature scaling on the held-out split"),
    "per_member": Field((bool,), False, doc="ensembles: one temperature per member (default: one for all)"),
    "ood_score": Field((str,), "msp", choices=OOD_SCORES, doc="score the stored OOD threshold applies to"),
    "ood_tpr": Field(NUM, 0.95, check=lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
}


@register_step("calibrate", SCHEMA, check=needs_earlier("merge"))
def calibrate(ctx: RunContext, cfg: dict) -> None:
    """Fit temperature scaling (held-out NLL) and the OOD threshold that keeps `ood_tpr` of held-out samples."""
    model = ctx.merged.model if isinstance(ctx.merged, Calibrated) else ctx.merged
    logits, labels = predict_logits(model, ctx.data.val, ctx.recipe.data["batch_size"])
    if cfg["ood_score"] == "mi" and logits.shape[0] < 2:
        raise InputError("calibrate.ood_score: 'mi' needs an ensemble (the merged model has one member)")
    temperature = fit_temperature(logits, labels, cfg["per_member"]) if cfg["temperature"] else logits.new_ones(1)
    before = logits.softmax(-1)
    after = (logits / temperature.view(-1, 1, 1)).softmax(-1)
    scores = ood_scores(after, cfg["ood_score"])
    ood = {"score": cfg["ood_score"], "tpr": float(cfg["ood_tpr"]), "threshold": ood_threshold(scores, cfg["ood_tpr"])}
    ctx.merged = Calibrated(model, temperature, ood)
    report = {
        name: {"accuracy": accuracy(p.mean(0), labels), "nll": nll(p.mean(0), labels), "ece": ece(p.mean(0), labels)}
        for name, p in (("before", before), ("after", after))
    }
    ctx.log["calibrate"] = {"temperature": temperature.tolist(), "ood": ood, **report}
    b, a = report["before"], report["after"]
    temps = ", ".join(f"{t:.2f}" for t in temperature.tolist())
    line = (
        f"temperature {temps}; held-out NLL {b['nll']:.3f} -> {a['nll']:.3f}, ECE {b['ece']:.3f} -> {a['ece']:.3f}, "
        f"accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f}; OOD threshold ({ood['score']}, keeps "
        f"{ood['tpr']:.0%} of held-out) {ood['threshold']:.4f}"
    )
    ctx.outcomes["calibrate"] = line
    ctx.say(f"calibrate: {line}")
