"""Physically smaller plain models at a FLOPs budget: this project's pruning against torch-pruning's
MetaPruner used the way its timm ViT example uses it, side by side, same base, same fine-tune.

    python benchmarks/structured.py                    # default ViT, 0.7x 0.5x 0.35x FLOPs (~40 min on 2 cores)
    python benchmarks/structured.py --targets 0.5 --finetune-steps 60
    python benchmarks/structured.py --text --targets 0.7 0.5 --finetune-steps 60   # MiniLM, shorter budget
    python benchmarks/structured.py --allocation global    # ours with global ranking across blocks
    python benchmarks/structured.py --targets 0.5 --seeds 0 1 2 --no-distill --tag structured_0.5x_3seeds
    python benchmarks/structured.py --targets 0.5 --seeds 0 1 2 --no-distill --width 0.8 0.9 --tag structured_width
    python benchmarks/structured.py --targets 0.5 --seeds 0 1 2 --no-distill --iterative 2 4 --tag structured_iterative

Ours: heads and MLP units chosen together to the budget (Taylor head importance, torch-pruning's
GroupTaylor MLP-unit importance, global ranking with a floor per block), cut through torch-pruning's
DependencyGraph, then fine-tuned (optionally with logit distillation from the base). MetaPruner:
GroupTaylorImportance, uniform pruning ratio, head dims pruned (its example's defaults), the ratio
found by bisection to reach the same FLOPs, `num_heads`/`head_dim`/`attn_dim` set by hand after
surgery as its example does, then the same fine-tune. For MiniLM (--text: the sentiment
benchmark and the fully fine-tuned base of recipes/bert_hydra.yaml) MetaPruner is
used as its BERT example uses it: whole heads removed (`prune_num_heads`, head size kept) and
`num_attention_heads`/`attention_head_size`/`all_head_size` set by hand. FLOPs per sample by FlopCounterMode,
latency as the median ratio to the base measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from compressor.data import batches
from compressor.run.recipe import validate_recipe
from compressor.run.runner import Runner
from compressor.training.config import TrainConfig
from compressor.training.loop import train
from compressor.uq.evaluate import evaluate_models, flops_per_sample

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from uq_table import base_recipe, merge_results, write_results  # noqa: E402  (the text base: whole MiniLM encoder fine-tuned)

LR = {False: 5e-4, True: 1e-4}  # fine-tune learning rate: ViT, MiniLM (as in uq_table.py)
EVAL_EVERY = {False: 25, True: 20}


def recipe(seed: int, steps: list[dict], cache: Path, text: bool = False) -> dict:
    raw = base_recipe(text) if text else yaml.safe_load((ROOT / "recipes" / "vit_hydra.yaml").read_text())
    raw.update(seed=seed, cache_dir=str(cache), steps=steps)
    return raw


def ours(
    seed: int,
    target: float,
    ft: int,
    distill: bool,
    out: Path,
    cache: Path,
    text: bool,
    allocation: str = "uniform",
    iterative: int = 1,
) -> torch.nn.Module:
    tune = {"target": "merged", "steps": ft, "lr": LR[text], "patience": 3, "eval_every": EVAL_EVERY[text]}
    if distill:
        tune["distill"] = {"teacher": "base", "alpha": 0.5, "temperature": 2.0}
    steps = [_prune_step(target, allocation, iterative), {"merge": {"merger": "plain"}}, {"finetune": tune}]
    raw = recipe(seed, steps, cache, text)
    ctx = Runner(validate_recipe(raw, "structured"), out, quiet=True, overwrite=True).run()
    return ctx.merged


def _prune_step(target: float, allocation: str = "uniform", iterative: int = 1) -> dict:
    """Ours: heads and MLP units chosen together to `target` FLOPs (one member, a plain model)."""
    prune = {"pruner": "taylor", "members": 1, "target": {"flops": target}, "mlp_importance": "taylor"}
    return {"prune": {**prune, "allocation": allocation, "iterative_steps": iterative}}


def accumulate_gradients(model: torch.nn.Module, calib: list) -> None:
    """What torch-pruning's GroupTaylor needs: gradients of the loss summed over calibration batches."""
    model.zero_grad()
    for xb, yb in calib:
        F.cross_entropy(model(xb), yb).backward()


