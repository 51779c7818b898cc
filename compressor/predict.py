"""Uniform prediction: any model here (single, fused Hydra, list of members) -> member probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from compressor.data import loader
from compressor.distributed import gather_sampled


def member_logits(output: Any) -> torch.Tensor:
    """Model output -> logits [M, B, C]: a HydraOutput, a logits tensor [B, C] or an HF output."""
    if hasattr(output, "member_logits"):
        return output.member_logits
    if hasattr(output, "logits"):
        output = output.logits
    if isinstance(output, torch.Tensor):
        return output.unsqueeze(0) if output.dim() == 2 else output
    raise TypeError(f"cannot read logits from a {type(output).__name__}")


class DeepEnsemble(nn.Module):
    """M independent models run one after another; output like a fused model's."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        self.models = nn.ModuleList(models)

    def forward(self, x: torch.Tensor):
        from mergers.hydra.model import HydraOutput

        logits = torch.stack([member_logits(m(x))[0] for m in self.models])
        return HydraOutput(logits, logits.softmax(-1).mean(0))


class MCDropout(nn.Module):
    """Monte Carlo dropout: `samples` stochastic passes with dropout on (and the rest in eval)."""

    def __init__(self, model: nn.Module, samples: int = 8, p: float = 0.1) -> None:
        super().__init__()
        self.model, self.samples, self.p = model, samples, p

    def forward(self, x: torch.Tensor):
        from mergers.hydra.model import HydraOutput

        self.model.eval()
        drops = [m for m in self.model.modules() if isinstance(m, nn.Dropout)]
        old = [(d.p, d.training) for d in drops]
        for d in drops:
            d.p = max(d.p, self.p)
            d.train()
        try:
            logits = torch.stack([member_logits(self.model(x))[0] for _ in range(self.samples)])
        finally:
            for d, (p, t) in zip(drops, old):
                d.p, d.training = p, t
        return HydraOutput(logits, logits.softmax(-1).mean(0))


@torch.no_grad()
def predict(model: nn.Module, dataset: Dataset, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Member probabilities [M, N, C] over `dataset` (and its labels when it has them).

    Under torch.distributed each rank predicts its DistributedSampler shard; the shards are
    gathered back into dataset order on every rank (the sampler's padding dropped).
    """
    was_training = model.training
    model.eval()
    probs, labels = [], []
    try:
        for batch in loader(dataset, batch_size):
            probs.append(member_logits(model(batch[0])).float().softmax(-1))
            if len(batch) > 1:
                labels.append(batch[1])
    finally:
        model.train(was_training)
    n = len(dataset)
    all_labels = gather_sampled(torch.cat(labels), n) if labels else None
    return gather_sampled(torch.cat(probs, dim=1), n, dim=1), all_labels
