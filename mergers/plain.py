"""The plain merger: one head mask -> a physically smaller model of the same family."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from compressor.adapters import get_adapter
from compressor.masks import HeadMask, MaskError
from compressor.registry import register_merger
from mergers.base import Merger


def prune_physically(model: nn.Module, mask: HeadMask) -> nn.Module:
    """A copy of `model` with the heads `mask` drops removed from its weights (no gates left)."""
    pruned = copy.deepcopy(model)
    adapter = get_adapter(pruned)
    adapter.remove_gates()
    mask.validate(adapter.heads_per_block(), allow_empty_blocks=False, where="plain merger")
    for b in range(adapter.num_blocks):
        if mask.num_kept()[b] < adapter.num_heads(b):
            adapter.prune_heads_(b, mask.kept_indices(b))
    return pruned


@register_merger("plain")
class PlainMerger(Merger):
    """Physically remove pruned heads: a smaller model of the same family, no gates, no hooks."""

    def __init__(self, member: int = 0) -> None:
        self.member = member

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> nn.Module:
        if not 0 <= self.member < len(masks):
            raise MaskError(f"plain merger: member {self.member} requested, {len(masks)} masks given")
        source = members[self.member] if members is not None else base
        return prune_physically(source, masks[self.member])
