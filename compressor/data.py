"""Datasets for recipes: the offline digits default and user image folders.

The embedded default needs no network: scikit-learn's bundled digits (1,797 real 8x8 handwritten
digits). Classes 0-7 are in-distribution; digits 8-9 are semantic OOD; corrupted test digits
(noise, blur, rotation) are shifted data; crops of scikit-learn's bundled sample photos are far OOD.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from compressor.distributed import local_batch_size, rank, real_samples, sampler
from compressor.outliers import OutlierMaker, shuffle_patches, synthetic_outliers

DIGITS_MEAN, DIGITS_STD = 0.3, 0.4


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

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _prepare(images: np.ndarray, img_size: int) -> torch.Tensor:
    """8x8 digits in 0..16 -> [N, 1, img_size, img_size] normalised float tensors."""
    x = torch.as_tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    if img_size != 8:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return (x - DIGITS_MEAN) / DIGITS_STD


def _split(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum([int(round(f * n)) for f in fractions[:-1]])
    return np.split(order, cuts)


def corrupt(x: torch.Tensor, kind: str, seed: int = 0) -> torch.Tensor:
    """Shifted copies of normalised digit images: 'noise', 'blur' or 'rotate'."""
    g = torch.Generator().manual_seed(seed)
    if kind == "noise":
        return x + 0.8 * torch.randn(x.shape, generator=g)
    if kind == "blur":
        k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        k = (k[:, None] * k[None, :]) / 256.0
        pad = F.pad(x, (2, 2, 2, 2), mode="replicate")
        return F.conv2d(pad, k[None, None].to(x.dtype))
    if kind == "rotate":
        angle = (torch.rand(x.shape[0], generator=g) * 2 - 1) * (np.pi / 4)
        cos, sin = torch.cos(angle), torch.sin(angle)
        theta = torch.stack(
            [torch.stack([cos, -sin, torch.zeros_like(cos)], 1), torch.stack([sin, cos, torch.zeros_like(cos)], 1)], 1
        )
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        background = -DIGITS_MEAN / DIGITS_STD
        return F.grid_sample(x - background, grid, align_corners=False) + background
    raise ValueError(f"unknown corruption '{kind}'; choices: noise, blur, rotate")


def photo_crops(n: int, img_size: int, seed: int = 0) -> torch.Tensor:
    """Grey 8x8 crops of scikit-learn's bundled sample photos, scaled like digits (far OOD)."""
    from sklearn.datasets import load_sample_images

    photos = [img.mean(axis=2) for img in load_sample_images().images]
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(n):
        p = photos[i % len(photos)]
        size = int(rng.integers(16, 96))
        r, c = rng.integers(0, p.shape[0] - size), rng.integers(0, p.shape[1] - size)
        crop = torch.as_tensor(p[r : r + size, c : c + size], dtype=torch.float32)[None, None]
        crop = F.interpolate(crop, size=(8, 8), mode="area")[0, 0]
        crops.append(crop / 255.0 * 16.0)
    return _prepare(torch.stack(crops).numpy(), img_size)