def narrowed(model: torch.nn.Module, calib: list, keep: float, x: torch.Tensor) -> torch.nn.Module:
    """An experiment, not a feature: `model` (a plain timm ViT) with its residual width (embedding
    dim) also narrowed to `keep`, the channels ranked by torch-pruning's GroupTaylor over the group
    rooted at the patch embedding, as MetaPruner narrows it."""
    import torch_pruning as tp

    model = copy.deepcopy(model).train()
    extra = [(model.cls_token, 2), (model.pos_embed, 2)]
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=x[:1], unwrapped_parameters=extra)
    accumulate_gradients(model, calib)
    dim = model.embed_dim
    every = graph.get_pruning_group(model.patch_embed.proj, tp.prune_conv_out_channels, idxs=list(range(dim)))
    scores = tp.importance.GroupTaylorImportance()(every)
    kept = int(round(dim * keep))
    graph.get_pruning_group(
        model.patch_embed.proj, tp.prune_conv_out_channels, idxs=scores.argsort()[: dim - kept].tolist()
    ).prune()
    model.embed_dim = model.num_features = model.head_hidden_size = kept
    model.zero_grad(set_to_none=True)
    return model.eval()


def ours_narrowed(
    seed: int, target: float, width: float, ft: int, out: Path, cache: Path, calib: list, x: torch.Tensor, data
) -> torch.nn.Module:
    """Ours to `target / width` FLOPs (heads and MLP units), then the width narrowed to `width`."""
    raw = recipe(seed, [_prune_step(target / width), {"merge": {"merger": "plain"}}], cache)
    ctx = Runner(validate_recipe(raw, "structured"), out, quiet=True, overwrite=True).run()
    model = narrowed(ctx.merged, calib, width, x)
    train(model, data.train, data.val, _tune_config(seed, ft, False))
    return model


def _tune_config(seed: int, ft: int, text: bool) -> TrainConfig:
    """The fine-tune every baseline model gets (what ours gets through its recipe)."""
    return TrainConfig(steps=ft, batch_size=128, lr=LR[text], eval_every=EVAL_EVERY[text], patience=3, seed=seed)


def taylor_prune(model: torch.nn.Module, pruner, calib: list) -> None:
    """What torch-pruning's examples do for GroupTaylor: accumulate gradients on calibration
    batches, then remove every group the pruner picks."""
    accumulate_gradients(model, calib)
    for group in pruner.step(interactive=True):
        group.prune()


def metapruner_bert(base: torch.nn.Module, calib: list, ratio: float, x: torch.Tensor) -> torch.nn.Module:
    """torch-pruning's MetaPruner as its transformers BERT example uses it (whole heads, GroupTaylor)."""
    import torch_pruning as tp
    from transformers.models.bert.modeling_bert import BertSelfAttention

    model = copy.deepcopy(base).train()
    model.encoder.pooler = None  # unused by the mean-pool head; outside the traced graph it would keep its width
    attentions = [m for m in model.modules() if isinstance(m, BertSelfAttention)]
    num_heads = {lin: m.num_attention_heads for m in attentions for lin in (m.query, m.key, m.value)}
    pruner = tp.pruner.MetaPruner(
        model, x[:1], importance=tp.importance.GroupTaylorImportance(), pruning_ratio=ratio,
        ignored_layers=[model.head], num_heads=num_heads, prune_head_dims=False, prune_num_heads=True,
        head_pruning_ratio=ratio,
    )  # fmt: skip
    taylor_prune(model, pruner, calib)
    for m in attentions:  # what its example sets by hand
        m.num_attention_heads = pruner.num_heads[m.query]
        m.attention_head_size = m.query.out_features // m.num_attention_heads
        m.all_head_size = m.query.out_features
    model.zero_grad(set_to_none=True)
    return model.eval()


def metapruner(base: torch.nn.Module, calib: list, target: float, x: torch.Tensor, text: bool) -> torch.nn.Module:
    """torch-pruning's MetaPruner as its timm ViT (or BERT) example uses it, at the ratio that meets `target`."""
    import timm
    import torch_pruning as tp

    def prune(ratio: float) -> torch.nn.Module:
        if text:
            return metapruner_bert(base, calib, ratio, x)
        model = copy.deepcopy(base).train()
        attentions = [m for m in model.modules() if isinstance(m, timm.layers.Attention)]
        num_heads = {m.qkv: m.num_heads for m in attentions}
        imp = tp.importance.GroupTaylorImportance()
        pruner = tp.pruner.MetaPruner(
            model, x[:1], importance=imp, pruning_ratio=ratio, ignored_layers=[model.head],
            num_heads=num_heads, prune_head_dims=True, round_to=2,
        )  # fmt: skip
        taylor_prune(model, pruner, calib)
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


