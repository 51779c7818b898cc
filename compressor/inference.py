"""Member probabilities of any model here (single, fused Hydra, ensembles of separate models) over a dataset."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.data import Dataset

from compressor.data import loader
from compressor.device import model_device
from compressor.distributed import gather_sampled
from compressor.outputs import logits_reader


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """`model` in eval mode inside the block, its previous mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def predict_logits(
    model: nn.Module, dataset: Dataset, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Member logits [M, N, C] (float32) over `dataset` (and its labels when it has them).

    Under torch.distributed each rank predicts its DistributedSampler shard; the shards are
    gathered back into dataset order on every rank (the sampler's padding dropped).
    """
    read = logits_reader(model)
    device = model_device(model)
    logits, labels = [], []
    with evaluating(model):
        for batch in loader(dataset, batch_size):
            logits.append(read(model(batch[0].to(device))).float())
            if len(batch) > 1:
                labels.append(batch[1].to(device))
    n = len(dataset)
    all_labels = gather_sampled(torch.cat(labels), n).cpu() if labels else None
    return gather_sampled(torch.cat(logits, dim=1), n, dim=1).cpu(), all_labels


def predict(model: nn.Module, dataset: Dataset, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Member probabilities [M, N, C] over `dataset` (and its labels when it has them)."""
    logits, labels = predict_logits(model, dataset, batch_size)
    return logits.softmax(-1), labels
