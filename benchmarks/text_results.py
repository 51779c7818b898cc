"""The pretrained benchmarks' results over seeds: per-seed files joined into benchmarks/results/
<stem>.json (means, spreads, every seed's rows) and a markdown table (<stem>.md); text_table.py
runs the seeds, cost_quality.py adds the side-by-side CPU latency and the plot."""

from __future__ import annotations

import json

import numpy as np
from uq_table import RESULTS


def stem(task: str) -> str:
    """The results files' name for a task."""
    return "image_fashion" if task == "fashion" else f"text_{task}"


COLUMNS = [
    ("acc", "accuracy"), ("NLL", "nll"), ("ECE", "ece"), ("Brier", "brier"), ("AUROC", "auroc_msp"),
    ("FPR95", "fpr95_msp"), ("AUROC(MI)", "auroc_mi"), ("disagree", "disagreement"),
    ("FLOPs x", "flops_ratio"), ("params x", "params_ratio"), ("CPU latency x", "latency_ratio"),
]  # fmt: skip


def table(mean: dict, std: dict, sets: list[str], seeds: dict[str, list[int]] | None = None) -> str:
    """Markdown: COLUMNS then AUROC per OOD set, mean ± std over seeds (a row measured on one seed
    shows its value alone, its name says which seed)."""
    cols = [c for c in COLUMNS if any(c[1] in r for r in mean.values())] + [(f"AUROC {s}", f"auroc/{s}") for s in sets]
    lines = ["| model | " + " | ".join(h for h, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in mean.items():
        cells = []
        for _, k in cols:
            if k not in r:
                cells.append("")
            elif k.endswith("_ratio"):
                cells.append(f"{r[k]:.2f}")
            elif len((seeds or {}).get(name, [0, 1])) == 1:
                cells.append(f"{r[k]:.3f}")
            else:
                cells.append(f"{r[k]:.3f} ± {std[name][k]:.3f}")
        only = (seeds or {}).get(name, [0, 1])
        label = f"{name} (seed {only[0]} only)" if len(only) == 1 else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def architecture(row: str) -> str:
    """The model a row runs (rows that differ only in training or OOD score share one)."""
    name = row.removesuffix(" + Mahalanobis")
    for training_only in (", tuned after the merge", ", last weights kept"):
        name = name.replace(training_only, "")
    return "base" if name.startswith("base") else name


def merge(task: str, seeds: list[int]) -> None:
    """Mean and std over seeds of every row in text_<task>_seed<s>.json: text_<task>.json and .md."""
    files = {
        s: sorted(RESULTS.glob(f"{stem(task)}_seed{s}.json")) + sorted(RESULTS.glob(f"{stem(task)}_seed{s}_*.json"))
        for s in seeds
    }
    summary = RESULTS / f"{stem(task)}.json"
    earlier = {p["seed"]: p for p in json.loads(summary.read_text())["per_seed"]} if summary.is_file() else {}
    per_seed = []
    for s, paths in files.items():  # one seed's rows: an earlier merge's, then its main run and any other part
        parts = [json.loads(p.read_text()) for p in paths]
        main_part = [p for p, path in zip(parts, paths) if path.name == f"{stem(task)}_seed{s}.json"]
        before = earlier.get(s, {"rows": {}})["rows"]
        minutes = sum(p["rows"].get("_minutes", {}).get("total", 0.0) for p in main_part)  # the main rows' run
        minutes = minutes or before.get("_minutes", {}).get("total", 0.0)
        rows = before | {k: v for p in parts for k, v in p["rows"].items()} | {"_minutes": {"total": minutes}}
        per_seed.append({"task": task, "seed": s, "rows": rows})
    names = list(dict.fromkeys(n for p in per_seed for n in p["rows"] if n != "_minutes"))
    have = {n: [p["rows"][n] for p in per_seed if n in p["rows"]] for n in names}
    keys = {n: [k for k in have[n][0] if isinstance(have[n][0][k], float) and k != "minutes"] for n in names}
    mean = {n: {k: float(np.mean([r[k] for r in have[n]])) for k in keys[n]} for n in names}
    std = {n: {k: float(np.std([r[k] for r in have[n]])) for k in keys[n]} for n in names}
    sets = [k.split("/", 1)[1] for k in mean["base"] if k.startswith("auroc/")]
    minutes = {str(p["seed"]): round(p["rows"]["_minutes"]["total"], 1) for p in per_seed}
    latency = json.loads(summary.read_text()).get("cpu_latency") if summary.is_file() else None
    if latency:  # the side-by-side CPU latency (cost_quality.py --latency) of each row's architecture
        for n in mean:
            ratio = latency["ratios"].get(architecture(n))
            mean[n].pop("latency_ratio", None)
            if ratio is not None:
                mean[n]["latency_ratio"], std[n]["latency_ratio"] = ratio, 0.0
    payload = {
        "task": task, "seeds_per_row": {n: [p["seed"] for p in per_seed if n in p["rows"]] for n in names},
        "minutes_per_seed": minutes, "mean": mean, "std": std, "per_seed": per_seed,
        **({"cpu_latency": latency} if latency else {}),
    }  # fmt: skip
    (RESULTS / f"{stem(task)}.json").write_text(json.dumps(payload, indent=1))
    md = table(mean, std, sets, payload["seeds_per_row"])
    (RESULTS / f"{stem(task)}.md").write_text(md)
    for path in (p for paths in files.values() for p in paths):
        path.unlink()
    print(md)
