"""Run a validated recipe: model, data, then its steps in order, each writing under the run folder."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from compressor.adapters import get_adapter
from compressor.data import DataBundle, batches, digits_bundle, image_folder_bundle
from compressor.distributed import barrier, init_from_env, is_main, world_size
from compressor.evaluate import evaluate_models
from compressor.export import export_model
from compressor.io import atomic_write_text
from compressor.masks import HeadMask, MaskError, save_masks
from compressor.models import build_base
from compressor.plots import head_importance_heatmaps, reliability_diagram
from compressor.predict import DeepEnsemble, MCDropout, predict
from compressor.recipe import Recipe
from compressor.registry import resolve
from compressor.training import TrainConfig, train


@dataclass
class RunState:
    """What the steps hand to each other."""

    base: nn.Module
    data: DataBundle
    masks: list[HeadMask] | None = None
    scores: list | None = None
    members: list[nn.Module] | None = None
    merged: nn.Module | None = None
    merger_name: str | None = None
    metrics: dict | None = None
    log: dict = field(default_factory=dict)


def masked_member(base: nn.Module, mask: HeadMask) -> nn.Module:
    """A copy of `base` whose head gates apply `mask` (what a member is before fusing)."""
    member = copy.deepcopy(base)
    get_adapter(member).apply_mask(mask)
    return member


class Runner:
    """Executes one recipe; `run()` returns the final state and writes `report.md`."""

    def __init__(self, recipe: Recipe, out_dir: str | Path | None = None, quiet: bool = False) -> None:
        self.recipe = recipe
        self.out = Path(out_dir or recipe.out or Path("runs") / recipe.name)
        self.quiet = quiet
        self.state: RunState | None = None

    def say(self, text: str) -> None:
        if not self.quiet and is_main():
            tqdm.write(text)

    # --- setup ------------------------------------------------------------------------------
    def load_data(self, model_for_transforms: nn.Module | None = None) -> DataBundle:
        d = self.recipe.data
        if d["source"] == "digits":
            return digits_bundle(img_size=d["img_size"], seed=d["seed"])
        if d["source"] == "text":
            from compressor.text import text_bundle

            return text_bundle(self.recipe.model["name"], d["max_length"], seed=d["seed"])
        return image_folder_bundle(d["root"], model_for_transforms, d["ood_roots"], seed=d["seed"])

    def setup(self) -> RunState:
        r = self.recipe
        if is_main():
            self.out.mkdir(parents=True, exist_ok=True)
        if r.data["source"] == "image_folder":
            from compressor.models import create_timm

            probe = create_timm(r.model["name"], r.model["kwargs"], 1, 3, pretrained=False)
            data = self.load_data(probe)
        else:
            data = self.load_data()
        base = build_base(r.model, data, r.data, r.seed, cache_dir=Path("runs") / ".cache", preflight=self.preflight)
        return RunState(base=base, data=data)

    def preflight(self, model: nn.Module) -> None:
        """Checks that need the architecture, before any training: every prune step's head counts."""
        adapter = get_adapter(model)
        for i, (kind, cfg) in enumerate(self.recipe.steps):
            if kind != "prune":
                continue
            options = {k: v for k, v in cfg.items() if k != "pruner"}
            pruner = resolve("pruner", cfg["pruner"])(**options)
            try:
                for m in range(pruner.members):
                    for h in adapter.heads_per_block():
                        pruner.num_keep(h, m)
            except MaskError as e:
                raise MaskError(f"{self.recipe.path}: steps[{i}].prune: {e}") from e

    def calibration(self, state: RunState) -> tuple[list, list]:
        d = self.recipe.data
        calib = batches(state.data.train, d["batch_size"], limit=d["calibration_samples"])
        heldout = batches(state.data.val, d["batch_size"])
        return calib, heldout

    # --- steps ------------------------------------------------------------------------------
    def step_prune(self, state: RunState, cfg: dict) -> None:
        options = {k: v for k, v in cfg.items() if k != "pruner"}
        options.setdefault("seed", self.recipe.seed)
        pruner = resolve("pruner", cfg["pruner"])(**options)
        calib, heldout = self.calibration(state)
        adapter = get_adapter(state.base)
        state.masks = pruner.prune(adapter, calib, heldout)
        adapter.apply_mask(None)
        state.scores = pruner.last_scores
        state.members = None
        if is_main():
            save_masks(self.out / "masks.json", state.masks)
            if state.scores is not None:
                payload = [[s.tolist() for s in member] for member in state.scores]
                atomic_write_text(self.out / "head_scores.json", json.dumps(payload))
        kept = [sum(m.num_kept()) for m in state.masks]
        self.say(
            f"prune: {cfg['pruner']} -> {len(state.masks)} members keeping {kept} of "
            f"{sum(adapter.heads_per_block())} heads"
        )

    def _train_cfg(self, cfg: dict) -> TrainConfig:
        keys = TrainConfig.__dataclass_fields__
        return TrainConfig(**{k: v for k, v in cfg.items() if k in keys and k != "seed"}, seed=self.recipe.seed)

    def step_finetune(self, state: RunState, cfg: dict) -> None:
        target = cfg["target"]
        if target == "auto":
            target = "merged" if state.merged is not None else "members"
        tc = self._train_cfg(cfg)
        if target == "merged":
            if state.merged is None:
                raise RuntimeError("finetune target 'merged' needs a merge step before it")
            state.log["finetune_merged"] = train(
                state.merged, state.data.train, state.data.val, tc, desc="finetune merged"
            )
            return
        if state.masks is None:
            raise RuntimeError("finetune target 'members' needs a prune step before it")
        members = state.members or [masked_member(state.base, m) for m in state.masks]
        logs = []
        for i, member in enumerate(members):
            tc_i = TrainConfig(**{**tc.__dict__, "seed": tc.seed + i})
            logs.append(train(member, state.data.train, state.data.val, tc_i, desc=f"finetune member {i}"))
        state.members = members
        state.log["finetune_members"] = logs

    def step_merge(self, state: RunState, cfg: dict) -> None:
        options = {k: v for k, v in cfg.items() if k != "merger"}
        merger = resolve("merger", cfg["merger"])(**options)
        calib, _ = self.calibration(state)
        state.merged = merger.merge(state.base, state.masks, state.members, [b[0] for b in calib])
        state.merger_name = cfg["merger"]
        self.say(
            f"merge: {cfg['merger']} -> {type(state.merged).__name__}, "
            f"{sum(p.numel() for p in state.merged.parameters()) / 1e6:.2f}M parameters"
        )

    def _result_model(self, state: RunState) -> tuple[str, nn.Module] | None:
        if state.merged is not None:
            return state.merger_name or "merged", state.merged
        if state.members is not None:
            return "members", DeepEnsemble(state.members)
        if state.masks is not None:
            return "masked", DeepEnsemble([masked_member(state.base, m) for m in state.masks])
        return None

    def baseline_models(self, state: RunState, names: list[str], size: int | None) -> dict[str, nn.Module]:
        out: dict[str, nn.Module] = {}
        m = len(state.masks) if state.masks else 3
        for name in names:
            if name == "base":
                out["base"] = state.base
            elif name == "members" and state.masks:
                out["members (separate)"] = DeepEnsemble(
                    state.members or [masked_member(state.base, k) for k in state.masks]
                )
            elif name == "deep_ensemble":
                r = self.recipe
                models = [state.base] + [
                    build_base(r.model, state.data, r.data, r.seed + 1000 * (i + 1), Path("runs") / ".cache")
                    for i in range((size or m) - 1)
                ]
                out[f"deep_ensemble x{len(models)}"] = DeepEnsemble(models)
            elif name == "mc_dropout":
                out["mc_dropout"] = MCDropout(state.base, samples=size or 8)
            else:
                raise ValueError(
                    f"evaluate.baselines: unknown '{name}'; expected base, members, deep_ensemble, mc_dropout"
                )
        return out

    def step_evaluate(self, state: RunState, cfg: dict) -> None:
        models = {}
        result = self._result_model(state)
        if result is not None:
            models[result[0]] = result[1]
        models.update(self.baseline_models(state, cfg["baselines"], cfg["deep_ensemble_size"]))
        reference = "base" if "base" in models else None
        state.metrics = evaluate_models(
            models, state.data, self.out, self.recipe.data["batch_size"], reference, write=is_main()
        )
        if cfg["plots"]:
            plots = self.out / "plots"
            for name, model in models.items():
                probs, labels = predict(model, state.data.test)  # on every rank: predict gathers
                safe = "".join(c if c.isalnum() else "_" for c in name)
                if is_main():
                    reliability_diagram(probs.mean(0), labels, name, plots / f"reliability_{safe}.png")
            if state.masks and state.scores and is_main():
                head_importance_heatmaps(state.scores, state.masks, plots / "head_importance.png")
        self.say("evaluate:\n" + state.metrics["table"])

    def step_export(self, state: RunState, cfg: dict) -> None:
        model = state.merged
        if model is None:
            raise RuntimeError("export needs a merge step before it (hydra or plain)")
        r = self.recipe
        if r.model["source"] == "hf":
            enc = state.base.encoder
            base_info = {
                "source": "hf",
                "name": r.model["name"],
                "encoder_config": enc.config.to_dict(),
                "num_classes": state.data.num_classes,
                "pad_token_id": state.base.pad_token_id,
            }
        else:
            base_info = {
                "source": "timm",
                "name": r.model["name"],
                "kwargs": {**r.model["kwargs"], "num_classes": state.data.num_classes, "in_chans": state.data.in_chans},
            }
        example = next(iter(torch.utils.data.DataLoader(state.data.test, batch_size=2)))[0] if cfg["onnx"] else None
        if not is_main():
            return
        path = export_model(model, self.out / cfg["dir"], base_info, state.masks, state.data.class_names, example)
        self.say(f"export: {path} (load with compressor.load('{path}'))")

    # --- driver -----------------------------------------------------------------------------
    def run(self) -> RunState:
        steps = self.recipe.steps
        dist_cfg = self.recipe.distributed
        if init_from_env(dist_cfg.get("backend", "auto"), dist_cfg.get("timeout_s", 1800)):
            self.say(f"distributed: {world_size()} processes")
        bar = tqdm(
            total=len(steps) + 1, desc=f"{self.recipe.name}", disable=self.quiet or not is_main(), dynamic_ncols=True
        )
        bar.set_postfix_str("model + data")
        state = self.setup()
        self.state = state
        bar.update(1)
        for kind, cfg in steps:
            bar.set_postfix_str(kind)
            getattr(self, f"step_{kind}")(state, cfg)
            bar.update(1)
        bar.close()
        if is_main():
            self.write_report(state)
        barrier()
        return state

    def write_report(self, state: RunState) -> None:
        lines = [f"# {self.recipe.name}", "", f"recipe: `{self.recipe.path}`", ""]
        if state.masks:
            lines.append(
                f"members: {len(state.masks)}; kept heads per member: {[sum(m.num_kept()) for m in state.masks]}"
            )
        if state.metrics:
            lines += ["", state.metrics["table"]]
        atomic_write_text(self.out / "report.md", "\n".join(lines) + "\n")
