"""The evaluate step: accuracy, calibration and OOD metrics for every model, side by side."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.data import DataBundle
from compressor.io import atomic_write_text
from compressor.metrics import classification_report, ood_report
from compressor.predict import predict

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
    ("shift acc", "shift_accuracy"),
    ("shift NLL", "shift_nll"),
    ("params", "params"),
    ("latency x", "latency_ratio"),
]


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def median_latency(model: nn.Module, x: torch.Tensor, repeats: int = 7) -> float:
    model.eval()
    model(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def evaluate_model(model: nn.Module, data: DataBundle, batch_size: int = 256) -> dict:
    """Test, OOD and shift metrics of one model (ensemble metrics from its member probabilities)."""
    probs, labels = predict(model, data.test, batch_size)
    out: dict = {"test": classification_report(probs, labels), "ood": {}, "shift": {}}
    for name, ds in data.ood.items():
        p_out, _ = predict(model, ds, batch_size)
        out["ood"][name] = ood_report(probs, p_out)
    for name, ds in data.shift.items():
        p, y = predict(model, ds, batch_size)
        out["shift"][name] = classification_report(p, y)
    return out


def summarize(result: dict) -> dict[str, float]:
    """One row per model: test metrics, OOD metrics averaged over OOD sets, shift averages."""
    row = dict(result["test"])
    if result["ood"]:
        keys = next(iter(result["ood"].values())).keys()
        for k in keys:
            row[k] = float(np.mean([r[k] for r in result["ood"].values()]))
    if result["shift"]:
        row["shift_accuracy"] = float(np.mean([r["accuracy"] for r in result["shift"].values()]))
        row["shift_nll"] = float(np.mean([r["nll"] for r in result["shift"].values()]))
    for k in ("params", "latency_ratio"):
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
                s = f"{v:.3f}" if k != "latency_ratio" else f"{v:.2f}"
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
    """Evaluate every model; write metrics.json and metrics.md under `out_dir` (if `write`); return them."""
    results = {}
    x = next(iter(torch.utils.data.DataLoader(data.test, batch_size=64)))[0]
    latencies = {}
    for name, model in models.items():
        res = evaluate_model(model, data, batch_size)
        res["params"] = count_params(model)
        latencies[name] = median_latency(model, x)
        results[name] = res
    ref = reference if reference in latencies else next(iter(latencies))
    for name in results:
        results[name]["latency_ratio"] = latencies[name] / latencies[ref]
    rows = {name: summarize(r) for name, r in results.items()}
    table = markdown_table(rows)
    if not write:
        return {"results": results, "summary": rows, "table": table}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "metrics.json", json.dumps({"models": results, "summary": rows}, indent=1))
    note = (
        f"\nOOD columns use the max-softmax score, averaged over OOD sets ({', '.join(data.ood)}); "
        f"shift columns average {', '.join(data.shift)}; latency is the median at batch 64 relative to "
        f"'{ref}'.\n"
    )
    atomic_write_text(out_dir / "metrics.md", table + note)
    return {"results": results, "summary": rows, "table": table}
