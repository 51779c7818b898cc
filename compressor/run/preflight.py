"""Checks that need the model's architecture and one real batch, run before any training (and by
`compressor validate`): the family is supported, a checkpoint's tensor names and shapes fit the
model, one test batch runs through the model, and every
step can handle the architecture (head counts for pruners, fusability for the hydra merger)."""

from __future__ import annotations

import torch
from torch import nn

from compressor.core.errors import CompressorError, InputError, first_line
from compressor.core.modes import evaluating
from compressor.core.registry import resolve
from compressor.core.weights import check_fits
from compressor.data.bundle import DataBundle
from compressor.families import family_of
from compressor.run.recipe import Recipe


def preflight(recipe: Recipe, model: nn.Module, data: DataBundle) -> None:
    """Raise an InputError (of the kind the failing check raised) naming the recipe and the key at fault."""
    where = recipe.path
    try:
        family = family_of(model)
    except CompressorError as e:
        raise e.at(f"{where}: model") from e
    if recipe.model.get("checkpoint"):  # shapes from the file's header, before any weights are read
        try:
            check_fits(recipe.model["checkpoint"], model)
        except CompressorError as e:
            raise e.at(f"{where}: model.checkpoint") from e
    x = next(iter(torch.utils.data.DataLoader(data.test, batch_size=2)))[0]
    try:
        with evaluating(model), torch.no_grad():
            family.logits(x)
    except Exception as e:  # any failure of the real forward pass is the model/data pairing's fault
        raise InputError(f"{where}: model/data: one test batch does not run through the model ({first_line(e)})") from e
    for i, (name, cfg) in enumerate(recipe.steps):
        check = resolve("step", name).preflight
        if check is None:
            continue
        try:
            check(cfg, family)
        except CompressorError as e:
            raise e.at(f"{where}: steps[{i}].{name}") from e
