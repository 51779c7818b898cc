"""Cost-quality table: uncertainty of Hydra configurations beside their FLOPs and parameters, next
to the base model, a 3-model Deep Ensemble, MC dropout and single pruned models.

    python benchmarks/uq_table.py --rows calibrate --baselines base   # the recipe as it ships, +/- calibrate
    python benchmarks/uq_table.py --rows reinit --de-steps 370         # with a training-matched Deep Ensemble
    python benchmarks/uq_table.py --in-classes 2 3 4 5 6 7 8 9 ...     # another class split

Digits: ID = digits 0-7 (or --in-classes), OOD = the other digits and crops of scikit-learn's
sample photos, shift = noisy, blurred and rotated test digits (text: benchmarks/text_table.py).
Rows are built by the recipe engine from the same cached base per seed; rows that
share a prune step reuse its masks. Results (mean and std over seeds) go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import yaml

from compressor.run.recipe import validate_recipe
from compressor.run.runner import Runner
from compressor.uq.evaluate import markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _prune(pruner: str, members: int = 3, keep: float = 0.5, **kw) -> dict:
    return {"prune": {"pruner": pruner, "members": members, "keep_ratio": keep, **kw}}


def _hydra(mlp: str, **kw) -> dict:
    return {"merge": {"merger": "hydra", "mlp": mlp, **kw}}


def recipe_steps() -> list[dict]:
    """recipes/vit_hydra.yaml's steps up to its evaluate, unchanged."""
    steps = yaml.safe_load((ROOT / "recipes" / "vit_hydra.yaml").read_text())["steps"]
    return [s for s in steps if next(iter(s)) not in ("evaluate", "export")]


def packed_steps(fused: bool, **finetune: object) -> list[dict]:
    """vit_hydra.yaml's packed pipeline written out (the comparison must not move with the recipe):
    every block and classifier redrawn, 370 steps; `fused`: merged first, trained once as one model."""
    prune = {"prune": {"pruner": "taylor", "members": 3, "keep_ratio": 0.5, "mlp_keep_ratio": 0.3333}}
    tune = {"target": "merged" if fused else "members", "steps": 370, "lr": 0.001, "patience": 3}
    tune |= {"reinit_head": True, "reinit_blocks": "all", **finetune}
    merge = {"merge": {"merger": "hydra", "mlp": "pruned"}}
    return [prune, *([merge, {"finetune": tune}] if fused else [{"finetune": tune}, merge]), {"calibrate": {}}]


def default_recipe_steps(**finetune: object) -> list[dict]:
    """The members-first packed pipeline with its member fine-tune set to the from-base Hydra the rows
    named "default recipe" measured (200 steps, no block re-initialised), and `finetune` changes."""
    steps = packed_steps(fused=False)
    next(s for s in steps if "finetune" in s)["finetune"].update({"steps": 200, "reinit_blocks": 0, **finetune})
    return steps


PACKED_SEPARATE = "packed, members trained one by one"
PACKED_FUSED = "packed, trained as one fused model"
PACKED_FUSED_BOOTSTRAP = "packed, trained as one fused model, bootstrap data per member"
PACKED_FUSED_SHORT = f"{PACKED_FUSED}, 200 steps"


