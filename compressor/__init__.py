"""compressor: head pruning and Hydra ensembles for transformers.

import compressor
model = compressor.load("runs/vit_hydra/export")   # rebuild an exported model, no recipe
"""

from compressor.core.errors import CompressorError
from compressor.core.masks import HeadMask, load_masks, save_masks
from compressor.core.registry import register_importance, register_merger, register_pruner
from compressor.plugins import Importance, Merger, Pruner

__version__ = "0.1.0"


def load(path, device: str = "cpu", map_location: str | None = None):
    """Rebuild a model exported by the `export` step (any merger) from its folder, on `device`
    (the CPU by default; `map_location` is the older name of the same argument). It returns a
    `Calibrated` module: `.model` is the bare model, calling it gives `EnsembleOutput(member_logits,
    probs)`, and `.class_names`, `.preprocessing`, `.ood`, `.conformal` say what the export recorded."""
    from compressor.deploy.export import load_export

    return load_export(path, map_location=map_location or device)


def predict_inputs(export, inputs, batch_size: int = 64, top_k: int = 3, device: str = "cpu") -> list[dict]:
    """Per-sample predictions with uncertainty and an OOD flag (what `compressor predict` writes)."""
    from compressor.deploy.predict import predict_inputs as run

    return run(export, inputs, batch_size, top_k, device)


__all__ = [
    "CompressorError",
    "HeadMask",
    "Importance",
    "Merger",
    "Pruner",
    "__version__",
    "load",
    "predict_inputs",
    "load_masks",
    "register_importance",
    "register_merger",
    "register_pruner",
    "save_masks",
]
