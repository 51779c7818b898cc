"""The run's one-page summary, `report.md`: what each step did and the metrics table."""

from __future__ import annotations

from compressor.context import RunContext
from compressor.io import atomic_write_text


def write_report(ctx: RunContext) -> None:
    lines = [f"# {ctx.recipe.name}", "", f"recipe: `{ctx.recipe.path}`", ""]
    for step, outcome in ctx.outcomes.items():
        lines.append(f"- {step}: {outcome}")
    if ctx.masks:
        lines += ["", f"members: {len(ctx.masks)}; kept heads per member: {[sum(m.num_kept()) for m in ctx.masks]}"]
    if ctx.metrics:
        lines += ["", ctx.metrics["table"]]
    atomic_write_text(ctx.out / "report.md", "\n".join(lines) + "\n")
