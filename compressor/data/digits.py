"""The embedded default: scikit-learn's bundled digits (1,797 real 8x8 handwritten digits), no network.

Classes 0-7 are in-distribution (or `in_classes`); the other digits are semantic OOD; corrupted
test digits (noise, blur, rotation) are shifted data; crops of scikit-learn's bundled sample
photos are far OOD.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from compressor.core.errors import OptionError
from compressor.data.bundle import DataBundle, split_indices
from compressor.data.outliers import shuffle_patches, synthetic_outliers

DIGITS_MEAN, DIGITS_STD = 0.3, 0.4


def _prepare(images: np.ndarray, img_size: int) -> torch.Tensor:
    """8x8 digits in 0..16 -> [N, 1, img_size, img_size] normalised float tensors."""
    x = torch.as_tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    if img_size != 8:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return (x - DIGITS_MEAN) / DIGITS_STD


def corrupt(x: torch.Tensor, kind: str, seed: int = 0, background: torch.Tensor | float | None = None) -> torch.Tensor:
    """Shifted copies of normalised images: 'noise', 'blur' or 'rotate' (filling with `background`,
    the normalised value of black; default: the digits')."""
    g = torch.Generator().manual_seed(seed)
    if kind == "noise":
        return x + 0.8 * torch.randn(x.shape, generator=g)
    if kind == "blur":
        k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        k = (k[:, None] * k[None, :]) / 256.0
        pad = F.pad(x, (2, 2, 2, 2), mode="replicate")
        channels = x.shape[1]
        return F.conv2d(pad, k[None, None].to(x.dtype).expand(channels, 1, 5, 5).contiguous(), groups=channels)
    if kind == "rotate":
        angle = (torch.rand(x.shape[0], generator=g) * 2 - 1) * (np.pi / 4)
        cos, sin = torch.cos(angle), torch.sin(angle)
        theta = torch.stack(
            [torch.stack([cos, -sin, torch.zeros_like(cos)], 1), torch.stack([sin, cos, torch.zeros_like(cos)], 1)], 1
        )
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        background = -DIGITS_MEAN / DIGITS_STD if background is None else background
        return F.grid_sample(x - background, grid, align_corners=False) + background
    raise OptionError(f"unknown corruption '{kind}'; choices: noise, blur, rotate")


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
    tr, va, te = split_indices(len(y_in), (0.6, 0.15, 0.25), seed)
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
