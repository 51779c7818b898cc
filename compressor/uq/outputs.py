"""Ensemble outputs, reading member logits from any model's output, and ensembles of separate models.

Every model the evaluation sees (a fused Hydra model, a Deep Ensemble of separate models, MC
dropout, or one plain model) is read as member logits [M, B, C]: a plain model is one member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn


class EnsembleOutput(NamedTuple):
    """member_logits: [M, B, C]; probs: the ensemble's averaged softmax, [B, C]."""

    member_logits: torch.Tensor
    probs: torch.Tensor

    @classmethod
    def from_logits(cls, member_logits: torch.Tensor) -> EnsembleOutput:
        """The averaged softmax in float32 at least: bf16 logits (autocast) would give rows summing to 0.998."""
        return cls(member_logits, _softmax_mean(member_logits))


def _softmax_mean(member_logits: torch.Tensor) -> torch.Tensor:
    """mean_m softmax(logits_m), computed in float32 or wider whatever the logits' dtype."""
    wide = member_logits if member_logits.dtype == torch.float64 else member_logits.float()
    return wide.softmax(-1).mean(0)


def ensemble_probs(output: Any, member_logits: torch.Tensor) -> torch.Tensor:
    """The ensemble prediction [B, C] of a model's `output`: its own `probs` when it returns an
    EnsembleOutput (a calibrated model's), else the mean of the members' softmax."""
    if isinstance(output, EnsembleOutput):
        return output.probs
    return _softmax_mean(member_logits)


def logits_reader(model: nn.Module) -> Callable[[Any], torch.Tensor]:
    """A function from `model`'s output to member logits [M, B, C] (found once per model)."""
    family = None

    def read(output: Any) -> torch.Tensor:
        nonlocal family
        if isinstance(output, EnsembleOutput):
            return output.member_logits
        if not isinstance(output, torch.Tensor):
            if family is None:
                from compressor.families import family_of

                family = family_of(model)
            output = family.output_logits(output)
        return output.unsqueeze(0) if output.dim() == 2 else output

    return read


class DeepEnsemble(nn.Module):
    """M independent models run one after another; output like a fused model's."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        self.models = nn.ModuleList(models)
        self._readers = [logits_reader(m) for m in models]

    def forward(self, x: torch.Tensor) -> EnsembleOutput:
        return EnsembleOutput.from_logits(torch.stack([r(m(x))[0] for m, r in zip(self.models, self._readers)]))

    def feature_layers(self) -> list[nn.Module]:
        """Each model's classifier: the layer whose input is its pooled feature."""
        from compressor.families import family_of

        return [family_of(m).classifier() for m in self.models]


class MCDropout(nn.Module):
    """Monte Carlo dropout: `samples` stochastic passes with dropout on (and the rest in eval)."""

    def __init__(self, model: nn.Module, samples: int = 8, p: float = 0.1) -> None:
        super().__init__()
        self.model, self.samples, self.p = model, samples, p
        self._read = logits_reader(model)

    def forward(self, x: torch.Tensor) -> EnsembleOutput:
        self.model.eval()
        drops = [m for m in self.model.modules() if isinstance(m, nn.Dropout)]
        old = [(d.p, d.training) for d in drops]
        for d in drops:
            d.p = max(d.p, self.p)
            d.train()
        try:
            logits = torch.stack([self._read(self.model(x))[0] for _ in range(self.samples)])
        finally:
            for d, (p, t) in zip(drops, old):
                d.p, d.training = p, t
        return EnsembleOutput.from_logits(logits)