def digit_rows(ft: int) -> dict[str, tuple[str | None, list[dict]]]:
    """Row name -> (prune key shared by rows with the same masks, recipe steps)."""
    tune = {"finetune": {"target": "merged", "steps": ft, "lr": 5e-4, "patience": 3}}
    members_tune = {"finetune": {"target": "members", "steps": ft, "lr": 5e-4, "patience": 3}}
    plain = {"merge": {"merger": "plain"}}
    taylor, circuit = _prune("taylor"), _prune("gradient_free", metric="nll+auroc")
    rows = {
        "single taylor-pruned": ("taylor1", [_prune("taylor", 1), plain, tune]),
        "single circuit-pruned": ("circuit1", [_prune("gradient_free", 1, metric="nll+auroc"), plain, tune]),
    }
    for mlp in ("average", "grouped", "pruned"):
        rows[f"hydra taylor {mlp}"] = ("taylor", [taylor, _hydra(mlp), tune])
        rows[f"hydra circuit {mlp}"] = ("circuit", [circuit, _hydra(mlp), tune])
    rows |= {
        "hydra taylor pruned + members tuned separately": (
            "taylor-units",
            [_prune("taylor", mlp_keep_ratio=1 / 3), members_tune, _hydra("pruned")],
        ),
        "hydra taylor pruned + members tuned separately, heads re-initialised": (
            "taylor-units",
            [
                _prune("taylor", mlp_keep_ratio=1 / 3),
                {"finetune": {**members_tune["finetune"], "reinit_head": True}},
                _hydra("pruned"),
            ],
        ),
        "members tuned 100 steps + calibrate (earlier default)": (
            "taylor-units",
            default_recipe_steps(steps=ft, lr=5e-4),
        ),
        "members tuned 100 steps, bootstrapped, + calibrate": (
            "taylor-units",
            default_recipe_steps(steps=ft, lr=5e-4, bootstrap=True),
        ),
        "members tuned 200 steps at lr 5e-4 + calibrate (previous default)": (
            "taylor-units",
            default_recipe_steps(lr=5e-4),
        ),
        "members tuned 200 steps at lr 5e-4, last block re-initialised": (
            "taylor-units",
            default_recipe_steps(lr=5e-4, reinit_blocks=1),
        ),
        "default recipe (members tuned 200 steps at lr 1e-3 + calibrate)": ("taylor-units", default_recipe_steps()),
        "default recipe, last block re-initialised": ("taylor-units", default_recipe_steps(reinit_blocks=1)),
        "default recipe, last 2 blocks re-initialised": ("taylor-units", default_recipe_steps(reinit_blocks=2)),
        "default recipe, last 3 blocks re-initialised": ("taylor-units", default_recipe_steps(reinit_blocks=3)),
        "default recipe, members tuned 400 steps": ("taylor-units", default_recipe_steps(steps=400)),
        # the far end of reinit_blocks: only the base's embeddings survive, members are small models
        # trained on their own (as long as a Deep Ensemble member: 370 steps), then fused
        "default recipe, every block re-initialised, members tuned 370 steps": (
            "taylor-units",
            default_recipe_steps(reinit_blocks="all", steps=370),
        ),
        # the recipe as it ships (packed: every block redrawn, 370 member steps), and its from-base
        # variant (the paper's pipeline); evaluated with and without their calibrate step
        "default recipe (packed)": ("taylor-units", recipe_steps()),
        "default recipe, from the base (paper's pipeline)": ("taylor-units", default_recipe_steps()),
        # the packed members trained as ONE fused model: merged first, every member redrawn from its own
        # seed inside it, then one fine-tune of the fused model (each member's own loss on its stream)
        PACKED_SEPARATE: ("taylor-units", packed_steps(fused=False)),
        PACKED_FUSED: ("taylor-units", packed_steps(fused=True)),
        PACKED_FUSED_BOOTSTRAP: ("taylor-units", packed_steps(fused=True, bootstrap=True)),
        **{f"{PACKED_FUSED}, {n} steps": ("taylor-units", packed_steps(fused=True, steps=n)) for n in (200, 250)},
        "hydra taylor pruned + bootstrap fine-tune": (
            "taylor",
            [taylor, _hydra("pruned"), {"finetune": {**tune["finetune"], "bootstrap": True}}],
        ),
        "hydra taylor pruned + disagreement 0.3": (
            "taylor",
            [taylor, _hydra("pruned"), {"finetune": {**tune["finetune"], "disagreement": 0.3}}],
        ),
        "hydra taylor pruned + disagreement 1.0": (
            "taylor",
            [taylor, _hydra("pruned"), {"finetune": {**tune["finetune"], "disagreement": 1.0}}],
        ),
        "hydra circuit pruned, objective per member": (
            "circuit-mixed",
            [_prune("gradient_free", metric=["nll", "auroc", "nll+auroc"]), _hydra("pruned"), tune],
        ),
        "hydra taylor pruned, MLP 0.4 each": ("taylor", [taylor, _hydra("pruned", mlp_keep_ratio=0.4), tune]),
        "hydra taylor pruned, MLP 0.5 each": ("taylor", [taylor, _hydra("pruned", mlp_keep_ratio=0.5), tune]),
        "hydra taylor pruned, M=2": ("taylor-m2", [_prune("taylor", 2), _hydra("pruned"), tune]),
        "hydra taylor pruned, M=4": ("taylor-m4", [_prune("taylor", 4), _hydra("pruned"), tune]),
        "hydra taylor pruned, keep 1/3 heads": ("taylor-k33", [_prune("taylor", keep=1 / 3), _hydra("pruned"), tune]),
    }
    return rows