def run_seed(
    seed: int,
    targets: list[float],
    ft: int,
    out: Path,
    text: bool,
    allocation: str = "uniform",
    distill: bool = True,
    widths: tuple[float, ...] = (),
    iterative: tuple[int, ...] = (),
    with_metapruner: bool = True,
) -> dict[str, dict]:
    cache = out / ".cache"
    raw = recipe(seed, [{"evaluate": {"plots": False}}], cache, text)
    ctx = Runner(validate_recipe(raw, "structured"), out / f"seed{seed}" / "base", quiet=True, overwrite=True).run()
    base, data = ctx.base, ctx.data
    calib = batches(data.train, 64, limit=256 if text else 512)
    x = next(iter(torch.utils.data.DataLoader(data.test, batch_size=64)))[0]
    models = {"base": base}
    for r in targets:
        folder = out / f"seed{seed}" / f"flops{r}"
        tag = "" if allocation == "uniform" else f", {allocation}"
        models[f"ours{tag} {r}x"] = ours(seed, r, ft, False, folder / f"ours{allocation}", cache, text, allocation)
        if distill:
            models[f"ours{tag} + distill {r}x"] = ours(
                seed, r, ft, True, folder / f"ours{allocation}_distill", cache, text, allocation
            )
        for k in iterative:
            models[f"ours{tag}, {k} steps {r}x"] = ours(
                seed, r, ft, False, folder / f"ours{allocation}_it{k}", cache, text, allocation, k
            )
        for w in widths:
            models[f"ours + width {w} {r}x"] = ours_narrowed(
                seed, r, w, ft, folder / f"ours_width{w}", cache, calib, x, data
            )
        if with_metapruner:
            mp = metapruner(base, calib, r, x, text)
            train(mp, data.train, data.val, _tune_config(seed, ft, text))
            models[f"torch-pruning MetaPruner {r}x"] = mp
        print(f"seed {seed}: {r}x done", flush=True)
    metrics = evaluate_models(models, data, out / f"seed{seed}", reference="base", write=False)
    return metrics["summary"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--targets", nargs="+", type=float, default=[0.7, 0.5, 0.35])
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument("--text", action="store_true", help="MiniLM on recipes/bert_hydra.yaml's sentiment benchmark")
    p.add_argument("--allocation", default="uniform", choices=["uniform", "global"], help="how ours meets the budget")
    p.add_argument("--no-distill", action="store_true", help="skip the 'ours + distill' rows")
    p.add_argument(
        "--width", nargs="+", type=float, default=[], help="ViT: also ours with the residual width narrowed to these"
    )
    p.add_argument(
        "--iterative", nargs="+", type=int, default=[], help="also ours reaching the target in this many steps"
    )
    p.add_argument("--no-metapruner", action="store_true", help="skip torch-pruning's MetaPruner rows")
    p.add_argument("--tag", default=None, help="results file name (default: structured[_text][_global])")
    p.add_argument("--out", default="runs/structured")
    p.add_argument("--merge", nargs="+", default=None, metavar="TAG", help="combine result files (seeds) into --tag")
    args = p.parse_args()
    if args.text and args.width:
        p.error("--width: the default ViT only (not with --text)")
    tag = args.tag or ("structured_text" if args.text else "structured") + (
        "" if args.allocation == "uniform" else "_global"
    )
    if args.merge:  # seeds run in separate processes, joined into one table
        merge_results(args.merge, tag, keep="targets")
        return
    t0 = time.time()
    per_seed = [
        run_seed(
            s,
            args.targets,
            args.finetune_steps,
            Path(args.out),
            args.text,
            args.allocation,
            not args.no_distill,
            tuple(args.width),
            tuple(args.iterative),
            not args.no_metapruner,
        )
        for s in args.seeds
    ]
    write_results(tag, args.seeds, per_seed, round((time.time() - t0) / 60, 1), targets=args.targets)


if __name__ == "__main__":
    main()
