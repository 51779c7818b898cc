"""The evaluate step: accuracy, calibration and OOD metrics for every model, side by side."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.core.device import model_device, synchronize
from compressor.core.errors import MetricInputError
from compressor.core.io import atomic_write_text, json_text
from compressor.core.modes import evaluating, frozen
from compressor.data.bundle import DataBundle
from compressor.uq.calibrated import Calibrated
from compressor.uq.conformal import (
    CONFORMAL_METHODS,
    DEFAULT_COVERAGE,
    coverage_and_size,
    fit_conformal,
    prediction_sets,
)
from compressor.uq.inference import predict, predict_with_features
from compressor.uq.metrics import aupr, auroc, classification_report, fpr_at_tpr, ood_report

SUMMARY_COLUMNS = [
    ("acc", "accuracy"),
    ("NLL", "nll"),
    ("Brier", "brier"),
    ("ECE", "ece"),
    ("aECE", "adaptive_ece"),
    ("AUROC", "auroc_msp"),
    ("AUPR", "aupr_msp"),
    ("FPR95", "fpr95_msp"),
    ("AUROC(MI)", "auroc_mi"),
    ("AUROC(Maha)", "auroc_mahalanobis"),
    ("FPR95(Maha)", "fpr95_mahalanobis"),
    ("AUROC near", "auroc_near"),
    ("AUROC far", "auroc_far"),
    ("AURC", "aurc"),
    ("cov LAC", "coverage_lac"),
    ("size LAC", "set_size_lac"),
    ("cov APS", "coverage_aps"),
    ("size APS", "set_size_aps"),
    ("disagree", "disagreement"),
    ("shift acc", "shift_accuracy"),
    ("shift NLL", "shift_nll"),
    ("shift ECE", "shift_ece"),
    ("params", "params"),
    ("params x", "params_ratio"),
    ("MFLOPs", "mflops"),
    ("FLOPs x", "flops_ratio"),
    ("latency x", "latency_ratio"),
]


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def flops_per_sample(model: nn.Module, x: torch.Tensor) -> float:
    """FLOPs of one forward pass per sample, counted by torch.utils.flop_counter.FlopCounterMode
    (matrix multiplications, convolutions and attention; elementwise work is not counted).
    Parameters are frozen while counting: the counter's module tracker fails on a parameter that
    enters a submodule as its input under no_grad (timm's attention-pool latent)."""
    from torch.utils.flop_counter import FlopCounterMode

    with evaluating(model), frozen(model), FlopCounterMode(display=False) as counter:
        model(x.to(model_device(model)))
    return counter.get_total_flops() / len(x)


@torch.no_grad()
def latency_ratios(models: dict[str, nn.Module], x: torch.Tensor, reference: str, rounds: int = 9) -> dict[str, float]:
    """Each model's forward time over the `reference` model's, the median over `rounds` rounds in
    which every model runs once, in turn (after one warm-up pass each), GPU work waited for: a burst
    of load on a shared machine lands on the models of one round alike, not on one model's repeats."""
    for model in models.values():
        model.eval()(x.to(model_device(model)))
    ratios: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        seconds = {}
        for name, model in models.items():
            device = model_device(model)
            xs = x.to(device)
            synchronize(device)
            t0 = time.perf_counter()
            model(xs)
            synchronize(device)
            seconds[name] = time.perf_counter() - t0
        for name in models:
            ratios[name].append(seconds[name] / seconds[reference])
    return {name: float(np.median(r)) for name, r in ratios.items()}


def conformal_test_report(model: nn.Module, data: DataBundle, test, batch_size: int, coverage: float) -> dict:
    """Test-split coverage and mean set size of LAC and APS prediction sets: with the thresholds the
    calibrate step stored in the model, else fitted here on the held-out split at `coverage`
    (nothing when there is no held-out split or it is too small for that coverage)."""
    thresholds = model.conformal if isinstance(model, Calibrated) else None
    if not thresholds and data.val is not None:
        held = predict(model, data.val, batch_size)
        try:
            thresholds = fit_conformal(held.probs, held.labels, coverage)
        except MetricInputError:
            thresholds = None
    out = {}
    for method in CONFORMAL_METHODS if thresholds else ():
        sets = prediction_sets(test.probs, thresholds[method], method)
        out[f"coverage_{method}"], out[f"set_size_{method}"] = coverage_and_size(sets, test.labels)
    return out


def evaluate_model(
    model: nn.Module,
    data: DataBundle,
    batch_size: int = 256,
    keep: dict | None = None,
    coverage: float = DEFAULT_COVERAGE,
) -> dict:
    """Test, OOD and shift metrics of one model (ensemble metrics from its own ensemble prediction,
    which is calibrated where the model is; diversity from its member probabilities).

    `keep`, when given, receives the ensemble probabilities behind them (for plots): keep["test"] =
    (probs, labels), keep["ood"][name] = probs. Conformal sets: `conformal_test_report`.
    """
    score = model.ood["score"] if isinstance(model, Calibrated) and model.feature_score is not None else None

    def predicted(ds):  # the predictions, and a feature-based OOD score read in the same passes
        if score is None:
            return predict(model, ds, batch_size), None
        predictions, features = predict_with_features(model, ds, batch_size)
        return predictions, model.feature_score(features).numpy()

    test, s_test = predicted(data.test)
    out: dict = {
        "test": classification_report(test.member_probs, test.labels, test.probs)
        | conformal_test_report(model, data, test, batch_size, coverage),
        "ood": {},
        "shift": {},
        "ood_kind": data.ood_kinds,
    }
    if keep is not None:
        keep["test"], keep["ood"] = (test.probs, test.labels), {}
    for name, ds in data.ood.items():
        outside, s_out = predicted(ds)
        out["ood"][name] = ood_report(test.member_probs, outside.member_probs, test.probs, outside.probs)
        if score:
            out["ood"][name] |= {
                f"auroc_{score}": auroc(s_test, s_out),
                f"aupr_{score}": aupr(s_test, s_out),
                f"fpr95_{score}": fpr_at_tpr(s_test, s_out),
            }
        if keep is not None:
            keep["ood"][name] = outside.probs
    for name, ds in data.shift.items():
        shifted = predict(model, ds, batch_size)
        out["shift"][name] = classification_report(shifted.member_probs, shifted.labels, shifted.probs)
    return out


def summarize(result: dict) -> dict[str, float]:
    """One row per model: test metrics, OOD metrics averaged over OOD sets, shift averages."""
    row = dict(result["test"])
    if result["ood"]:
        keys = next(iter(result["ood"].values())).keys()
        for k in keys:
            row[k] = float(np.mean([r[k] for r in result["ood"].values()]))
        kinds = result.get("ood_kind") or {}
        for kind in ("near", "far"):
            sets = [r for name, r in result["ood"].items() if kinds.get(name) == kind]
            for k in ("auroc_msp", "fpr95_msp"):
                if sets:
                    row[f"{k.split('_')[0]}_{kind}"] = float(np.mean([r[k] for r in sets]))
    if result["shift"]:
        row["shift_accuracy"] = float(np.mean([r["accuracy"] for r in result["shift"].values()]))
        row["shift_nll"] = float(np.mean([r["nll"] for r in result["shift"].values()]))
        row["shift_ece"] = float(np.mean([r["ece"] for r in result["shift"].values()]))
    for k in ("params", "params_ratio", "mflops", "flops_ratio", "latency_ratio"):
        if k in result:
            row[k] = result[k]
    return row


def markdown_table(rows: dict[str, dict[str, float]], std: dict[str, dict[str, float]] | None = None) -> str:
    """Models as rows, SUMMARY_COLUMNS as columns (mean ± std where `std` is given)."""
    cols = [(h, k) for h, k in SUMMARY_COLUMNS if any(k in r for r in rows.values())]
    lines = ["| model | " + " | ".join(h for h, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        cells = []
        for _, k in cols:
            v = r.get(k)
            if v is None:
                cells.append("")
            elif k == "params":
                cells.append(f"{v / 1e6:.2f}M")
            else:
                s = f"{v:.2f}" if k in ("latency_ratio", "params_ratio", "flops_ratio", "mflops") else f"{v:.3f}"
                if std and name in std and k in std[name]:
                    s += f" ± {std[name][k]:.3f}"
                cells.append(s)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluate_models(
    models: dict[str, nn.Module],
    data: DataBundle,
    out_dir: Path,
    batch_size: int = 256,
    reference: str | None = None,
    write: bool = True,
) -> dict:
    """Evaluate every model; write metrics.json and metrics.md under `out_dir` (if `write`); return them.
    Conformal sets of every model at the coverage a calibrated model stores (else DEFAULT_COVERAGE)."""
    stored = [m.conformal["coverage"] for m in models.values() if isinstance(m, Calibrated) and m.conformal]
    coverage = stored[0] if stored else DEFAULT_COVERAGE
    results, arrays = {}, {}
    x = next(iter(torch.utils.data.DataLoader(data.test, batch_size=64)))[0]
    for name, model in models.items():
        arrays[name] = {}
        res = evaluate_model(model, data, batch_size, keep=arrays[name], coverage=coverage)
        res["params"] = count_params(model)
        res["mflops"] = flops_per_sample(model, x[:16]) / 1e6
        results[name] = res
    ref = reference if reference in models else next(iter(models))
    latency = latency_ratios(models, x, ref)
    for name, res in results.items():
        res["latency_ratio"] = latency[name]
        res["params_ratio"] = res["params"] / results[ref]["params"]
        res["flops_ratio"] = res["mflops"] / results[ref]["mflops"]
    rows = {name: summarize(r) for name, r in results.items()}
    table = markdown_table(rows)
    if not write:
        return {"results": results, "summary": rows, "table": table, "arrays": arrays}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "metrics.json", json_text({"models": results, "summary": rows}))
    note = (
        f"\nOOD columns use the max-softmax score, averaged over OOD sets ({', '.join(data.ood)}); "
        f"shift columns average {', '.join(data.shift)}; FLOPs per sample are counted by "
        f"torch.utils.flop_counter.FlopCounterMode; latency is the median at batch 64; ratios are to '{ref}'.\n"
    )
    atomic_write_text(out_dir / "metrics.md", table + note)
    return {"results": results, "summary": rows, "table": table, "arrays": arrays}
