"""The cost-quality picture of a pretrained task: FLOPs (ratio to the base) against mean OOD AUROC
and test NLL, one point per row of benchmarks/results/<stem>.json (means over its seeds), rows
scored by Mahalanobis distance drawn hollow. Writes benchmarks/results/<stem>.png.

    python benchmarks/cost_quality.py --task topics              # the plot (topics, sentiment or fashion)
    python benchmarks/cost_quality.py --task topics --latency    # CPU latency of every architecture

`--latency` rebuilds each configuration's fused model from the base and a row's masks (seed 0 under
runs/<stem>; latency does not depend on the weights) and times all of them side by side in one
process, in turn, batch 64: median ratios to the base, written to benchmarks/results/<stem>.json
as `cpu_latency` (run it on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from text_table import AVERAGED, PRUNED, RECIPES, RESULTS, recipe, row_folder, stem

# the Hydra rows whose architecture differs (rows of the same architecture share its latency)
ARCHITECTURES = {
    AVERAGED: "average",
    f"{AVERAGED}, 1/3 of the heads": "average",
    f"{AVERAGED}, shared trunk of 3 blocks": "average",
    f"{AVERAGED}, shared trunk of 4 blocks": "average",
    f"{AVERAGED}, shared trunk of 6 blocks": "average",
    f"{AVERAGED}, shared trunk of 8 blocks": "average",
    PRUNED: "pruned",
}


SHORT = {
    AVERAGED: "hydra avg", PRUNED: "hydra 1/3 MLP", "deep_ensemble x3": "deep ensemble", ", shared trunk of ": " trunk",
    " blocks": "", " of ": " ", ", last weights kept": " (last)", ", tuned after the merge": " tuned after merge",
    " + Mahalanobis": " + Maha", ", members tuned, then 50 steps after the merge": " + 50 merged steps",
}  # fmt: skip
SAME_NLL = ("Mahalanobis", "energy", "kNN")  # an OOD score only: the NLL of the row it scores


def short(name: str) -> str:
    for long, brief in SHORT.items():
        name = name.replace(long, brief)
    return name


def plot(task: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payload = json.loads((RESULTS / f"{stem(task)}.json").read_text())
    mean, seeds = payload["mean"], payload["seeds_per_row"]
    wanted = {
        n: r for n, r in mean.items() if "flops_ratio" in r and ("hydra" not in n or "averaged" in n or "MLP" in n)
    }
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, key, label in (
        (axes[0], "auroc_msp", "mean OOD AUROC (higher is better)"),
        (axes[1], "nll", "test NLL (lower is better)"),
    ):
        for name, r in wanted.items():
            if key == "nll" and any(k in name for k in SAME_NLL):
                continue
            hollow = "Mahalanobis" in name
            colour = "tab:red" if "hydra" in name else "tab:blue" if "deep" in name else "tab:gray"
            ax.scatter(r["flops_ratio"], r[key], s=50, facecolors="none" if hollow else colour, edgecolors=colour)
            tag = short(name) + ("" if len(seeds.get(name, [])) > 1 else f" (s{seeds[name][0]})")
            ax.annotate(tag, (r["flops_ratio"], r[key]), fontsize=6.5, xytext=(4, 2), textcoords="offset points")
        ax.set_xlabel("FLOPs per sample, x the base (FlopCounterMode)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{task}: cost against uncertainty (hollow: Mahalanobis score; means over seeds)")
    fig.tight_layout()
    out = RESULTS / f"{stem(task)}.png"
    fig.savefig(out, dpi=130)
    return str(out)


def models_to_time(task: str, runs: Path) -> dict[str, torch.nn.Module]:
    """base, the Deep Ensemble (3 copies of the base), MC dropout (text: 4 passes) and every Hydra
    architecture with masks under runs/<stem>/seed0, each rebuilt as the merge step builds it."""
    from compressor.core.masks import load_masks
    from compressor.families import masked_member
    from compressor.run.recipe import validate_recipe
    from compressor.run.runner import Runner
    from compressor.uq.outputs import DeepEnsemble, MCDropout
    from mergers.hydra import HydraMerger

    raw = recipe(task) | {"seed": 0, "cache_dir": str(runs / ".cache")}
    raw["steps"] = [s for s in raw["steps"] if "prune" in s]  # validated, never run: setup() builds base + data
    ctx = Runner(validate_recipe(raw, where="cost_quality"), runs / "latency", quiet=True).setup()
    base = ctx.base.eval()
    models = {"base": base, "deep_ensemble x3": DeepEnsemble([copy.deepcopy(base) for _ in range(3)])}
    if raw["data"]["source"] == "text":
        models["mc_dropout"] = MCDropout(base, samples=4)
    calib = [b[0] for b in ctx.calibration()[0]]
    for name, mlp in ARCHITECTURES.items():
        folder = row_folder(runs / "seed0", name)
        if name == PRUNED and not (folder / "masks.json").is_file():
            folder = row_folder(runs / "seed0", AVERAGED)  # the same head masks; the merge keeps 1/M of each MLP
        if not (folder / "masks.json").is_file():
            continue
        masks = load_masks(folder / "masks.json")
        members = [masked_member(base, m) for m in masks]
        models[name] = HydraMerger(mlp=mlp).merge(base, masks, members, calib).eval()
    return models, next(iter(torch.utils.data.DataLoader(ctx.data.test, batch_size=64)))[0]


def measure_latency(task: str, runs: Path) -> dict[str, float]:
    from compressor.uq.evaluate import latency_ratios

    models, x = models_to_time(task, runs)
    ratios = latency_ratios(models, x, "base", rounds=15)
    path = RESULTS / f"{stem(task)}.json"
    payload = json.loads(path.read_text())
    payload["cpu_latency"] = {
        "ratios": ratios, "batch": len(x), "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"), "how": "every model in turn, median of 15 rounds (latency_ratios)",
    }  # fmt: skip
    path.write_text(json.dumps(payload, indent=1))
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(RECIPES), required=True)
    p.add_argument("--latency", action="store_true", help="time every architecture side by side (idle machine)")
    p.add_argument("--runs", default=None, help="the text_table run folder (default runs/<stem>)")
    args = p.parse_args()
    if args.latency:
        for name, ratio in measure_latency(args.task, Path(args.runs or f"runs/{stem(args.task)}")).items():
            print(f"{ratio:6.2f}x  {name}")
        return
    print(plot(args.task))


if __name__ == "__main__":
    main()