ROW_SETS = {
    "main": [
        "single taylor-pruned",
        "single circuit-pruned",
        "hydra taylor average",
        "hydra taylor grouped",
        "hydra taylor pruned",
        "hydra circuit average",
        "hydra circuit grouped",
        "hydra circuit pruned",
    ],
    "check": [
        "single taylor-pruned",
        "hydra taylor pruned",
        "hydra circuit pruned",
        "hydra taylor pruned + members tuned separately, heads re-initialised",
        "default recipe (members tuned 200 steps at lr 1e-3 + calibrate)",
    ],
    # a base trained longer (--base-steps 740, near convergence): the Deep Ensemble's members are trained as
    # long, so Hydra's edge can no longer come from an under-trained base
    "converged": ["single taylor-pruned", "default recipe (members tuned 200 steps at lr 1e-3 + calibrate)"],
    # how much member diversity re-initialising the last blocks buys (run with --de-steps 370 for the
    # Deep Ensemble trained as long as a Hydra member)
    "reinit": [
        "single taylor-pruned",
        "default recipe (members tuned 200 steps at lr 1e-3 + calibrate)",
        "default recipe, last block re-initialised",
        "default recipe, last 2 blocks re-initialised",
        "default recipe, last 3 blocks re-initialised",
        "default recipe, every block re-initialised, members tuned 370 steps",
    ],
    # the calibrate step against the same models without it (issue 26), on the recipe as it ships
    "calibrate": ["default recipe (packed)", "default recipe, from the base (paper's pipeline)"],
    # the packed members trained one by one against trained as one fused model (issue 41)
    "fused": [PACKED_SEPARATE, PACKED_FUSED, f"{PACKED_FUSED}, 250 steps", PACKED_FUSED_SHORT],
}


def base_recipe(text: bool = False) -> dict:
    """The recipe whose model and data a table uses: vit_hydra.yaml, or bert_hydra.yaml for text."""
    return yaml.safe_load((ROOT / "recipes" / ("bert_hydra.yaml" if text else "vit_hydra.yaml")).read_text())


def finished_summary(out: Path) -> dict[str, dict] | None:
    """The summary of a row run to the end earlier (metrics.json written, no RUNNING marker)."""
    if (out / "RUNNING").exists() or not (out / "metrics.json").exists():
        return None
    return json.loads((out / "metrics.json").read_text())["summary"]


def run_row(
    raw: dict, name: str, steps: list[dict], out: Path, baselines: list[str], resume: bool = False, **evaluate
) -> dict[str, dict]:
    if resume and (done := finished_summary(out)) is not None:
        return done
    raw = copy.deepcopy(raw)
    raw["steps"] = steps + [{"evaluate": {"baselines": baselines, "plots": False, **evaluate}}]
    recipe = validate_recipe(raw, where=f"uq_table:{name}")
    ctx = Runner(recipe, out, quiet=True, overwrite=True).run()
    if "calibrate" in ctx.log:  # what the calibrate step fitted and decided, beside the metrics
        (out / "calibrate.json").write_text(json.dumps(ctx.log["calibrate"], indent=1))
    return ctx.metrics["summary"]


def run_seed(args: argparse.Namespace, seed: int, rows: dict, out: Path) -> dict[str, dict]:
    raw = base_recipe()
    raw["seed"] = seed
    raw["cache_dir"] = str(out / ".cache")
    if args.in_classes:
        raw["data"]["in_classes"] = args.in_classes
    if args.base_steps:  # the base (and so every Deep Ensemble member and every Hydra's start) trained longer
        raw["model"]["train_base"]["steps"] = args.base_steps
    result: dict[str, dict] = {}
    t0 = time.time()
    baselines = args.baselines or ["base", "deep_ensemble", "mc_dropout"]
    for model_name, row in run_row(
        raw, "baselines", [], out / f"seed{seed}" / "baselines", baselines, args.resume
    ).items():
        result[model_name] = row
    print(f"seed {seed}: baselines done ({time.time() - t0:.0f}s)", flush=True)
    if args.de_steps:  # a Deep Ensemble whose members get as many training steps as a Hydra member
        long = copy.deepcopy(raw)
        long["model"]["train_base"]["steps"] = args.de_steps
        name = f"deep_ensemble x3, {args.de_steps}-step members"
        folder = out / f"seed{seed}" / f"deep_ensemble_{args.de_steps}"
        # beside a base of the same architecture, so its ratios are to one model as in every other row
        result[name] = run_row(long, name, [], folder, ["base", "deep_ensemble"], args.resume)["deep_ensemble x3"]
        print(f"seed {seed}: {name} done", flush=True)
    masks: dict[str, Path] = {}
    for name, (key, steps) in rows.items():
        folder = out / f"seed{seed}" / name.replace(" ", "_").replace(",", "").replace("/", "-")
        steps = copy.deepcopy(steps)
        prune = steps[0]["prune"]
        if key in masks:  # the same masks as an earlier row: reuse them
            kept = {k: prune[k] for k in ("members", "mlp_keep_ratio") if k in prune}
            steps[0] = {"prune": {"pruner": "file", "path": str(masks[key]), **kept}}
        t = time.time()
        calibrated = any("calibrate" in step for step in steps)
        summary = run_row(raw, name, steps, folder, ["base"] + ["uncalibrated"] * calibrated, args.resume)
        if key is not None and key not in masks:
            masks[key] = folder / "masks.json"
        result[name] = next(r for m, r in summary.items() if m not in ("base", "uncalibrated"))
        if calibrated:  # the same model without its calibrate step, evaluated in the same run
            result[f"{name}, without calibrate"] = summary["uncalibrated"]
        if (folder / "calibrate.json").exists():
            fitted = json.loads((folder / "calibrate.json").read_text())
            result[name]["temperature"] = fitted["temperature"][0]
            result[name]["temperature_fitted"] = fitted.get("fitted", [1.0])[0]
        print(f"seed {seed}: {name} done ({time.time() - t:.0f}s)", flush=True)
    return result


