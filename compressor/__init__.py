"""compressor: head pruning and Hydra ensembles for transformers.

import compressor
model = compressor.load("runs/vit_hydra/export")   # rebuild an exported model, no recipe
"""

from compressor.errors import CompressorError
from compressor.masks import HeadMask, load_masks, save_masks
from compressor.plugins import Importance, Merger, Pruner
from compressor.registry import register_importance, register_merger, register_pruner

__version__ = "0.1.0"


def load(path, map_location: str = "cpu"):
    """Rebuild a model exported by the `export` step (any merger) from its folder."""
    from compressor.export import load_export

    return load_export(path, map_location=map_location)


__all__ = [
    "CompressorError",
    "HeadMask",
    "Importance",
    "Merger",
    "Pruner",
    "__version__",
    "load",
    "load_masks",
    "register_importance",
    "register_merger",
    "register_pruner",
    "save_masks",
]
