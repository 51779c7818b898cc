"""Hydra vs single model vs Deep Ensemble: latency, peak memory, FLOPs and parameters, side by side.

    python benchmarks/hydra_speed.py                 # vit_tiny and vit_small shapes, batch 1 and 64
    python benchmarks/hydra_speed.py --shapes vit_tiny --batches 1 8 --repeats 5
    python benchmarks/hydra_speed.py --dtype fp32 bf16   # bf16 autocast beside fp32, same run
    python benchmarks/hydra_speed.py --device cuda --dtype fp32 bf16 --batches 64 256

Every model is timed in the same process, round-robin (one call of each per round), and the
median over rounds is reported with its ratio to the single model: machines here are shared and
noisy, so compare ratios, not seconds. Peak memory is the growth of the peak resident set during
one forward pass, measured in a fresh subprocess per model. Members keep H/M heads per block
(all members together keep as many heads as the base); 'pruned' keeps 1/M of each MLP.
The fused models run CPU inference in batch chunks (`inference_chunk_bytes`); 'single_split' is
the single model run in chunks under the same budget, to show what chunking alone is worth.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from compressor.core.device import check_precision, precision_context, resolve_device, synchronize
from compressor.core.masks import HeadMask
from compressor.families import family_of
from compressor.uq.outputs import DeepEnsemble
from mergers.hydra import build_hydra
from mergers.hydra.layers import run_in_chunks
from mergers.hydra.model import INFERENCE_CHUNK_BYTES

SHAPES = {
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
}
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
MODELS = [
    "single",
    "single_split",
    "deep_ensemble",
    "hydra_average",
    "hydra_average_trunk",
    "hydra_grouped",
    "hydra_pruned",
    "hydra_pruned_tuned",
]


class SplitBatch(torch.nn.Module):
    """The single timm model run in batch chunks under the same activation budget as the fused
    models' CPU inference: shows what chunking alone gives a single model (fairness check)."""

    def __init__(self, model: torch.nn.Module, chunk_bytes: int) -> None:
        super().__init__()
        self.model, self.chunk_bytes = model, chunk_bytes
        self.widest = max(max(b.attn.qkv.out_features, b.mlp.fc1.out_features) for b in model.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_sample = self.model.pos_embed.shape[1] * self.widest * x.element_size()
        return run_in_chunks(self.model, x, per_sample, self.chunk_bytes, out_batch_dim=0)


def build(shape: str, kind: str, chunk_bytes: int = INFERENCE_CHUNK_BYTES, members: int = 3) -> torch.nn.Module:
    """One benchmarked model; `chunk_bytes` is the CPU inference chunk budget (0: whole batches)."""
    torch.manual_seed(0)
    base = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=1000, **SHAPES[shape]).eval()
    if kind == "single":
        return base
    if kind == "single_split":
        return SplitBatch(base, chunk_bytes).eval()
    if kind == "deep_ensemble":
        return DeepEnsemble([base] + [build(shape, "single") for _ in range(members - 1)]).eval()
    heads = family_of(base).heads_per_block()
    masks = []
    for m in range(members):  # disjoint split: member m keeps heads m, m+M, ...
        masks.append(HeadMask.from_kept([list(range(m, h, members)) or [m % h] for h in heads], heads))
    if kind.endswith("_trunk"):  # prune.shared_blocks: the first 2/3 of the blocks whole, run once
        masks = [mask.with_whole_blocks(2 * len(heads) // 3) for mask in masks]
        kind = kind.removesuffix("_trunk")
    tuned = None
    if kind.endswith("_tuned"):  # as after fine-tuning members separately: every part differs per member
        tuned = [_perturbed(base, seed) for seed in range(members)]
    mode = kind.removeprefix("hydra_").removesuffix("_tuned")
    model = build_hydra(base, masks, members=tuned, mlp_mode=mode).eval()
    model.inference_chunk_bytes = chunk_bytes
    return model


def _perturbed(base: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy of `base` with every weight nudged: stems, norms and heads then differ per member,
    so the fused model keeps one of each per member, as the default recipe's does."""
    member = copy.deepcopy(base)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in member.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=g))
    return member


def flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_memory_child(shape: str, kind: str, batch: int, chunk_bytes: int) -> None:
    """Peak resident memory added by the first forward pass (Linux: VmHWM reset through clear_refs).

    No warm-up: after one, the allocator would serve the second pass from memory it already holds.
    """
    model = build(shape, kind, chunk_bytes)
    x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS high-water mark to the current RSS
        before = _status_kb("VmRSS")
        model(x)
    print(json.dumps({"peak_mb": max(_status_kb("VmHWM") - before, 0) / 1024}))


def peak_memory(shape: str, kind: str, batch: int, chunk_bytes: int) -> float:
    cmd = [sys.executable, __file__, "--child", shape, kind, str(batch), str(chunk_bytes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def time_round_robin(
    models: dict[str, torch.nn.Module], x: torch.Tensor, repeats: int, device: torch.device, dtype: str
) -> dict[str, float]:
    """Median latency per model, one call of each per round; under autocast for bf16/fp16."""
    times: dict[str, list[float]] = {k: [] for k in models}
    with torch.no_grad(), precision_context(device, dtype):
        for m in models.values():
            m(x)  # warm-up
        for _ in range(repeats):
            for name, m in models.items():
                synchronize(device)
                t0 = time.perf_counter()
                m(x)
                synchronize(device)
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _finite(v: float) -> float | None:
    return v if v == v else None  # NaN (not measured) -> null: strict JSON


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16", "fp16"], help="autocast precisions")
    p.add_argument("--no-memory", action="store_true", help="skip the per-model peak-memory subprocesses")
    p.add_argument(
        "--chunk-mib", type=float, default=None, help="inference_chunk_bytes in MiB for every model (0: no chunking)"
    )
    p.add_argument("--tag", default="", help="entry <device>[_tag] of benchmarks/results/hydra_speed.json")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    chunk = INFERENCE_CHUNK_BYTES if args.chunk_mib is None else int(args.chunk_mib * 2**20)
    if args.child:
        peak_memory_child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return
    device = resolve_device(args.device)
    for dtype in args.dtype:
        check_precision(dtype, device)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"torch {torch.__version__}, {where}; median of {args.repeats} round-robin rounds; "
        f"inference chunks of {chunk / 2**20:g} MiB (CPU only)\n"
    )
    print("| shape | batch | model | dtype | latency ms | x single | x fp32 | peak MB | GFLOPs | x single | params M |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in args.shapes:
        models = {k: build(shape, k, chunk).to(device) for k in MODELS}
        for batch in args.batches:
            x = torch.randn(batch, 3, 224, 224, device=device)
            reps = args.repeats if batch > 1 else 5 * args.repeats
            lat = {dtype: time_round_robin(models, x, reps, device, dtype) for dtype in args.dtype}
            fl = {k: flops(m, x) for k, m in models.items()}
            use_mem = not args.no_memory and device.type == "cpu"
            mem = {k: (peak_memory(shape, k, batch, chunk) if use_mem else float("nan")) for k in models}
            for dtype in args.dtype:
                for k, m in models.items():
                    params = sum(q.numel() for q in m.parameters()) / 1e6
                    vs_fp32 = lat[dtype][k] / lat["fp32"][k] if "fp32" in lat else float("nan")
                    rows.append(
                        {"shape": shape, "batch": batch, "model": k, "dtype": dtype, "latency_s": lat[dtype][k],
                         "x_single": lat[dtype][k] / lat[dtype]["single"], "x_fp32": _finite(vs_fp32),
                         "peak_mb": _finite(mem[k]), "flops": fl[k], "flops_x_single": fl[k] / fl["single"],
                         "params_m": params}
                    )  # fmt: skip
                    print(
                        f"| {shape} | {batch} | {k} | {dtype} | {lat[dtype][k] * 1e3:.1f} | "
                        f"{lat[dtype][k] / lat[dtype]['single']:.2f} | {vs_fp32:.2f} | {mem[k]:.0f} | "
                        f"{fl[k] / 1e9:.1f} | {fl[k] / fl['single']:.2f} | {params:.1f} |",
                        flush=True,
                    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "device": where, "repeats": args.repeats, "chunk_bytes": chunk}
    out = RESULTS / "hydra_speed.json"  # one file, one entry per configuration
    key = f"{device.type}{'_' + args.tag if args.tag else ''}"
    runs = json.loads(out.read_text()) if out.is_file() else {}
    runs[key] = {**meta, "rows": rows}
    out.write_text(json.dumps(runs, indent=1))
    print(f"\nwritten: {out} [{key}]")


if __name__ == "__main__":
    main()
