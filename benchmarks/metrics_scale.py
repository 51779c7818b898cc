"""Every metric at ImageNet scale, beside torchmetrics in the same run: 1M samples x 1,000 classes
and 1M in-distribution + 1M OOD scores; wall time and peak memory (the process's high-water mark).

    python benchmarks/metrics_scale.py              # ~5 minutes and ~6 GiB on 2 cores
    python benchmarks/metrics_scale.py --n 200000   # smaller
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from compressor.uq import metrics as M

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn, *args):
    t0 = time.perf_counter()
    value = fn(*args)
    return float(value), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    probs = torch.empty(args.n, args.classes)
    for s in range(0, args.n, 1 << 16):  # float32 probabilities, made in chunks (4 GB at 1M x 1000)
        probs[s : s + (1 << 16)] = (3 * torch.randn(min(1 << 16, args.n - s), args.classes, generator=g)).softmax(-1)
    labels = torch.randint(0, args.classes, (args.n,), generator=g)
    s_in, s_out = torch.randn(args.n, generator=g), torch.randn(args.n, generator=g) + 1.0
    base_gib = peak_gib()
    ours = {
        "accuracy": timed(M.accuracy, probs, labels),
        "nll": timed(M.nll, probs, labels),
        "brier": timed(M.brier, probs, labels),
        "ece": timed(M.ece, probs, labels),
        "aurc": timed(M.aurc, probs, labels),
        "auroc": timed(M.auroc, s_in, s_out),
        "aupr": timed(M.aupr, s_in, s_out),
        "fpr95": timed(M.fpr_at_tpr, s_in, s_out),
    }
    ours_gib = peak_gib()
    import torchmetrics.functional.classification as tm

    y = torch.cat([torch.zeros(args.n), torch.ones(args.n)]).long()
    s = torch.cat([s_in, s_out])
    theirs = {
        "accuracy": timed(lambda: tm.multiclass_accuracy(probs, labels, args.classes, average="micro")),
        "ece": timed(lambda: tm.multiclass_calibration_error(probs, labels, args.classes, n_bins=15, norm="l1")),
        "auroc": timed(lambda: tm.binary_auroc(s, y)),
        "aupr": timed(lambda: tm.binary_average_precision(s, y)),
    }
    rows = {
        name: {
            "ours": ours[name][0],
            "ours_s": ours[name][1],
            "torchmetrics": theirs.get(name, (None,))[0],
            "torchmetrics_s": theirs.get(name, (None, None))[1],
        }
        for name in ours
    }
    payload = {
        "n": args.n,
        "classes": args.classes,
        "input_gib": base_gib,
        "peak_gib_ours": ours_gib,
        "peak_gib_all": peak_gib(),
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "metrics_scale.json").write_text(json.dumps(payload, indent=1))
    print(f"{args.n} samples x {args.classes} classes; inputs {base_gib:.1f} GiB peak; ours {ours_gib:.1f} GiB peak")
    print("| metric | ours | s | torchmetrics | s |\n|---|---|---|---|---|")
    for name, r in rows.items():
        tmv = "" if r["torchmetrics"] is None else f"{r['torchmetrics']:.6f} | {r['torchmetrics_s']:.1f}"
        print(f"| {name} | {r['ours']:.6f} | {r['ours_s']:.1f} | {tmv or ' | '} |")


if __name__ == "__main__":
    main()