def write_results(stem: str, seeds: list[int], per_seed: list[dict], minutes: float, **extra: object) -> None:
    """Mean and std over seeds of every row: benchmarks/results/<stem>.json (with every seed's rows
    and `extra`) and .md. A row may be missing from some seeds; its mean is over those it has."""
    names = list(dict.fromkeys(n for r in per_seed for n in r))
    have = {n: [r[n] for r in per_seed if n in r] for n in names}
    mean = {n: {k: float(np.mean([r[k] for r in have[n]])) for k in have[n][0]} for n in names}
    std = {n: {k: float(np.std([r[k] for r in have[n]])) for k in have[n][0]} for n in names}
    seeds_per_row = {n: [s for s, r in zip(seeds, per_seed) if n in r] for n in names}
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "seeds": seeds, **extra, "seeds_per_row": seeds_per_row, "mean": mean, "std": std,
        "per_seed": per_seed, "minutes": minutes,
    }  # fmt: skip
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    table = markdown_table(mean, std if len(seeds) > 1 else None)
    (RESULTS / f"{stem}.md").write_text(table)
    print(f"\nmean ± std over seeds {seeds} ({minutes} min of compute)\n")
    print(table)


def merge_results(stems: list[str], into: str, keep: str = "rows") -> None:
    """Join result files of seeds or rows run in separate processes into one (a seed's rows joined;
    `keep`: a field of every part, lists joined, anything else taken from the first)."""
    parts, by_seed = [json.loads((RESULTS / f"{stem}.json").read_text()) for stem in stems], {}
    for part in parts:
        for seed, rows in zip(part["seeds"], part["per_seed"]):
            by_seed.setdefault(seed, {}).update(rows)
    kept = parts[0][keep]
    if isinstance(kept, list):
        kept = list(dict.fromkeys(n for part in parts for n in part[keep]))
    minutes = round(sum(part["minutes"] for part in parts), 1)
    write_results(into, sorted(by_seed), [by_seed[s] for s in sorted(by_seed)], minutes, **{keep: kept})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rows", default=None, help="all, main, check, or row names separated by ';' (default: all)")
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument(
        "--de-steps",
        type=int,
        default=None,
        help="also a Deep Ensemble whose members train this many steps (370 = a Hydra member's 170 + 200)",
    )
    p.add_argument(
        "--base-steps",
        type=int,
        default=None,
        help="train the base this many steps instead of the recipe's (740: the README's longer-trained base)",
    )
    p.add_argument(
        "--baselines",
        nargs="+",
        default=None,
        help="baselines evaluated once per seed (default: base deep_ensemble mc_dropout)",
    )
    p.add_argument("--in-classes", nargs="+", type=int, default=None, help="digits: in-distribution classes")
    p.add_argument("--out", default="runs/uq_table")
    p.add_argument("--resume", action="store_true", help="reuse rows already finished under --out")
    p.add_argument("--tag", default=None, help="results file name (default: digits, plus the split)")
    p.add_argument("--merge", nargs="+", default=None, metavar="TAG", help="combine result files (seeds) into --tag")
    args = p.parse_args()
    if args.merge:  # seeds run in separate processes, joined into one table
        merge_results([f"uq_table_{t}" for t in args.merge], f"uq_table_{args.tag}")
        return
    every = digit_rows(args.finetune_steps)
    rows_arg = args.rows or "all"
    wanted = list(every) if rows_arg == "all" else ROW_SETS.get(rows_arg) or rows_arg.split(";")
    rows = {n: every[n] for n in wanted}
    t0 = time.time()
    per_seed = [run_seed(args, s, rows, Path(args.out)) for s in args.seeds]
    split = "" if not args.in_classes else "_in" + "".join(map(str, args.in_classes))
    split += f"_base{args.base_steps}" if args.base_steps else ""
    tag = args.tag or "digits" + split
    write_results(f"uq_table_{tag}", args.seeds, per_seed, round((time.time() - t0) / 60, 1), rows=wanted)


if __name__ == "__main__":
    main()
