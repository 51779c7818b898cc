"""Fashion-MNIST for pretrained image models: the committed subset (`datasets/fashion_mnist.npz`,
built by `compressor.data.fashion_sources`), some classes in-distribution and the others held out
as near OOD; far OOD from what already ships (scikit-learn's digits and sample-photo crops);
shift from corrupted test images. Every image goes through the model's own timm eval transform
(grey 28 px -> RGB at the model's input size, its normalisation), exactly what `predict` applies
to an image file, so a reloaded export sees what evaluation saw.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import TensorDataset

from compressor.core.errors import OptionError
from compressor.data.bundle import DataBundle, split_indices
from compressor.data.committed import verified_bytes
from compressor.data.digits import corrupt
from compressor.data.outliers import shuffle_patches, synthetic_outliers

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DEFAULT_IN_CLASSES = tuple(range(7))  # Sneaker, Bag and Ankle boot held out (near OOD)


def fashion_arrays() -> dict[str, np.ndarray]:
    """The committed subset: train_x/train_y (300 per class), test_x/test_y (100 per class), uint8."""
    blob = verified_bytes("fashion_mnist.npz", "data.source 'fashion_mnist'")
    with np.load(io.BytesIO(blob)) as f:
        return {k: f[k] for k in f.files}


def _through(transform, images: np.ndarray) -> torch.Tensor:
    """uint8 grey images [N, H, W] as the model's inputs, one PIL image at a time (as predict reads files)."""
    from PIL import Image

    return torch.stack([transform(Image.fromarray(im, mode="L").convert("RGB")) for im in images])


def _digits_and_photos(n: int, seed: int) -> dict[str, np.ndarray]:
    """Far OOD as uint8 grey 28 px images: scikit-learn's digits and crops of its sample photos."""
    from PIL import Image
    from sklearn.datasets import load_digits, load_sample_images

    rng = np.random.default_rng(seed)
    digits = load_digits().images[rng.permutation(1797)[:n]]
    digit_images = [np.asarray(Image.fromarray((d * 255 / 16).astype(np.uint8)).resize((28, 28))) for d in digits]
    photos = [img.mean(axis=2).astype(np.uint8) for img in load_sample_images().images]
    crops = []
    for i in range(n):
        p = photos[i % len(photos)]
        size = int(rng.integers(28, 160))
        r, c = rng.integers(0, p.shape[0] - size), rng.integers(0, p.shape[1] - size)
        crops.append(np.asarray(Image.fromarray(p[r : r + size, c : c + size]).resize((28, 28), Image.BILINEAR)))
    return {"digits": np.stack(digit_images), "photos": np.stack(crops)}


def fashion_bundle(
    transform,
    data_cfg: dict,
    in_classes: Sequence[int] = DEFAULT_IN_CLASSES,
    seed: int = 0,
    val_fraction: float = 0.15,
    corruptions: Sequence[str] = ("noise", "blur", "rotate"),
    n_far: int = 300,
) -> DataBundle:
    """Train/val from the subset's training images of `in_classes`, test from its test images of
    them; the other classes' test images are the near OOD set. `transform` is the model's timm eval
    transform and `data_cfg` its timm data config (recorded as the export's preprocessing)."""
    in_classes = list(in_classes)
    if not in_classes or sorted(set(in_classes)) != sorted(in_classes) or not set(in_classes) <= set(range(10)):
        raise OptionError(f"data.in_classes: expected distinct Fashion-MNIST classes in 0..9, got {in_classes}")
    a = fashion_arrays()
    remap = {c: i for i, c in enumerate(in_classes)}
    is_in_train, is_in_test = np.isin(a["train_y"], in_classes), np.isin(a["test_y"], in_classes)
    x_train = _through(transform, a["train_x"][is_in_train])
    y_train = torch.as_tensor([remap[int(c)] for c in a["train_y"][is_in_train]])
    tr, va = split_indices(len(y_train), (1 - val_fraction, val_fraction), seed)
    test_x = _through(transform, a["test_x"][is_in_test])
    test_y = torch.as_tensor([remap[int(c)] for c in a["test_y"][is_in_test]])
    held_out = sorted(set(range(10)) - set(in_classes))
    ood = {"held_out_classes": TensorDataset(_through(transform, a["test_x"][~is_in_test]))} if held_out else {}
    far = _digits_and_photos(n_far, seed)
    ood |= {name: TensorDataset(_through(transform, images)) for name, images in far.items()}
    mean = torch.tensor(data_cfg["mean"]).view(1, -1, 1, 1)
    background = -mean / torch.tensor(data_cfg["std"]).view(1, -1, 1, 1)  # black after normalisation
    shift = {k: TensorDataset(corrupt(test_x, k, seed, background=background), test_y) for k in corruptions}
    return DataBundle(
        train=TensorDataset(x_train[tr], y_train[tr]),
        val=TensorDataset(x_train[va], y_train[va]),
        test=TensorDataset(test_x, test_y),
        ood=ood,
        shift=shift,
        class_names=[CLASSES[c] for c in in_classes],
        in_chans=3,
        img_size=int(data_cfg["input_size"][-1]),
        ood_val=synthetic_outliers(x_train[va], shuffle_patches, seed),
        make_outliers=shuffle_patches,
        ood_kinds={"held_out_classes": "near", "digits": "far", "photos": "far"},
        preprocessing={"kind": "image", **{k: list(v) if isinstance(v, tuple) else v for k, v in data_cfg.items()}},
    )
