"""What one training run takes: the step budget, optimiser settings, early stopping and the ensemble levers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """Settings of `compressor.training.loop.train`."""

    steps: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 10
    label_smoothing: float = 0.0
    eval_every: int = 25
    patience: int | None = None  # evaluations without improvement before stopping; None: never
    keep: str = "best"  # the weights kept at the end: "best" held-out NLL, or "last" as trained
    seed: int = 0
    bootstrap: bool = False  # ensembles: each member weighs each sample by its own Poisson(1) draw
    ensemble_member: bool = False  # one member trained alone: per-member levers (bootstrap) apply to it
    disagreement: float = 0.0  # ensembles: reward for member disagreement on synthetic outliers
    distill_alpha: float = 0.0  # weight of logit distillation from a teacher (0: plain cross-entropy)
    distill_temperature: float = 2.0