def digits_bundle(
    img_size: int = 16,
    in_classes: Sequence[int] = tuple(range(8)),
    seed: int = 0,
    corruptions: Sequence[str] = ("noise", "blur", "rotate"),
    n_photo_crops: int = 300,
) -> DataBundle:
    """The embedded default: digits 0-7 in-distribution, 8-9 OOD, corrupted and photo sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images, digits.target
    in_classes = list(in_classes)
    is_in = np.isin(labels, in_classes)
    remap = {c: i for i, c in enumerate(in_classes)}
    x_in = _prepare(images[is_in], img_size)
    y_in = torch.as_tensor([remap[int(c)] for c in labels[is_in]], dtype=torch.long)
    tr, va, te = _split(len(y_in), (0.6, 0.15, 0.25), seed)
    test_x, test_y = x_in[te], y_in[te]
    x_out = _prepare(images[~is_in], img_size)
    near = "digits_" + "".join(str(c) for c in sorted(set(range(10)) - set(in_classes)))
    ood = {near: TensorDataset(x_out), "photos": TensorDataset(photo_crops(n_photo_crops, img_size, seed))}
    shift = {k: TensorDataset(corrupt(test_x, k, seed), test_y) for k in corruptions}
    return DataBundle(
        train=TensorDataset(x_in[tr], y_in[tr]),
        val=TensorDataset(x_in[va], y_in[va]),
        test=TensorDataset(test_x, test_y),
        ood=ood,
        shift=shift,
        class_names=[str(c) for c in in_classes],
        in_chans=1,
        img_size=img_size,
        ood_val=synthetic_outliers(x_in[va], shuffle_patches, seed),
        make_outliers=shuffle_patches,
        ood_kinds={near: "near", "photos": "far"},
        preprocessing=digits_preprocessing(img_size),
    )


def digits_preprocessing(img_size: int) -> dict:
    """How an image file becomes a digits-model input: grey, resized to img_size, x / 255 scaled
    like the 0..16 digits ((x - 0.3) / 0.4). A timm data config (timm.data.create_transform)."""
    return {
        "kind": "image",
        "input_size": [1, img_size, img_size],
        "interpolation": "bilinear",
        "mean": [DIGITS_MEAN],
        "std": [DIGITS_STD],
        "crop_pct": 1.0,
        "crop_mode": "center",
    }


def image_transforms(model: torch.nn.Module, overrides: dict | None = None, augment: str = "light"):
    """(eval transform, train transform, data config) for a user's images: the timm data config
    of the model, with the input size the model actually takes (its family knows it) and the
    recipe's overrides (img_size, mean, std, interpolation, crop_pct).

    augment: 'none' (the eval transform), 'light' (flips and small shifted crops; for images of
    64 px and more, a random resized crop of 50-100% of the area) or 'timm' (timm's ImageNet
    training augmentation, meant for large images).
    """
    import timm.data
    from torchvision import transforms as T

    from compressor.families import family_of

    cfg = dict(timm.data.resolve_data_config({}, model=model))
    size = family_of(model).input_size()
    if size is not None:
        cfg["input_size"] = tuple(size)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "img_size":
            cfg["input_size"] = (cfg["input_size"][0], int(value), int(value))
        else:
            cfg[key] = tuple(value) if isinstance(value, list) else value
    tf_eval = timm.data.create_transform(**cfg, is_training=False)
    if augment == "none":
        return tf_eval, tf_eval, cfg
    if augment == "timm":
        return tf_eval, timm.data.create_transform(**cfg, is_training=True), cfg
    side = int(cfg["input_size"][-1])
    crop = (
        T.RandomCrop(side, padding=max(1, side // 8), padding_mode="reflect")
        if side < 64
        else T.RandomResizedCrop(side, scale=(0.5, 1.0), interpolation=T.InterpolationMode(cfg["interpolation"]))
    )
    resize = T.Resize((side, side), interpolation=T.InterpolationMode(cfg["interpolation"]))
    normalize = T.Normalize(cfg["mean"], cfg["std"])
    return tf_eval, T.Compose([resize, crop, T.RandomHorizontalFlip(), T.ToTensor(), normalize]), cfg


def image_folder_bundle(
    root: str,
    model: torch.nn.Module,
    ood_roots: Sequence[str] = (),
    val_fraction: float = 0.1,
    seed: int = 0,
    ood_val_roots: Sequence[str] = (),
    overrides: dict | None = None,
    augment: str = "light",
) -> DataBundle:
    """A user's image folder (`root/train/<class>/*`, `root/val/<class>/*`) read with torchvision.

    Transforms follow the model (`image_transforms`). `ood_roots` are folders of images (any class
    layout) used as test OOD sets; `ood_val_roots` folders of validation outliers (default:
    patch-shuffled held-out images).
    """
    from torchvision.datasets import ImageFolder

    tf_eval, tf_train, cfg = image_transforms(model, overrides, augment)
    root_p = Path(root)
    train = ImageFolder(str(root_p / "train"), transform=tf_train)
    test = ImageFolder(str(root_p / "val"), transform=tf_eval)
    val_idx, tr_idx = _split(len(train), (val_fraction, 1 - val_fraction), seed)
    val_full = ImageFolder(str(root_p / "train"), transform=tf_eval)
    ood = {Path(r).name: _Unlabelled(ImageFolder(r, transform=tf_eval)) for r in ood_roots}
    val = Subset(val_full, val_idx.tolist())
    if ood_val_roots:
        ood_val = ConcatDataset([_Unlabelled(ImageFolder(r, transform=tf_eval)) for r in ood_val_roots])
    else:
        ood_val = synthetic_outliers(torch.stack([val[i][0] for i in range(len(val))]), shuffle_patches, seed)
    return DataBundle(
        train=Subset(train, tr_idx.tolist()),
        val=val,
        test=test,
        ood=ood,
        class_names=list(train.classes),
        in_chans=int(cfg["input_size"][0]),
        img_size=int(cfg["input_size"][-1]),
        ood_val=ood_val,
        make_outliers=shuffle_patches,
        preprocessing={"kind": "image", **{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}},
    )


class _Unlabelled(Dataset):
    def __init__(self, ds: Dataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        return (self.ds[i][0],)


def load_bundle(data_cfg: dict, model_name: str, model: torch.nn.Module | None = None) -> DataBundle:
    """The recipe's data: digits, a user's image folder (transforms follow `model`), or the
    bundled text sample tokenised for transformers model `model_name`."""
    if data_cfg["source"] == "digits":
        return digits_bundle(
            img_size=data_cfg["img_size"] or 16, in_classes=data_cfg["in_classes"], seed=data_cfg["seed"]
        )
    if data_cfg["source"] == "text":
        from compressor.text import text_bundle

        return text_bundle(
            model_name, data_cfg["max_length"], seed=data_cfg["seed"], ood_val_file=data_cfg["ood_val_file"]
        )
    overrides = {k: data_cfg[k] for k in ("img_size", "mean", "std", "interpolation", "crop_pct")}
    return image_folder_bundle(
        data_cfg["root"],
        model,
        data_cfg["ood_roots"],
        seed=data_cfg["seed"],
        ood_val_roots=data_cfg["ood_val_roots"],
        overrides=overrides,
        augment=data_cfg["augment"],
    )


def loader(ds: Dataset, batch_size: int, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> DataLoader:
    """This rank's DataLoader: a seeded `DistributedSampler` and the per-rank share of `batch_size`.

    In one process it reads every sample (shuffled with `seed + epoch` when asked); under
    torch.distributed each rank reads its shard and the N local batches of a step make up the
    global batch (see `compressor.distributed`).
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
