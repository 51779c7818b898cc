"""Masks read from a JSON file (for example an earlier run's masks.json): reuse a selection as is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compressor.core.errors import MaskError
from compressor.core.masks import HeadMask, load_masks
from compressor.core.schema import Field
from compressor.families import Family
from compressor.plugins import Batch, Pruner, checked_options

FILE_OPTIONS = {
    "path": Field(
        (str,),
        "masks.json",
        check=lambda v: None if Path(v).is_file() else "an existing mask file (e.g. an earlier run's masks.json)",
    )
}


class MaskFilePruner(Pruner):
    """Load the members' head masks from a masks.json file (checked against the model)."""

    keep_ratio_selects_heads = False  # keep_ratio is a share of its own heads (or unused)

    def __init__(self, path: str = "masks.json", **kwargs) -> None:
        super().__init__(**kwargs)
        self.path = checked_options({"path": path}, FILE_OPTIONS)["path"]

    def preflight(self, family: Family) -> None:
        self.prune(family)

    def prune(
        self, family: Family, calibration: Sequence[Batch] = (), heldout: Sequence[Batch] | None = None
    ) -> list[HeadMask]:
        masks = load_masks(self.path)
        if len(masks) < self.members:
            raise MaskError(f"{self.path}: holds {len(masks)} members, the recipe asks for {self.members}")
        for i, m in enumerate(masks[: self.members]):
            m.validate(family.heads_per_block(), self.allow_empty_blocks, where=f"{self.path}: members[{i}]")
        return masks[: self.members]
