"""The Merger interface: base model + head masks (+ fine-tuned members) -> one nn.Module."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from compressor.masks import HeadMask


class Merger:
    """Base class: subclasses implement `merge`."""

    plugin_name = "base"

    def merge(
        self,
        base: nn.Module,
        masks: Sequence[HeadMask],
        members: Sequence[nn.Module] | None = None,
        calibration: Sequence[torch.Tensor] | None = None,
    ) -> nn.Module:
        """Return the merged model. `members[i]`, if given, is member i fine-tuned (masked)."""
        raise NotImplementedError
