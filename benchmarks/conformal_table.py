"""Conformal prediction sets of the default recipe over seeds: test coverage and mean set size
(LAC and APS at the calibrate step's coverage) for every model the evaluate step reports, read
from finished runs' metrics.json, with the two-binomial-standard-error band around the target.

    compressor apply recipes/vit_hydra.yaml --set seed=0 --out runs/conformal/seed0   # and 1, 2
    python benchmarks/conformal_table.py runs/conformal/seed0 runs/conformal/seed1 runs/conformal/seed2
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
COLUMNS = ("accuracy", "coverage_lac", "set_size_lac", "coverage_aps", "set_size_aps")


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders (one per seed)")
    p.add_argument("--coverage", type=float, default=0.9, help="the calibrate step's conformal_coverage")
    p.add_argument("--n-test", type=int, default=None, help="test split size (default: the digits default's)")
    args = p.parse_args()
    if args.n_test is None:
        from compressor.data import digits_bundle

        args.n_test = len(digits_bundle().test)
    per_model: dict[str, list[dict]] = {}
    for run in args.runs:
        models = json.loads((run / "metrics.json").read_text())["models"]
        for name, result in models.items():
            per_model.setdefault(name, []).append({k: result["test"][k] for k in COLUMNS})
    rows = {name: {k: [r[k] for r in runs] for k in COLUMNS} for name, runs in per_model.items()}
    band = 2 * math.sqrt(args.coverage * (1 - args.coverage) / args.n_test)
    payload = {"date": time.strftime("%Y-%m-%d"), "runs": [str(r) for r in args.runs], "coverage": args.coverage}
    payload |= {"n_test": args.n_test, "two_binomial_se": band}
    payload["models"] = rows
    (RESULTS / "conformal_default.json").write_text(json.dumps(payload, indent=1))
    print("| model | " + " | ".join(COLUMNS) + " |\n" + "|---" * (len(COLUMNS) + 1) + "|")
    for name, cols in rows.items():
        print(f"| {name} | " + " | ".join(mean_std(cols[k]) for k in COLUMNS) + " |")
    print(f"target {args.coverage}: two binomial standard errors at n = {args.n_test}: {band:.3f}")


if __name__ == "__main__":
    main()
