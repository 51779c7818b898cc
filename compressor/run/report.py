"""`report.md`: the run's one-page summary (what each step did, cost, members, metrics, plots)."""

from __future__ import annotations

import time

from compressor.core.io import atomic_write_text
from compressor.run.context import RunContext


def _cost_lines(ctx: RunContext) -> list[str]:
    if not ctx.metrics:
        return []
    lines = [
        "## Cost",
        "",
        "| model | parameters | x base | MFLOPs / sample | x base | latency x base |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in ctx.metrics["summary"].items():
        lines.append(
            f"| {name} | {r['params'] / 1e6:.2f}M | {r.get('params_ratio', 1):.2f} | {r.get('mflops', 0):.2f} "
            f"| {r.get('flops_ratio', 1):.2f} | {r.get('latency_ratio', 1):.2f} |"
        )
    return [*lines, ""]


def _time_lines(ctx: RunContext) -> list[str]:
    """Seconds per step (model + data: loading, preflight, the base trained or read from the cache)."""
    seconds = ctx.log.get("seconds") or {}
    if not seconds:
        return []
    total = sum(seconds.values())
    rows = [f"| {step} | {s:.0f} | {s / max(total, 1e-9):.0%} |" for step, s in seconds.items()]
    return ["## Time", "", "| step | seconds | share |", "|---|---|---|", *rows, f"| total | {total:.0f} | |", ""]


def _member_lines(ctx: RunContext) -> list[str]:
    if not ctx.metrics:
        return []
    lines = []
    for name, r in ctx.metrics["summary"].items():
        if "member_accuracy" in r:
            lines.append(
                f"- {name}: mean member accuracy {r['member_accuracy']:.3f} (ensemble {r['accuracy']:.3f}), "
                f"members disagree on {r['disagreement']:.1%} of test samples (mean over pairs)"
            )
    return ["## Members", "", *lines, ""] if lines else []


def write_report(ctx: RunContext) -> None:
    elapsed = time.time() - ctx.log.get("started", time.time())
    lines = [f"# {ctx.recipe.name}", "", f"recipe `{ctx.recipe.path}`, run time {elapsed / 60:.1f} min", ""]
    lines += ["## Steps", ""] + [f"- **data**: {note.removeprefix('data: ')}" for note in ctx.data.notes]
    lines += [f"- **{step}**: {outcome}" for step, outcome in ctx.outcomes.items()] + [""]
    tunes = {k: h for k, h in ctx.log.items() if k.startswith("finetune") and isinstance(h, dict) and "after" in h}
    if tunes:
        header = (
            "| fine-tune | acc before | acc after | NLL before | NLL after | ECE before | ECE after | kept step | s |"
        )
        lines += ["## Fine-tunes (held-out split)", "", header, "|---" * 9 + "|"]
        for label, h in tunes.items():
            b, a = h["before"], h["after"]
            kept = "0 (no step improved)" if h["best_step"] == 0 else str(h["best_step"])
            kept = f"last ({len(h['loss'])})" if h.get("kept") == "last" else kept
            lines.append(
                f"| {label} | {b['accuracy']:.3f} | {a['accuracy']:.3f} | {b['nll']:.3f} | {a['nll']:.3f} | "
                f"{b['ece']:.3f} | {a['ece']:.3f} | {kept} | {h['seconds']:.0f} |"
            )
        if "plots/finetune.png" in (ctx.log.get("plots") or []):
            lines += ["", "Loss and held-out NLL per step: [plots/finetune.png](plots/finetune.png)."]
    lines += [""] + _time_lines(ctx) + _cost_lines(ctx) + _member_lines(ctx)
    if ctx.metrics:
        lines += ["## Metrics", "", ctx.metrics["table"], "Details: `metrics.json`, `metrics.md`.", ""]
    plots = ctx.log.get("plots") or []
    if plots:
        lines += ["## Plots", ""] + [f"- [{p}]({p})" for p in plots] + [""]
    atomic_write_text(ctx.out / "report.md", "\n".join(lines) + "\n")
