"""What every recipe step reads (`DataBundle`) and how it is read: per-rank loaders, materialised
calibration batches and bootstrap resamples (torch.distributed aware)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from compressor.core.distributed import local_batch_size, rank, real_samples, sampler
from compressor.data.outliers import OutlierMaker


@dataclass
class DataBundle:
    """Everything a recipe's steps read: splits, OOD sets and shifted sets."""

    train: Dataset
    val: Dataset
    test: Dataset
    ood: dict[str, Dataset] = field(default_factory=dict)
    shift: dict[str, Dataset] = field(default_factory=dict)
    class_names: list[str] = field(default_factory=list)
    in_chans: int = 1
    img_size: int = 16
    ood_val: Dataset | None = None  # validation outliers (unlabelled; never a test OOD set)
    ood_kinds: dict[str, str] = field(default_factory=dict)  # OOD set name -> "near" or "far"
    preprocessing: dict = field(default_factory=dict)  # how raw inputs become model inputs (exports record it)
    make_outliers: OutlierMaker | None = None  # synthetic outliers from a batch of training inputs
    notes: list[str] = field(default_factory=list)  # one-line facts a user should see (validate, report)
    fingerprint: str = ""  # what the data's content hashes to, where files a user may edit hold it (cache keys)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def split_indices(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum([int(round(f * n)) for f in fractions[:-1]])
    return np.split(order, cuts)


class Unlabelled(Dataset):
    """The inputs of a labelled dataset, without its labels (OOD sets)."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        return (self.ds[i][0],)


def loader(ds: Dataset, batch_size: int, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> DataLoader:
    """This rank's DataLoader: a seeded `DistributedSampler` and the per-rank share of `batch_size`.

    In one process it reads every sample (shuffled with `seed + epoch` when asked); under
    torch.distributed each rank reads its shard and the N local batches of a step make up the
    global batch (see `compressor.core.distributed`).
    """
    return DataLoader(ds, batch_size=local_batch_size(batch_size), sampler=sampler(ds, shuffle, seed, epoch))


def sharded_batches(
    ds: Dataset, batch_size: int, shuffle: bool = False, seed: int = 0, epoch: int = 0
) -> Iterator[tuple[tuple[torch.Tensor, ...], int]]:
    """Yield (this rank's batch, how many of its samples are real): the rest are sampler padding."""
    left = real_samples(len(ds))
    for batch in loader(ds, batch_size, shuffle, seed, epoch):
        n = len(batch[0])
        yield tuple(batch), min(max(left, 0), n)
        left -= n


def batches(ds: Dataset, batch_size: int, limit: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Materialise up to `limit` samples of `ds` as a list of batches (calibration sets).

    Under torch.distributed these are this rank's shards of the global batches, without the
    sampler's padding (so a rank's last batch may be smaller, or empty).
    """
    if limit is not None and limit < len(ds):
        ds = Subset(ds, list(range(limit)))
    return [tuple(t[:real] for t in b) for b, real in sharded_batches(ds, batch_size)]


def bootstrap(batch_list: Sequence[tuple[torch.Tensor, ...]], seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Resample the samples of `batch_list` with replacement, keeping the batch sizes.

    Under torch.distributed each rank resamples its own shard (a bootstrap stratified by rank);
    scores summed over ranks then come from one resample of the whole set.
    """
    cols = [torch.cat(c) for c in zip(*batch_list)]
    n = cols[0].shape[0]
    if n == 0:  # a rank whose shard is empty
        return list(batch_list)
    idx = torch.randint(0, n, (n,), generator=torch.Generator().manual_seed(seed + 7919 * rank()))
    sizes = [b[0].shape[0] for b in batch_list]
    return [tuple(c[chunk] for c in cols) for chunk in torch.split(idx, sizes)]
