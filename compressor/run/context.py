"""What a run's steps share: the recipe, the run folder, the data, the base model and what earlier
steps produced (masks, members, the merged model, metrics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from compressor.core.masks import HeadMask
from compressor.data.bundle import DataBundle, batches
from compressor.families import Family, family_of
from compressor.run.recipe import Recipe


@dataclass
class RunContext:
    """Handed to every step's function; steps read and set its fields."""

    recipe: Recipe
    out: Path
    data: DataBundle
    base: nn.Module
    say: Callable[[str], None] = print
    cache_dir: Path | None = None  # where trained base models are cached
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    masks: list[HeadMask] | None = None
    scores: list | None = None  # per member, per block head scores of the last prune step
    shared_blocks: int = 0  # the last prune step's shared trunk: leading blocks whole and frozen in every member
    members: list[nn.Module] | None = None  # fine-tuned (head-masked) members
    merged: nn.Module | None = None
    merger_name: str | None = None
    merger_options: dict = field(default_factory=dict)  # what the merge step built the merger with
    metrics: dict | None = None
    outcomes: dict[str, str] = field(default_factory=dict)  # step label -> one line for the report
    log: dict = field(default_factory=dict)  # step label -> details (training histories, ...)

    @property
    def family(self) -> Family:
        return family_of(self.base)

    def calibration(self) -> tuple[list, list]:
        """(calibration batches from the train split, held-out batches from the val split)."""
        d = self.recipe.data
        calib = batches(self.data.train, d["batch_size"], limit=d["calibration_samples"])
        return calib, batches(self.data.val, d["batch_size"])

    def outlier_batches(self) -> list | None:
        """Batches of validation outlier inputs (never a test OOD set), or None when there are none."""
        if self.data.ood_val is None:
            return None
        return [b[0] for b in batches(self.data.ood_val, self.recipe.data["batch_size"])]
