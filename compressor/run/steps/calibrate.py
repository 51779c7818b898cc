"""The calibrate step: a checked temperature, an OOD threshold and conformal prediction-set
thresholds, fitted on the held-out split.

The temperature is kept only when it lowers the held-out NLL on data the fit did not see
(cross-fitting), never below 1 without enough held-out errors, within bounds; the OOD threshold
is refused when it would accept every held-out and every validation-outlier input; the conformal
thresholds (LAC and APS) are fitted on the calibrated probabilities of the same split (the one
temperature fitted there barely bends exchangeability). The report line says what was decided and why.
"""

from __future__ import annotations

import torch
from torch.utils.data import Subset

from compressor.core.errors import InputError, MetricInputError
from compressor.core.schema import NUM, Field
from compressor.families import Family
from compressor.run.context import RunContext
from compressor.run.steps.base import needs_earlier, register_step
from compressor.uq.calibrated import Calibrated
from compressor.uq.calibration import (
    CHECK_FOLDS,
    TemperatureFit,
    apply_temperature,
    calibrated_probs,
    checked_ood_threshold,
    fit_checked_temperature,
)
from compressor.uq.conformal import (
    CONFORMAL_METHODS,
    DEFAULT_COVERAGE,
    coverage_and_size,
    fit_conformal,
    prediction_sets,
)
from compressor.uq.inference import predict_logits, predict_logits_and_features
from compressor.uq.metrics import accuracy, ece, nll
from compressor.uq.posthoc import Mahalanobis
from compressor.uq.scores import FEATURE_SCORES, OOD_SCORES, ood_score

SCHEMA = {
    "temperature": Field((bool,), True, doc="fit temperature scaling on the held-out split (kept only if it helps)"),
    "per_member": Field(
        (bool,), False, doc="ensembles: one temperature per member (default: one on the ensemble's log-probabilities)"
    ),
    "ood_score": Field((str,), "msp", choices=OOD_SCORES, doc="score the stored OOD threshold applies to"),
    "ood_tpr": Field(NUM, 0.95, check=lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
    "feature_samples": Field(
        (int,),
        20000,
        check=lambda v: None if v >= 2 else "an integer >= 2",
        doc="ood_score mahalanobis: train samples (a seeded subset) its class means and covariance are fitted on",
    ),
    "conformal_coverage": Field(
        (int, float, type(None)),
        DEFAULT_COVERAGE,
        check=lambda v: None if v is None or 0 < v < 1 else "a number in (0, 1), or null for no prediction sets",
        doc="conformal prediction sets that hold the true class this often (null: none)",
    ),
    "conformal_method": Field((str,), "lac", choices=CONFORMAL_METHODS, doc="the sets predict writes"),
}


def _conformal(probs: torch.Tensor, labels: torch.Tensor, cfg: dict) -> tuple[dict, list[str]]:
    """Conformal thresholds at the recipe's coverage (empty, with a note, when the split is too small)."""
    if cfg["conformal_coverage"] is None:
        return {}, []
    try:
        fitted = fit_conformal(probs, labels, float(cfg["conformal_coverage"]), cfg["conformal_method"])
    except MetricInputError as e:
        return {}, [f"WARNING: {str(e).split(': ', 1)[1]}: no prediction sets stored"]
    method = fitted["method"]
    _, size = coverage_and_size(prediction_sets(probs, fitted[method], method), labels)
    return fitted, [f"prediction sets ({method}, coverage {fitted['coverage']:.0%}): mean held-out size {size:.2f}"]


def _scores(logits: torch.Tensor, temperature: torch.Tensor, scope: str, score: str) -> torch.Tensor:
    """OOD scores of the calibrated model's outputs, exactly as `predict` computes them."""
    out = apply_temperature(logits, temperature, scope)
    return ood_score(out.member_logits.double().softmax(-1), score, out.probs)


def _fit_mahalanobis(ctx: RunContext, model: torch.nn.Module, cfg: dict) -> Mahalanobis:
    """Class means and a shared covariance per member, on the pooled features of (a seeded subset
    of) the train split."""
    train = ctx.data.train
    if len(train) > cfg["feature_samples"]:
        pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(ctx.recipe.seed))
        train = Subset(train, pick[: cfg["feature_samples"]].sort().values.tolist())
    _, labels, features = predict_logits_and_features(model, train, ctx.recipe.data["batch_size"])
    try:
        return Mahalanobis.fit(features, labels)
    except MetricInputError as e:
        raise InputError(f"calibrate.ood_score: mahalanobis: {str(e).split(': ', 1)[-1]}") from e


def _feature_scores(model: torch.nn.Module, score: Mahalanobis, dataset, batch_size: int) -> torch.Tensor:
    """Mahalanobis scores over `dataset`, from the same pooled features `Calibrated.scored` reads."""
    return score(predict_logits_and_features(model, dataset, batch_size)[2])


