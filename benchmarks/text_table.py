"""Pretrained benchmarks: the paper's Hydra pipeline on a model fine-tuned in full (all-MiniLM-L6-v2
on the text tasks, DINOv2-S/14 on Fashion-MNIST: `--task fashion`, recipes/dinov2_hydra.yaml),
against the fine-tuned base, a 3-model Deep Ensemble of full fine-tunes, MC dropout, a single pruned
model, the packed pipeline (fashion) and post-hoc OOD scores of the base (energy, Mahalanobis, kNN);
per OOD set and on their mean.

    python benchmarks/text_table.py --task topics --seed 0 --out runs/text_topics      # one seed
    python benchmarks/text_table.py --task topics --merge 0 1 2                        # the summary

Run each seed as its own process (one after another per task: the Deep Ensemble of seed s is the
bases of seeds s, s+1, s+2, cached under --out and shared between seeds). Rows: `main` (Hydra as
the recipes ship it, the averaged MLP; with a third of each MLP; with a shared trunk of 2L/3
blocks; a single pruned model) and `levers` (the rest). Every Hydra row is scored once with
max-softmax, mutual information and Mahalanobis (its "+ Mahalanobis" row: the same trained model).
Results: benchmarks/results/<stem>_seed<s>.json per run, and benchmarks/results/<stem>.json / .md
over seeds (stem: text_<task>, or image_fashion).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from text_results import merge, stem
from uq_table import RESULTS, ROOT, run_row

from compressor.run.recipe import validate_recipe
from compressor.run.runner import Runner
from compressor.uq.metrics import auroc, fpr_at_tpr
from compressor.uq.posthoc import KNearest, Mahalanobis, energy_score, logits_and_features

RECIPES = {"sentiment": "bert_hydra.yaml", "topics": "bert_hydra_topics.yaml", "fashion": "dinov2_hydra.yaml"}


def recipe(task: str) -> dict:
    return yaml.safe_load((ROOT / "recipes" / RECIPES[task]).read_text())


def rows(task: str) -> dict[str, list[dict]]:
    """Row name -> steps before evaluate: the recipe's own (the paper's averaged MLP) and its
    variants, and the earlier configuration (a third of each member's MLP, `mlp: pruned`) with the
    levers measured on it."""
    shipped = [s for s in recipe(task)["steps"] if next(iter(s)) not in ("evaluate", "export")]
    pruned = copy.deepcopy(shipped)
    next(s for s in pruned if "prune" in s)["prune"]["mlp_keep_ratio"] = 0.3333
    next(s for s in pruned if "merge" in s)["merge"] = {"merger": "hydra", "mlp": "pruned"}

    def variant(**tune: object) -> list[dict]:
        out = copy.deepcopy(pruned)
        next(s for s in out if "finetune" in s)["finetune"].update(tune)
        return out

    prune = next(s for s in pruned if "prune" in s)["prune"]
    tune = next(s for s in pruned if "finetune" in s)
    single = {**prune, "members": 1}
    disjoint = {"pruner": "disjoint", "members": 3, "rank_by": "taylor", "mlp_keep_ratio": prune["mlp_keep_ratio"]}
    circuit = {**prune, "pruner": "gradient_free", "metric": ["nll", "auroc", "nll+auroc"]}
    return {
        PRUNED: scored_by_features(pruned),
        "single pruned model": [{"prune": single}, copy.deepcopy(tune), {"merge": {"merger": "plain"}}],
        "hydra, disjoint heads (4 per member)": [{"prune": disjoint}, *copy.deepcopy(pruned[1:])],
        "hydra, circuit heads (validation + outliers)": [{"prune": circuit}, *copy.deepcopy(pruned[1:])],
        "hydra, bootstrap data per member": variant(bootstrap=True),
        "hydra, classifier re-initialised": variant(reinit_head=True),
        "hydra, last block re-initialised": variant(reinit_blocks=1),
        "hydra, members tuned 2x longer": variant(**LONGER),
        "hydra, members distilled from the base": variant(distill={"alpha": 0.5, "temperature": 2.0}),
        "hydra, packed (every block re-initialised)": variant(reinit_blocks="all"),
        **averaged_rows(shipped, TRUNKS["fashion" if task == "fashion" else "text"]),
    }


def scored_by_features(steps: list[dict]) -> list[dict]:
    """The steps with the calibrate step deploying the Mahalanobis score: the trained model's
    metrics then hold max-softmax, mutual information and Mahalanobis, read from one run."""
    return [{"calibrate": {**s["calibrate"], "ood_score": "mahalanobis"}} if "calibrate" in s else s for s in steps]


AVERAGED = "hydra, averaged MLP (paper)"


def averaged_rows(steps: list[dict], trunks: tuple[int, ...]) -> dict[str, list[dict]]:
    """The paper's merge: members keep the whole MLP; the fused model's MLP averages theirs. Its
    variants: a fine-tune after the merge (the shared MLP trained once, through every stream),
    1/3 of the heads per member (attention exactly one model's size), a shared trunk of k blocks."""
    out = copy.deepcopy(steps)
    prune = next(s for s in out if "prune" in s)["prune"]
    prune.pop("mlp_keep_ratio", None)
    next(s for s in out if "merge" in s)["merge"] = {"merger": "hydra", "mlp": "average"}
    out = scored_by_features(out)
    tune = next(s for s in out if "finetune" in s)["finetune"]
    after = [s for s in copy.deepcopy(out) if "finetune" not in s]
    merged_tune = {k: v for k, v in tune.items() if k != "freeze_embeddings"} | {"target": "merged"}
    after.insert(next(i for i, s in enumerate(after) if "merge" in s) + 1, {"finetune": merged_tune})
    both = copy.deepcopy(out)  # the members' own fine-tunes, then a short one of the fused model
    short = merged_tune | {"steps": 50, "eval_every": 25}
    both.insert(next(i for i, s in enumerate(both) if "merge" in s) + 1, {"finetune": short})
    third = copy.deepcopy(out)
    next(s for s in third if "prune" in s)["prune"]["keep_ratio"] = 0.3333
    rows = {AVERAGED: out, f"{AVERAGED}, tuned after the merge": after, f"{AVERAGED}, 1/3 of the heads": third}
    rows[f"{AVERAGED}, members tuned, then 50 steps after the merge"] = both
    levers = {
        "bootstrap data per member": {"bootstrap": True},
        "members tuned 2x longer": LONGER,
        "last weights kept": LAST,
    }
    for name, change in levers.items():
        rows[f"{AVERAGED}, {name}"] = copy.deepcopy(out)
        next(s for s in rows[f"{AVERAGED}, {name}"] if "finetune" in s)["finetune"].update(change)
    for k in trunks:
        trunk = copy.deepcopy(out)
        next(s for s in trunk if "prune" in s)["prune"]["shared_blocks"] = k
        rows[f"{AVERAGED}, shared trunk of {k} blocks"] = trunk
        # members that the held-out NLL would keep at step 0 (near-copies of the base) kept as trained
        last = rows[f"{AVERAGED}, shared trunk of {k} blocks, last weights kept"] = copy.deepcopy(trunk)
        next(s for s in last if "finetune" in s)["finetune"].update(LAST)
    return rows


LONGER = {"steps": 300, "patience": None}  # twice the recipes' 150 member steps, no early stop
LAST = {"patience": None, "keep": "last"}  # members kept as trained, not at their best held-out step
TRUNKS = {"text": (3, 4), "fashion": (6, 8)}  # about L/2 and 2L/3 of MiniLM (L = 6) and DINOv2-S (L = 12)


PRUNED = "hydra, a third of each MLP (mlp: pruned)"  # the pretrained recipes before 2026-12-06
MAHALANOBIS_DE = "deep_ensemble x3 + Mahalanobis"  # per member on its own features, averaged
ROW_SETS = {"main": [AVERAGED, PRUNED, "single pruned model"]}
TRUNK_ROW = {"fashion": f"{AVERAGED}, shared trunk of 8 blocks"}  # 2L/3 of DINOv2-S; of MiniLM: 4 blocks
MAIN_EXTRA = {"fashion": ["hydra, packed (every block re-initialised)"]}  # the packed pipeline beside it


def is_scored_by_features(steps: list[dict]) -> bool:
    return any(s.get("calibrate", {}).get("ood_score") == "mahalanobis" for s in steps)


def per_set(folder: Path, model: str, score: str = "msp") -> dict[str, float]:
    """AUROC and FPR95 of one OOD score on every OOD set, from a row's metrics.json."""
    ood = json.loads((folder / "metrics.json").read_text())["models"][model]["ood"]
    return {f"{k}/{name}": r[f"{k}_{score}"] for name, r in ood.items() for k in ("auroc", "fpr95")}


def with_means(row: dict) -> dict:
    """`auroc_msp`/`fpr95_msp` set to the means over the OOD sets of the row's per-set columns
    (rows scored by another score: the table's AUROC and FPR95 are always the row's own score)."""
    for k in ("auroc", "fpr95"):
        row[f"{k}_msp"] = float(np.mean([v for key, v in row.items() if key.startswith(f"{k}/")]))
    return row


def ensemble_mahalanobis_row(raw: dict, seed: int, folder: Path) -> dict:
    """The Deep Ensemble (bases of seeds s, s+1, s+2) with the Mahalanobis score fitted per member
    on the train split, as the calibrate step fits it for a fused model."""
    from compressor.uq.inference import predict_with_features
    from compressor.uq.metrics import classification_report
    from compressor.uq.outputs import DeepEnsemble

    bases = []
    for s in (seed, seed + 1, seed + 2):
        ctx = Runner(
            validate_recipe({**copy.deepcopy(raw), "seed": s}, where="text_table:de"), folder, quiet=True
        ).setup()
        bases.append(ctx.base)
    data, bs = ctx.data, raw["data"]["batch_size"]
    ensemble = DeepEnsemble(bases)
    train, features = predict_with_features(ensemble, data.train, bs)
    score = Mahalanobis.fit(features, train.labels)
    test, features = predict_with_features(ensemble, data.test, bs)
    row = classification_report(test.member_probs, test.labels, test.probs)
    s_in = score(features).numpy()
    for name, ds in data.ood.items():
        s_out = score(predict_with_features(ensemble, ds, bs)[1]).numpy()
        row[f"auroc/{name}"], row[f"fpr95/{name}"] = auroc(s_in, s_out), fpr_at_tpr(s_in, s_out)
    return with_means(
        {k: v for k, v in row.items() if isinstance(v, float)} | {"flops_ratio": 3.0, "params_ratio": 3.0}
    )


def posthoc_rows(raw: dict, folder: Path, base_row: dict) -> dict[str, dict]:
    """The base's accuracy and calibration with another OOD score: energy, Mahalanobis, kNN."""
    ctx = Runner(validate_recipe(copy.deepcopy(raw), where="text_table:posthoc"), folder, quiet=True).setup()
    bs = ctx.recipe.data["batch_size"]
    _, train_feats = logits_and_features(ctx.base, ctx.data.train, bs)
    train_labels = ctx.data.train.tensors[1].numpy()
    test_logits, test_feats = logits_and_features(ctx.base, ctx.data.test, bs)
    outside = {name: logits_and_features(ctx.base, ds, bs) for name, ds in ctx.data.ood.items()}
    mahalanobis = Mahalanobis.fit(torch.from_numpy(train_feats), torch.from_numpy(train_labels))
    knn = KNearest(train_feats, 10)
    scorers = {
        "base + energy score": lambda logits, feats: energy_score(logits),
        "base + Mahalanobis": lambda logits, feats: mahalanobis.score(feats),
        "base + kNN (k=10)": lambda logits, feats: knn.score(feats),
    }
    keep = ("accuracy", "nll", "ece", "brier", "flops_ratio", "params_ratio")
    out = {}
    for name, score in scorers.items():
        s_in = score(test_logits, test_feats)
        row = {k: base_row[k] for k in keep if k in base_row}
        for set_name, (logits, feats) in outside.items():
            s_out = score(logits, feats)
            row[f"auroc/{set_name}"], row[f"fpr95/{set_name}"] = auroc(s_in, s_out), fpr_at_tpr(s_in, s_out)
        row["auroc_msp"] = float(np.mean([v for k, v in row.items() if k.startswith("auroc/")]))
        row["fpr95_msp"] = float(np.mean([v for k, v in row.items() if k.startswith("fpr95/")]))
        out[name] = row
    return out


def baseline_rows(raw: dict, seed: int, folder: Path) -> dict[str, dict]:
    """Base, Deep Ensemble (bases of seeds s, s+1, s+2), MC dropout (text), and the base's post-hoc scores."""
    mc_dropout = ["mc_dropout"] if raw["data"]["source"] == "text" else []  # DINOv2 has no dropout layers
    summary = run_row(
        raw, "baselines", [], folder, ["base", "deep_ensemble", *mc_dropout],
        resume=True, deep_ensemble_seeds=[seed + 1, seed + 2], mc_dropout_samples=4,
    )  # fmt: skip
    result = {name: {**row, **per_set(folder, name)} for name, row in summary.items()}
    return result | posthoc_rows(raw, folder, result["base"])


def row_folder(seed_folder: Path, name: str) -> Path:
    """Where a row of one seed runs (its masks.json is what cost_quality.py rebuilds from)."""
    return seed_folder / "".join(c if c.isalnum() else "_" for c in name)


def run_seed(
    task: str, seed: int, wanted: list[str], out: Path, quick: bool = False, baselines: bool = True
) -> dict[str, dict]:
    raw = recipe(task)
    raw.update(seed=seed, cache_dir=str(out / ".cache"))
    if quick:  # a smoke test of the harness: a few texts and steps
        raw["data"]["max_samples"] = 40
        raw["model"]["train_base"].update(steps=2, eval_every=1)
    folder = out / f"seed{seed}"
    result: dict[str, dict] = {}
    t0 = time.time()
    if baselines:
        result |= baseline_rows(raw, seed, folder / "baselines")
        print(f"{task} seed {seed}: baselines ({time.time() - t0:.0f}s)", flush=True)
    masks: dict[str, Path] = {}
    for name in wanted:
        steps = copy.deepcopy(rows(task)[name])
        if quick:
            next(s for s in steps if "finetune" in s)["finetune"].update(steps=2, eval_every=1)
        prune = steps[0]["prune"]
        key = json.dumps(prune, sort_keys=True)
        if key in masks:  # the same prune step as an earlier row: its masks
            kept = {k: prune[k] for k in ("members", "mlp_keep_ratio") if k in prune}
            steps[0] = {"prune": {"pruner": "file", "path": str(masks[key]), **kept}}
        folder_of_row = row_folder(folder, name)
        t = time.time()
        summary = run_row(raw, name, steps, folder_of_row, ["base"], resume=True)
        masks.setdefault(key, folder_of_row / "masks.json")
        model = next(m for m in summary if m != "base")
        result[name] = {**summary[model], **per_set(folder_of_row, model), "minutes": (time.time() - t) / 60}
        if is_scored_by_features(steps):  # the same trained model under its Mahalanobis score
            scored = with_means({**result[name], **per_set(folder_of_row, model, "mahalanobis")})
            result[f"{name} + Mahalanobis"] = scored
        print(f"{task} seed {seed}: {name} ({time.time() - t:.0f}s)", flush=True)
    if baselines:  # the same-score comparison of the rows scored by Mahalanobis too
        t = time.time()
        result[MAHALANOBIS_DE] = ensemble_mahalanobis_row(raw, seed, folder / "deep_ensemble_mahalanobis")
        print(f"{task} seed {seed}: {MAHALANOBIS_DE} ({time.time() - t:.0f}s)", flush=True)
    result["_minutes"] = {"total": (time.time() - t0) / 60}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(RECIPES), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", default="main", help="main, levers, all, or row names separated by ';'")
    p.add_argument("--out", default=None, help="run folder (default runs/text_<task>)")
    p.add_argument("--no-baselines", action="store_true", help="only the rows (another process runs the baselines)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 40 texts per set, 2 training steps")
    p.add_argument("--merge", nargs="+", type=int, default=None, metavar="SEED", help="join these seeds' results")
    args = p.parse_args()
    if args.merge:
        merge(args.task, args.merge)
        return
    every = list(rows(args.task))
    main_rows = ROW_SETS["main"] + MAIN_EXTRA.get(args.task, [])
    main_rows.append(TRUNK_ROW.get(args.task, f"{AVERAGED}, shared trunk of 4 blocks"))
    levers = [n for n in every if n not in main_rows]
    named = {"main": main_rows, "levers": levers, "all": every}
    wanted = named.get(args.rows) or args.rows.split(";")
    out = Path(args.out or f"runs/{stem(args.task)}")
    result = run_seed(args.task, args.seed, wanted, out, args.quick, baselines=not args.no_baselines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"task": args.task, "seed": args.seed, "rows": result}
    part = "" if args.rows == "main" else "_" + "".join(c if c.isalnum() else "_" for c in args.rows)[:64]
    (RESULTS / f"{stem(args.task)}_seed{args.seed}{part}.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
