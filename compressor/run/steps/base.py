"""A step is a registered function over a typed config: one table from step name to its schema,
its function and its cross-step rule.

A third-party package adds a step the way it adds a pruner: an entry point in the group
`compressor.run.steps` naming a `Step` instance (or `register_step` in-process):

    from compressor.run.steps import Field, Step

    def report(ctx, cfg):
        "Write a CSV of the test predictions."
        ...

    report_step = Step("report", report, schema={"path": Field((str,), "preds.csv")})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compressor.core.registry import register
from compressor.core.schema import Field

if TYPE_CHECKING:
    from compressor.families import Family
    from compressor.run.context import RunContext

StepList = list[tuple[str, dict]]


@dataclass(frozen=True)
class Step:
    """One recipe step: `run(ctx, cfg)` does the work; `schema` types its config.

    `plugin` = (config key, registry kind) when the step names a plugin (its other keys are the
    plugin's options). `check(cfg, earlier, later)` returns an error text when the step does not
    fit where it stands in the recipe (earlier/later: the other steps as (name, config)).
    """

    name: str
    run: Callable[[RunContext, dict], None]
    schema: dict[str, Field] = field(default_factory=dict)
    plugin: tuple[str, str] | None = None
    check: Callable[[dict, StepList, StepList], str | None] | None = None
    preflight: Callable[[dict, Family], None] | None = None

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip()

    def __call__(self, ctx: RunContext, cfg: dict) -> None:
        self.run(ctx, cfg)


def register_step(
    name: str,
    schema: dict[str, Field] | None = None,
    plugin: tuple[str, str] | None = None,
    check: Callable[[dict, StepList, StepList], str | None] | None = None,
    preflight: Callable[[dict, Family], None] | None = None,
) -> Callable[[Callable], Step]:
    """Decorator: register the function as step `name` (in this process); returns the Step."""

    def deco(fn: Callable) -> Step:
        step = Step(name, fn, dict(schema or {}), plugin, check, preflight)
        register("step", name)(step)
        return step

    return deco


def needs_earlier(*names: str) -> Callable[[dict, StepList, StepList], str | None]:
    """A rule: one of the steps `names` must come before this one."""

    def check(cfg: dict, earlier: StepList, later: StepList) -> str | None:
        if not any(n in names for n, _ in earlier):
            return f"needs a '{names[0]}' step before it" + (f" (or {', '.join(names[1:])})" if names[1:] else "")
        return None

    return check
