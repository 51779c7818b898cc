"""Uncertainty comparison on the embedded default, over several seeds, by the recipe engine.

    python benchmarks/uq_table.py                     # 3 seeds, every method (about 20 minutes on 2 cores)
    python benchmarks/uq_table.py --seeds 0 --finetune-steps 20

ID = scikit-learn digits 0-7; OOD = digits 8-9 and crops of scikit-learn's sample photos;
shift = noisy, blurred and rotated test digits. Every method is built from the same base model
(per seed) by the same recipe steps and evaluated on the same data; the table prints the mean and
standard deviation over seeds of each metric and the median latency ratio to the single model.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import yaml

from compressor.evaluate import markdown_table
from compressor.recipe import validate_recipe
from compressor.runner import Runner

ROOT = Path(__file__).resolve().parents[1]


def variants(members: int, ft_steps: int) -> dict[str, list[dict]]:
    ft = {"finetune": {"target": "merged", "steps": ft_steps, "lr": 0.0005, "patience": 3}}
    hydra = {"merge": {"merger": "hydra", "mlp": "grouped"}}
    plain = {"merge": {"merger": "plain"}}
    return {
        "baselines": [{"evaluate": {"baselines": ["base", "deep_ensemble", "mc_dropout"], "plots": False}}],
        "single taylor-pruned": [{"prune": {"pruner": "taylor", "members": 1, "keep_ratio": 0.5}}, plain, ft],
        "single circuit-pruned": [{"prune": {"pruner": "gradient_free", "members": 1, "keep_ratio": 0.5}}, plain, ft],
        "hydra taylor": [{"prune": {"pruner": "taylor", "members": members, "keep_ratio": 0.5}}, hydra, ft],
        "hydra circuit": [{"prune": {"pruner": "gradient_free", "members": members, "keep_ratio": 0.5}}, hydra, ft],
        "hydra random": [{"prune": {"pruner": "random", "members": members, "keep_ratio": 0.5}}, hydra, ft],
        "hydra disjoint": [{"prune": {"pruner": "disjoint", "members": members, "rank_by": "taylor"}}, hydra, ft],
    }


def run_seed(seed: int, members: int, ft_steps: int, out: Path) -> dict[str, dict]:
    base_recipe = yaml.safe_load((ROOT / "recipes" / "vit_hydra.yaml").read_text())
    rows: dict[str, dict] = {}
    for name, steps in variants(members, ft_steps).items():
        raw = copy.deepcopy(base_recipe)
        raw["seed"] = seed
        if name != "baselines":
            steps = steps + [{"evaluate": {"baselines": ["base"], "plots": False}}]
        raw["steps"] = steps
        recipe = validate_recipe(raw, where=f"uq_table:{name}")
        state = Runner(recipe, out / f"seed{seed}" / name.replace(" ", "_"), quiet=True).run()
        for model_name, row in state.metrics["summary"].items():
            label = model_name if name == "baselines" else name
            if name != "baselines" and model_name == "base":
                continue
            rows[label] = row
        print(f"seed {seed}: {name} done", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument("--out", default="runs/uq_table")
    args = p.parse_args()
    out = Path(args.out)
    per_seed = [run_seed(s, args.members, args.finetune_steps, out) for s in args.seeds]
    names = list(per_seed[0])
    mean = {n: {k: float(np.mean([r[n][k] for r in per_seed])) for k in per_seed[0][n]} for n in names}
    std = {n: {k: float(np.std([r[n][k] for r in per_seed])) for k in per_seed[0][n]} for n in names}
    out.mkdir(parents=True, exist_ok=True)
    (out / "uq_table.json").write_text(json.dumps({"seeds": args.seeds, "mean": mean, "std": std}, indent=1))
    print(f"\nmean ± std over seeds {args.seeds}; OOD = max-softmax score averaged over digits 8-9 and photo crops\n")
    print(markdown_table(mean, std))


if __name__ == "__main__":
    main()
