"""Member probabilities of any model here (single, fused Hydra, ensembles of separate models) over a dataset."""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import Dataset

from compressor.core.device import model_device
from compressor.core.distributed import gather_sampled
from compressor.core.modes import evaluating
from compressor.data.bundle import loader
from compressor.uq.features import captured_features
from compressor.uq.outputs import ensemble_probs, logits_reader


class Predictions(NamedTuple):
    """A model's outputs over a dataset: member probabilities [M, N, C], the model's own ensemble
    prediction [N, C] (calibrated where the model is), and the labels when the dataset has them."""

    member_probs: torch.Tensor
    probs: torch.Tensor
    labels: torch.Tensor | None


@torch.no_grad()
def _outputs(
    model: nn.Module, dataset: Dataset, batch_size: int, features: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Member logits [M, N, C], ensemble probabilities [N, C], labels and, when asked, the
    members' pooled features [M, N, D] (read in the same forward passes), in dataset order."""
    read = logits_reader(model)
    device = model_device(model)
    logits, probs, labels, feats = [], [], [], []
    with evaluating(model), captured_features(model) if features else nullcontext() as capture:
        for batch in loader(dataset, batch_size):
            out = model(batch[0].to(device))
            member_logits = read(out).float()
            logits.append(member_logits)
            probs.append(ensemble_probs(out, member_logits).float())
            if len(batch) > 1:
                labels.append(batch[1].to(device))
            if features:
                feats.append(capture.take(member_logits.shape[0]).to(device))
    n = len(dataset)
    all_labels = gather_sampled(torch.cat(labels), n).cpu() if labels else None
    return (
        gather_sampled(torch.cat(logits, dim=1), n, dim=1).cpu(),
        gather_sampled(torch.cat(probs), n).cpu(),
        all_labels,
        gather_sampled(torch.cat(feats, dim=1), n, dim=1).cpu() if features else None,
    )


def predict_logits(
    model: nn.Module, dataset: Dataset, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Member logits [M, N, C] (float32) over `dataset` (and its labels when it has them).

    Under torch.distributed each rank predicts its DistributedSampler shard; the shards are
    gathered back into dataset order on every rank (the sampler's padding dropped).
    """
    logits, _, labels, _ = _outputs(model, dataset, batch_size)
    return logits, labels


def predict_logits_and_features(
    model: nn.Module, dataset: Dataset, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`predict_logits` and the members' pooled features [M, N, D] from the same forward passes."""
    logits, _, labels, features = _outputs(model, dataset, batch_size, features=True)
    return logits, labels, features


def predict(model: nn.Module, dataset: Dataset, batch_size: int = 256) -> Predictions:
    """Member probabilities, the model's ensemble prediction and the labels over `dataset`."""
    logits, probs, labels, _ = _outputs(model, dataset, batch_size)
    return Predictions(logits.softmax(-1), probs, labels)


def predict_with_features(
    model: nn.Module, dataset: Dataset, batch_size: int = 256
) -> tuple[Predictions, torch.Tensor]:
    """`predict` and the members' pooled features [M, N, D] (`compressor.uq.features`) from the
    same forward passes: a feature-based OOD score costs no second pass over the data."""
    logits, probs, labels, features = _outputs(model, dataset, batch_size, features=True)
    return Predictions(logits.softmax(-1), probs, labels), features
