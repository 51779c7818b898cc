"""Pooled features of every member, read as the input of the classifier layer(s) by forward hooks.

Feature-based OOD scores (Mahalanobis) need the feature each member classifies, [M, B, D]: a
single model has one classifier (its family's), a fused Hydra model and a Deep Ensemble declare
theirs with `feature_layers()` (one per member, or one shared layer that sees every member's
features as [M * B, D], member-major). Hooks read them during the ordinary forward pass, so
features cost no second pass and match the logits exactly, chunked CPU inference included
(`compressor.uq.inference.predict_with_features` over a dataset).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from compressor.core.errors import InputError


def feature_layers(model: nn.Module) -> list[nn.Module]:
    """The layer(s) whose input is the pooled feature: `model.feature_layers()` when the model
    declares them (ensembles), else its family's classifier."""
    if hasattr(model, "feature_layers"):
        return list(model.feature_layers())
    from compressor.families import family_of

    return [family_of(model).classifier()]


class FeatureCapture:
    """What the hooks saw since the last `take()`, assembled as [M, B, D]."""

    def __init__(self, layers: int) -> None:
        self.seen: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    def take(self, members: int) -> torch.Tensor:
        """The features of every input since the last call, [M, B, D] (float32), then forgotten."""
        layers, m = len(self.seen), members
        if layers not in (1, m):
            raise InputError(f"features: {layers} classifier layers for {m} members; expected 1 or {m}")
        if not all(self.seen):
            raise InputError("features: the classifier layer never ran (a model without a classifier has no features)")
        if len(self.seen) == 1:  # one shared layer: each call saw [M * b, D] (or [b, D] for one member)
            out = torch.cat([f.float().reshape(m, -1, f.shape[-1]) for f in self.seen[0]], dim=1)
        else:
            out = torch.stack([torch.cat(parts).float() for parts in self.seen])
        self.seen = [[] for _ in self.seen]
        return out


@contextmanager
def captured_features(model: nn.Module) -> Iterator[FeatureCapture]:
    """Within the block, every forward pass of `model` records its members' pooled features."""
    layers = feature_layers(model)
    capture = FeatureCapture(len(layers))
    hooks = [
        layer.register_forward_hook(lambda module, args, out, i=i: capture.seen[i].append(args[0].detach()))
        for i, layer in enumerate(layers)
    ]
    try:
        yield capture
    finally:
        for hook in hooks:
            hook.remove()
