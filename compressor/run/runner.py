"""Run a validated recipe: data and base model (checked before any training), then each step's
registered function in order, then the one-page report. Only orchestration lives here."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from tqdm.auto import tqdm

from compressor.core.device import precision_context, resolve_device
from compressor.core.distributed import barrier, init_from_env, is_main, world_size
from compressor.core.errors import InputError
from compressor.core.registry import resolve
from compressor.data import load_bundle
from compressor.data.bundle import DataBundle
from compressor.run.context import RunContext
from compressor.run.models import build_base, create_model, create_timm
from compressor.run.preflight import preflight
from compressor.run.recipe import Recipe, recipe_folder
from compressor.run.report import write_report
from compressor.run.runfolder import RunFolder


class Runner:
    """Executes one recipe; `run()` returns the final RunContext and writes `report.md`."""

    def __init__(
        self, recipe: Recipe, out_dir: str | Path | None = None, quiet: bool = False, overwrite: bool = False
    ) -> None:
        self.recipe = recipe
        self.overwrite = overwrite
        self.out = Path(out_dir or recipe.out or Path("runs") / recipe.name)
        self.cache_dir = Path(recipe.cache_dir) if recipe.cache_dir else self.out.parent / ".cache"
        self.quiet = quiet
        self.device = resolve_device(recipe.device)

    def say(self, text: str) -> None:
        if not self.quiet and is_main():
            tqdm.write(text)

    def load_data(self) -> DataBundle:
        r = self.recipe
        probe = None
        images = r.data["source"] == "dataset" and r.data["image_column"]
        if r.data["source"] in ("image_folder", "fashion_mnist") or images:  # transforms follow the model's input size
            probe = create_timm(r.model["name"], r.model["kwargs"], 1, 3, pretrained=False)
        pretrained = bool(r.model["pretrained"] or r.model.get("weights"))  # weights a pretrained config describes
        data = load_bundle(r.data, r.model["name"], probe, pretrained=pretrained, base=recipe_folder(r.path))
        for note in data.notes:
            warnings.warn(note, stacklevel=2)
        return data

    @contextlib.contextmanager
    def _naming_recipe(self) -> Iterator[None]:
        """Input errors found while building data and model name the recipe file."""
        try:
            yield
        except InputError as e:
            if str(e).startswith(f"{self.recipe.path}: "):
                raise
            raise e.at(str(self.recipe.path)) from e

    def check(self) -> None:
        """Preflight without training: what `compressor validate` runs after the schema checks."""
        with self._naming_recipe():
            data = self.load_data()
            preflight(self.recipe, create_model(self.recipe.model, data), data)

    def setup(self) -> RunContext:
        r = self.recipe
        with self._naming_recipe():
            data = self.load_data()
            check = lambda m: preflight(r, m, data)  # noqa: E731
            base = build_base(r.model, data, r.data, r.seed, self.cache_dir, preflight=check, device=self.device)
        return RunContext(r, self.out, data, base, say=self.say, cache_dir=self.cache_dir, device=self.device)

    def run(self) -> RunContext:
        r = self.recipe
        if init_from_env(r.distributed.get("backend", "auto"), r.distributed.get("timeout_s", 1800)):
            self.say(f"distributed: {world_size()} processes")
        exports = [cfg["dir"] for name, cfg in r.steps if name == "export"]
        folder = RunFolder(self.out, exports, self.overwrite) if is_main() else contextlib.nullcontext()
        with folder:
            barrier()  # other ranks wait until rank 0 holds the folder
            ctx = self._run_steps()
            if is_main():
                write_report(ctx)
                folder.finish()
        barrier()
        return ctx

    def _run_steps(self) -> RunContext:
        r = self.recipe
        hidden = (self.quiet or not is_main()) or None  # None: tqdm hides the bar when stderr is not a terminal
        bar = tqdm(total=len(r.steps) + 1, desc=r.name, disable=hidden, dynamic_ncols=True)
        bar.set_postfix_str("model + data")
        started = time.time()
        try:
            with precision_context(self.device, r.precision):
                ctx = self.setup()
                ctx.log["started"] = started
                ctx.log["seconds"] = {"model + data": time.time() - started}
                bar.update(1)
                for i, (name, cfg) in enumerate(r.steps):
                    bar.set_postfix_str(name)
                    t0 = time.time()
                    resolve("step", name).run(ctx, cfg)
                    ctx.log["seconds"][f"{i + 1}. {name}"] = time.time() - t0
                    bar.update(1)
        except BaseException:
            bar.leave = False  # an error message starts on a clean line
            raise
        finally:
            bar.close()
        return ctx
