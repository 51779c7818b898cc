"""The export step: write the merged model to a folder that `compressor.load` rebuilds."""

from __future__ import annotations

from pathlib import PurePosixPath

import torch

from compressor.core.distributed import is_main
from compressor.core.schema import Field
from compressor.deploy.export import export_model
from compressor.run.context import RunContext
from compressor.run.runfolder import OUTPUTS
from compressor.run.steps.base import needs_earlier, register_step


def _inside_run_folder(v: str) -> str | None:
    """A folder strictly inside the run folder that is none of the run's own outputs."""
    p = PurePosixPath(v.strip())
    ok = str(p) not in ("", ".") and not p.is_absolute() and ".." not in p.parts and "\\" not in v
    if ok and (p.parts[0] in OUTPUTS or p.parts[0].startswith(".")):
        return f"a folder of its own inside the run folder, not the run's '{p.parts[0]}'"
    return None if ok else "a relative folder inside the run folder (not the run folder itself, no '..', not absolute)"


SCHEMA = {
    "dir": Field((str,), "export", check=_inside_run_folder, doc="folder under the run folder"),
    "onnx": Field((bool,), False, doc="also write model.onnx (needs onnx and onnxruntime)"),
}


@register_step("export", SCHEMA, check=needs_earlier("merge"))
def export(ctx: RunContext, cfg: dict) -> None:
    """Write model.safetensors, config.json and masks.json (and model.onnx) under the run folder."""
    example = next(iter(torch.utils.data.DataLoader(ctx.data.test, batch_size=2)))[0] if cfg["onnx"] else None
    if not is_main():
        return
    path = export_model(
        ctx.merged,
        ctx.out / cfg["dir"],
        ctx.masks,
        ctx.data.class_names,
        example,
        merger=ctx.merger_name,
        preprocessing=ctx.data.preprocessing,
    )
    ctx.outcomes["export"] = str(path)
    ctx.say(f"export: {path} (load with compressor.load('{path}'))")
