"""Physically smaller plain models at a FLOPs budget: this project's pruning against torch-pruning's
MetaPruner used the way its timm ViT example uses it, side by side, same base, same fine-tune.

    python benchmarks/structured.py                    # default ViT, 0.7x 0.5x 0.35x FLOPs (~40 min on 2 cores)
    python benchmarks/structured.py --targets 0.5 --finetune-steps 60

Ours: heads and MLP units chosen together to the budget (Taylor head importance, torch-pruning's
GroupTaylor MLP-unit importance, global ranking with a floor per block), cut through torch-pruning's
DependencyGraph, then fine-tuned (optionally with logit distillation from the base). MetaPruner:
GroupTaylorImportance, uniform pruning ratio, head dims pruned (its example's defaults), the ratio
found by bisection to reach the same FLOPs, `num_heads`/`head_dim`/`attn_dim` set by hand after
surgery as its example does, then the same fine-tune. FLOPs per sample by FlopCounterMode,
latency as the median ratio to the base measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from compressor.data import batches
from compressor.evaluate import evaluate_models, flops_per_sample, markdown_table
from compressor.recipe import validate_recipe
from compressor.runner import Runner
from compressor.training import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def recipe(seed: int, steps: list[dict], cache: Path) -> dict:
    raw = yaml.safe_load((ROOT / "recipes" / "vit_hydra.yaml").read_text())
    raw.update(seed=seed, cache_dir=str(cache), steps=steps)
    return raw


def ours(seed: int, target: float, ft: int, distill: bool, out: Path, cache: Path) -> torch.nn.Module:
    tune = {"target": "merged", "steps": ft, "lr": 5e-4, "patience": 3}
    if distill:
        tune["distill"] = {"teacher": "base", "alpha": 0.5, "temperature": 2.0}
    steps = [
        {"prune": {"pruner": "taylor", "members": 1, "target": {"flops": target}, "mlp_importance": "taylor"}},
        {"merge": {"merger": "plain"}},
        {"finetune": tune},
    ]
    ctx = Runner(validate_recipe(recipe(seed, steps, cache), "structured"), out, quiet=True, overwrite=True).run()
    return ctx.merged


def metapruner(base: torch.nn.Module, calib: list, target: float, x: torch.Tensor) -> torch.nn.Module:
    """torch-pruning's MetaPruner as its timm ViT example uses it, at the ratio that meets `target`."""
    import timm
    import torch_pruning as tp

    def prune(ratio: float) -> torch.nn.Module:
        model = copy.deepcopy(base).train()
        attentions = [m for m in model.modules() if isinstance(m, timm.layers.Attention)]
        num_heads = {m.qkv: m.num_heads for m in attentions}
        imp = tp.importance.GroupTaylorImportance()
        pruner = tp.pruner.MetaPruner(
            model, x[:1], importance=imp, pruning_ratio=ratio, ignored_layers=[model.head],
            num_heads=num_heads, prune_head_dims=True, round_to=2,
        )  # fmt: skip
        model.zero_grad()
        for xb, yb in calib:
            F.cross_entropy(model(xb), yb).backward()
        for group in pruner.step(interactive=True):
            group.prune()
        for m in attentions:  # what its example sets by hand (and attn_dim, which timm >= 1.0.23 reads)
            m.num_heads = pruner.num_heads[m.qkv]
            m.head_dim = m.qkv.out_features // (3 * m.num_heads)
            m.attn_dim = m.num_heads * m.head_dim
        model.zero_grad(set_to_none=True)
        return model.eval()

    full = flops_per_sample(base, x[:8])
    lo, hi = 0.0, 0.95
    best = None
    for _ in range(12):
        mid = (lo + hi) / 2
        model = prune(mid)
        share = flops_per_sample(model, x[:8]) / full
        if share > target:
            lo = mid
        else:
            hi, best = mid, model
            if share > target - 0.02:
                break
    return best


def run_seed(seed: int, targets: list[float], ft: int, out: Path) -> dict[str, dict]:
    cache = out / ".cache"
    ctx = Runner(validate_recipe(recipe(seed, [{"evaluate": {"plots": False}}], cache), "structured"),
                 out / f"seed{seed}" / "base", quiet=True, overwrite=True).run()  # fmt: skip
    base, data = ctx.base, ctx.data
    calib = batches(data.train, 64, limit=512)
    x = next(iter(torch.utils.data.DataLoader(data.test, batch_size=64)))[0]
    models = {"base": base}
    for r in targets:
        folder = out / f"seed{seed}" / f"flops{r}"
        models[f"ours {r}x"] = ours(seed, r, ft, False, folder / "ours", cache)
        models[f"ours + distill {r}x"] = ours(seed, r, ft, True, folder / "ours_distill", cache)
        mp = metapruner(base, calib, r, x)
        train(mp, data.train, data.val, TrainConfig(steps=ft, batch_size=128, lr=5e-4, patience=3, seed=seed))
        models[f"torch-pruning MetaPruner {r}x"] = mp
        print(f"seed {seed}: {r}x done", flush=True)
    metrics = evaluate_models(models, data, out / f"seed{seed}", reference="base", write=False)
    return metrics["summary"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--targets", nargs="+", type=float, default=[0.7, 0.5, 0.35])
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument("--out", default="runs/structured")
    args = p.parse_args()
    t0 = time.time()
    per_seed = [run_seed(s, args.targets, args.finetune_steps, Path(args.out)) for s in args.seeds]
    names = list(per_seed[0])
    mean = {n: {k: float(np.mean([r[n][k] for r in per_seed])) for k in per_seed[0][n]} for n in names}
    std = {n: {k: float(np.std([r[n][k] for r in per_seed])) for k in per_seed[0][n]} for n in names}
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "seeds": args.seeds,
        "targets": args.targets,
        "mean": mean,
        "std": std,
        "minutes": (time.time() - t0) / 60,
    }
    (RESULTS / "structured.json").write_text(json.dumps(payload, indent=1))
    table = markdown_table(mean, std if len(args.seeds) > 1 else None)
    (RESULTS / "structured.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