def _line(fit: TemperatureFit | None, report: dict, ood: dict, notes: list[str]) -> str:
    b, a = report["before"], report["after"]
    if fit is None:
        head = "temperature not fitted (temperature: false)"
    else:
        temps = ", ".join(f"{t:.2f}" for t in fit.temperature.tolist())
        fitted = ", ".join(f"{t:.2f}" for t in fit.fitted)
        head = (
            f"temperature {temps} ({fit.scope}; fitted {fitted}, {'kept' if fit.kept else 'not kept'}); "
            f"{fit.errors} held-out errors of {fit.samples}; held-out NLL on data the fit did not see "
            f"({CHECK_FOLDS}-fold cross-fit) {fit.nll_before:.3f} -> {fit.nll_after:.3f}"
        )
    threshold = (
        f"OOD threshold ({ood['score']}, keeps {ood['tpr']:.0%} of held-out) {ood['threshold']:.4f}"
        if ood
        else "no OOD threshold stored"
    )
    change = f"ECE {b['ece']:.3f} -> {a['ece']:.3f}, accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f}"
    line = f"{head}; {change}; {threshold}"
    return line + "".join(f"; {n}" for n in notes)


def _check(cfg: dict, earlier: list, later: list) -> str | None:
    """A merge before it; mutual information needs members to disagree (a prune of 2 or more, not 'plain')."""
    problem = needs_earlier("merge")(cfg, earlier, later)
    if problem or cfg["ood_score"] != "mi":
        return problem
    members = next((c.get("members", 3) for n, c in reversed(earlier) if n == "prune"), None)
    plain = any(n == "merge" and c.get("merger") == "plain" for n, c in earlier)
    if plain or members == 1:
        return "ood_score 'mi' (mutual information between members) needs an ensemble; the merged model has one member"
    return None


def _preflight(cfg: dict, family: Family) -> None:
    """A feature-based OOD score reads the input of the model's classifier layer: there must be one."""
    if cfg["ood_score"] in FEATURE_SCORES and not isinstance(family.classifier(), torch.nn.Linear):
        kind = type(family.classifier()).__name__
        raise InputError(
            f"ood_score: '{cfg['ood_score']}' reads the pooled features a Linear classifier takes; "
            f"this model's classifier is {kind} (a model without a class head has no features to score)"
        )


@register_step("calibrate", SCHEMA, check=_check, preflight=_preflight)
def calibrate(ctx: RunContext, cfg: dict) -> None:
    """Fit a checked temperature and the OOD threshold that keeps `ood_tpr` of held-out samples."""
    model = ctx.merged.model if isinstance(ctx.merged, Calibrated) else ctx.merged
    batch_size = ctx.recipe.data["batch_size"]
    uses_features = cfg["ood_score"] in FEATURE_SCORES
    if uses_features:  # one pass over the held-out split gives the logits and the features
        logits, labels, val_features = predict_logits_and_features(model, ctx.data.val, batch_size)
    else:
        logits, labels = predict_logits(model, ctx.data.val, batch_size)
    if cfg["ood_score"] == "mi" and logits.shape[0] < 2:
        raise InputError("calibrate.ood_score: 'mi' needs an ensemble (the merged model has one member)")
    scope = "member" if cfg["per_member"] else "ensemble"
    fit = (
        fit_checked_temperature(logits, labels, cfg["per_member"], seed=ctx.recipe.seed) if cfg["temperature"] else None
    )
    temperature = fit.temperature if fit is not None else torch.ones(1)
    feature_score = _fit_mahalanobis(ctx, model, cfg) if uses_features else None

    def score_of(data) -> torch.Tensor:  # exactly what Calibrated.scored gives
        if feature_score is not None:
            return _feature_scores(model, feature_score, data, batch_size)
        return _scores(predict_logits(model, data, batch_size)[0], temperature, scope, cfg["ood_score"])

    scores = (
        feature_score(val_features)
        if feature_score is not None
        else _scores(logits, temperature, scope, cfg["ood_score"])
    )
    outliers = score_of(ctx.data.ood_val) if ctx.data.ood_val is not None else None
    threshold, ood_notes = checked_ood_threshold(scores, cfg["ood_tpr"], outliers)
    ood = {} if threshold is None else {"score": cfg["ood_score"], "tpr": float(cfg["ood_tpr"]), "threshold": threshold}
    conformal, conformal_notes = _conformal(apply_temperature(logits, temperature, scope).probs, labels, cfg)
    ctx.merged = Calibrated(model, temperature, ood, scope, conformal, feature_score=feature_score if ood else None)
    report = {
        name: {"accuracy": accuracy(p, labels), "nll": nll(p, labels), "ece": ece(p, labels)}
        for name, p in (
            ("before", calibrated_probs(logits.double(), torch.ones(1), scope)),
            ("after", calibrated_probs(logits.double(), temperature, scope)),
        )
    }
    notes = (fit.notes if fit is not None else []) + ood_notes + conformal_notes
    ctx.log["calibrate"] = {
        "temperature": temperature.tolist(),
        "scope": scope,
        "ood": ood,
        "conformal": conformal,
        "notes": notes,
        **report,
        **(
            {}
            if fit is None
            else {
                "fitted": fit.fitted,
                "kept": fit.kept,
                "heldout_errors": fit.errors,
                "heldout_samples": fit.samples,
                "crossfit_nll": {"before": fit.nll_before, "after": fit.nll_after},
            }
        ),
    }
    line = _line(fit, report, ood, notes)
    ctx.outcomes["calibrate"] = line
    ctx.say(f"calibrate: {line}")
