"""How long loading and tokenizing a large CSV takes through `data.source: dataset`, and its peak
memory: N text rows (default 100,000, made from the committed topics texts), MiniLM's tokenizer.

    python benchmarks/dataset_scale.py --rows 100000

Runs the load in a fresh process so its peak resident memory is the load's own; writes
benchmarks/results/dataset_scale.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_csv(folder: Path, rows: int) -> None:
    from compressor.data.text import task_rows

    source = [r for r in task_rows("topics") if r["split"] in ("train", "val", "test")]
    for split, n in (("train", rows), ("test", max(2, rows // 10))):
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for i in range(n):
                r = source[i % len(source)]
                w.writerow([f"{r['text']} ({split} {i})", r["label"]])


def measure(folder: Path) -> dict:
    """In this process: validate-time read and checks, then the bundle (tokenized splits)."""
    from compressor.data.dataset_source import dataset_bundle, read_user_dataset
    from compressor.run.recipe import DATA_SCHEMA

    d = {k: f.default for k, f in DATA_SCHEMA.items()}
    d.update(source="dataset", path="csv", data_files={"train": "train.csv", "test": "test.csv"}, text_column="text")
    t0 = time.perf_counter()
    read_user_dataset(d, folder)
    t_checks = time.perf_counter() - t0
    bundle = dataset_bundle(d, folder, "minilm")
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"rows": len(bundle.train) + len(bundle.val), "checks_s": t_checks, "total_s": total, "peak_gib": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        write_csv(Path(tmp), args.rows)
        out = subprocess.run([sys.executable, __file__, "--child", tmp], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (ROOT / "benchmarks" / "results" / "dataset_scale.json").write_text(json.dumps(result, indent=1) + "\n")
    print(result)


if __name__ == "__main__":
    main()
