"""A model with its calibration attached: temperature, OOD threshold (on probabilities or, for
Mahalanobis, on pooled features), conformal thresholds, and what an export recorded.

`scored` gives the calibrated output and each sample's OOD score exactly as the calibrate step
computed the threshold and as `predict` flags it.
"""

from __future__ import annotations

import torch
from torch import nn

from compressor.core.errors import OptionError
from compressor.uq.calibration import TEMPERATURE_SCOPES, apply_temperature
from compressor.uq.features import captured_features, feature_layers
from compressor.uq.outputs import EnsembleOutput, logits_reader
from compressor.uq.posthoc import Mahalanobis
from compressor.uq.scores import FEATURE_SCORES, ood_score


class Calibrated(nn.Module):
    """`model` with a temperature, an OOD threshold (`ood`: {"score", "tpr", "threshold"}, or
    empty; `feature_score`: the fitted Mahalanobis when that score reads features) and conformal
    thresholds (`conformal`: {"coverage", "method", "lac", "aps"}, or empty)
    attached. Scope 'ensemble': one temperature on the ensemble's log-probabilities
    (members' logits untouched); 'member': member logits divided by `temperature` ([M] or [1]).
    Output: EnsembleOutput whose `probs` is the calibrated ensemble prediction (float64).
    `class_names` and `preprocessing` are what an export recorded (empty when not known); an
    image model's preprocessing is also its `pretrained_cfg`, where timm.data.resolve_data_config
    reads it."""

    def __init__(
        self,
        model: nn.Module,
        temperature: torch.Tensor | float = 1.0,
        ood: dict | None = None,
        scope: str = "ensemble",
        conformal: dict | None = None,
        class_names: list[str] | None = None,
        preprocessing: dict | None = None,
        feature_score: Mahalanobis | None = None,
    ) -> None:
        super().__init__()
        if scope not in TEMPERATURE_SCOPES:
            raise OptionError(f"temperature scope: expected one of {', '.join(TEMPERATURE_SCOPES)}, got {scope!r}")
        self.model = model
        self.register_buffer("temperature", torch.as_tensor(temperature, dtype=torch.float32).flatten().clone())
        self.scope = scope
        self.ood = dict(ood or {})
        self.conformal = dict(conformal or {})
        self.class_names = list(class_names or [])
        self.preprocessing = dict(preprocessing or {})
        self.feature_score = feature_score
        if (self.ood.get("score") in FEATURE_SCORES) != (feature_score is not None):
            raise OptionError(f"Calibrated: OOD score {self.ood.get('score')!r} with feature_score={feature_score!r}")
        self._read = logits_reader(model)

    @property
    def pretrained_cfg(self) -> dict:
        """An image model's recorded preprocessing in timm's spelling (lists as tuples); {} for text."""
        if self.preprocessing.get("kind") == "text":
            return {}
        return {k: tuple(v) if isinstance(v, list) else v for k, v in self.preprocessing.items() if k != "kind"}

    @property
    def members(self) -> int:
        """The wrapped model's member count (1 for a single model)."""
        return int(getattr(self.model, "members", 1))

    def forward(self, x: torch.Tensor) -> EnsembleOutput:
        return apply_temperature(self._read(self.model(x)), self.temperature, self.scope)

    def scored(self, x: torch.Tensor, score: str | None = None) -> tuple[EnsembleOutput, torch.Tensor | None]:
        """The calibrated output and each sample's OOD score [B] (float64): `score`, default the
        stored threshold's; None when neither names one. Feature scores read the pooled features
        of the same forward pass."""
        score = score or self.ood.get("score")
        if score not in FEATURE_SCORES:
            out = self(x)
            return out, None if score is None else ood_score(out.member_logits.double().softmax(-1), score, out.probs)
        if self.feature_score is None:
            raise OptionError(f"Calibrated.scored: '{score}' needs a fitted feature score (calibrate step)")
        with captured_features(self) as capture:
            out = self(x)
        return out, self.feature_score(capture.take(self.members))

    def feature_layers(self) -> list[nn.Module]:
        """The wrapped model's classifier layer(s), whose input is the pooled feature."""
        return feature_layers(self.model)

    def config(self) -> dict:
        """What an export records: the temperatures, their scope, the OOD and conformal thresholds."""
        return {
            "temperature": self.temperature.tolist(),
            "temperature_scope": self.scope,
            "ood": self.ood,
            "conformal": self.conformal or None,
        }
