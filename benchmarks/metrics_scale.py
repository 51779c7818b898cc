"""Every metric at ImageNet scale, beside torchmetrics: 1M samples x 1,000 classes (3 members for
the ensemble metrics) and 1M in-distribution + 1M OOD scores. Each metric runs in its own child
process, so each peak (the child's high-water RSS) is that metric's alone, inputs included.

    python benchmarks/metrics_scale.py              # ~10 minutes, at most ~8 GiB at a time, on 2 cores
    python benchmarks/metrics_scale.py --n 200000   # smaller
    python benchmarks/metrics_scale.py --only pairwise_kl classification_report   # rerun rows

Inputs: float32 probabilities (4 GB at 1M x 1,000); member probabilities as float16 numpy arrays
(3 members: 6 GB; float32 would be 12 GB before any metric runs).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from compressor.uq import metrics as M

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
CHUNK = 1 << 12  # rows per chunk while building the inputs (small, so that building adds little to the peak)
SINGLE = {  # metric -> (function, arguments)
    "accuracy": (M.accuracy, "probs,labels"),
    "nll": (M.nll, "probs,labels"),
    "brier": (M.brier, "probs,labels"),
    "ece": (M.ece, "probs,labels"),
    "adaptive_ece": (M.adaptive_ece, "probs,labels"),
    "aurc": (M.aurc, "probs,labels"),
    "augrc": (M.augrc, "probs,labels"),
    "entropy_score": (lambda p: float(M.entropy_score(p).mean()), "probs"),
    "auroc": (M.auroc, "s_in,s_out"),
    "aupr": (M.aupr, "s_in,s_out"),
    "fpr95": (M.fpr_at_tpr, "s_in,s_out"),
    "mutual_information_score": (lambda mp: float(M.mutual_information_score(mp).mean()), "members"),
    "pairwise_kl": (M.pairwise_kl, "members"),
    "classification_report": (lambda mp, y: M.classification_report(mp, y)["nll"], "members,labels"),
}
THEIRS = {  # torchmetrics on the same inputs
    "accuracy": "probs,labels",
    "ece": "probs,labels",
    "auroc": "s_in,s_out",
    "aupr": "s_in,s_out",
}


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def make_inputs(names: str, n: int, classes: int) -> dict:
    """The named inputs only (seeded; built in chunks so that building them holds no extra copy)."""
    g = torch.Generator().manual_seed(0)
    out: dict = {"labels": torch.randint(0, classes, (n,), generator=g)}
    if "probs" in names:
        probs = torch.empty(n, classes)
        for s in range(0, n, CHUNK):
            probs[s : s + CHUNK] = (3 * torch.randn(min(CHUNK, n - s), classes, generator=g)).softmax(-1)
        out["probs"] = probs
    if "members" in names:
        members = np.empty((3, n, classes), dtype=np.float16)
        for m in range(3):
            for s in range(0, n, CHUNK):
                z = (3 * torch.randn(min(CHUNK, n - s), classes, generator=g)).double().softmax(-1)
                members[m, s : s + CHUNK] = z.numpy().astype(np.float16)
        out["members"] = members
    if "s_in" in names:
        out["s_in"], out["s_out"] = torch.randn(n, generator=g), torch.randn(n, generator=g) + 1.0
    return out


def theirs(name: str, x: dict, classes: int) -> float:
    import torchmetrics.functional.classification as tm

    if name == "accuracy":
        return float(tm.multiclass_accuracy(x["probs"], x["labels"], classes, average="micro"))
    if name == "ece":
        return float(tm.multiclass_calibration_error(x["probs"], x["labels"], classes, n_bins=15, norm="l1"))
    s, y = torch.cat([x["s_in"], x["s_out"]]), torch.cat([torch.zeros(len(x["s_in"])), torch.ones(len(x["s_out"]))])
    return float((tm.binary_auroc if name == "auroc" else tm.binary_average_precision)(s, y.long()))


def child(name: str, who: str, n: int, classes: int) -> None:
    """One metric (ours or torchmetrics') in this process: prints value, seconds and peak GiB."""
    args = SINGLE[name][1] if who == "ours" else THEIRS[name]
    x = make_inputs(args, n, classes)
    if who != "ours":
        import torchmetrics.functional.classification  # noqa: F401  (its import is not its run time)
    input_gib = peak_gib()
    t0 = time.perf_counter()
    if who == "ours":
        value = float(SINGLE[name][0](*[x[a] for a in args.split(",")]))
    else:
        value = theirs(name, x, classes)
    seconds = time.perf_counter() - t0
    print(json.dumps({"value": value, "seconds": seconds, "peak_gib": peak_gib(), "input_gib": input_gib}))


def run(name: str, who: str, n: int, classes: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name, who, "--n", str(n), "--classes", str(classes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--only", nargs="+", choices=list(SINGLE), help="rerun these metrics, keep the other rows")
    p.add_argument("--child", nargs=2, metavar=("METRIC", "WHO"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, args.n, args.classes)
        return
    saved = RESULTS / "metrics_scale.json"
    old = json.loads(saved.read_text()) if args.only and saved.is_file() else {}
    same_size = old.get("n") == args.n and old.get("classes") == args.classes
    rows = dict(old.get("rows", {})) if same_size else {}
    for name in args.only or SINGLE:
        rows[name] = {"ours": run(name, "ours", args.n, args.classes), "date": time.strftime("%Y-%m-%d")}
        if name in THEIRS:
            rows[name]["torchmetrics"] = run(name, "torchmetrics", args.n, args.classes)
        print(name, json.dumps(rows[name]), flush=True)
    rows = {name: rows[name] for name in SINGLE if name in rows}
    payload = {"n": args.n, "classes": args.classes, "members": 3, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "metrics_scale.json").write_text(json.dumps(payload, indent=1))
    print(f"\n{args.n} samples x {args.classes} classes (3 float16 members for ensemble metrics)")
    print("| metric | ours | s | peak GiB (inputs) | torchmetrics | s | peak GiB |\n|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        o, t = r["ours"], r.get("torchmetrics")
        theirs_cells = f"{t['value']:.6f} | {t['seconds']:.1f} | {t['peak_gib']:.1f}" if t else " | | "
        print(
            f"| {name} | {o['value']:.6f} | {o['seconds']:.1f} | {o['peak_gib']:.1f} ({o['input_gib']:.1f}) "
            f"| {theirs_cells} |"
        )


if __name__ == "__main__":
    main()
