"""A user's image folder (`root/train/<class>/*`, `root/val/<class>/*`), read with torchvision and
preprocessed as the model expects (timm's data config of the model, the recipe's overrides)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, Subset

from compressor.core.errors import InputError
from compressor.data.bundle import DataBundle, Unlabelled, split_indices
from compressor.data.outliers import shuffle_patches, synthetic_outliers


def image_transforms(
    model: torch.nn.Module, overrides: dict | None = None, augment: str = "light", pretrained: bool = False
):
    """(eval transform, train transform, data config) for a user's images: the timm data config
    of the model, with the input size the model actually takes (its family knows it) and the
    recipe's overrides (img_size, mean, std, interpolation, crop_pct). The architecture's pretrained
    config (its crop_pct) applies only to its `pretrained` weights; any other model sees the whole
    image (crop_pct 1.0) with timm's default normalisation for the architecture.

    augment: 'none' (the eval transform), 'light' (flips and small shifted crops; for images of
    64 px and more, a random resized crop of 50-100% of the area) or 'timm' (timm's ImageNet
    training augmentation, meant for large images).
    """
    import timm.data
    from torchvision import transforms as T

    from compressor.families import family_of

    cfg = dict(timm.data.resolve_data_config({}, model=model))
    if not pretrained:
        cfg["crop_pct"] = 1.0
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


MAX_PIXELS = 1 << 26  # 67M pixels (8192 x 8192): a larger image is refused from its header, before decoding


def open_image(path: str | Path, mode: str = "RGB", size_only: bool = False):  # noqa: ANN201 - PIL, lazily
    """The image at `path` decoded in `mode` (or only its (width, height) read from the header); a
    one-line InputError naming the file when it is not a readable image or has more than MAX_PIXELS
    pixels (a decompression bomb never gets decoded)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.width * im.height > MAX_PIXELS:
                raise InputError(
                    f"{path}: {im.width}x{im.height} px, too large; expected at most {MAX_PIXELS:,} pixels"
                )
            return im.size if size_only else im.convert(mode)
    except Image.DecompressionBombError as e:
        raise InputError(f"{path}: too large to decode; expected at most {MAX_PIXELS:,} pixels") from e
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise InputError(f"{path}: not a readable image ({' '.join(str(e).split()) or type(e).__name__})") from e


def check_files_once(root: Path, paths: Sequence[str]) -> None:
    """Every image of the splits is a distinct file inside `root`: a symbolic link that leaves the
    folder, or one that brings a file in twice (a link loop repeats a file once per level), is a
    one-line InputError before any work."""
    top = root.resolve()
    seen: dict[Path, str] = {}
    for path in paths:
        real = Path(path).resolve()
        if top not in real.parents:
            raise InputError(f"data.root: {path} is a link to {real}, outside {root}; expected files inside it")
        if real in seen:
            raise InputError(
                f"data.root: {path} and {seen[real]} are the same file ({real}); a link loop or a duplicate "
                "would put it in the splits twice"
            )
        seen[real] = path


def image_folder_bundle(
    root: str,
    model: torch.nn.Module,
    ood_roots: Sequence[str] = (),
    val_fraction: float = 0.1,
    seed: int = 0,
    ood_val_roots: Sequence[str] = (),
    overrides: dict | None = None,
    augment: str = "light",
    pretrained: bool = False,
) -> DataBundle:
    """A user's image folder (`root/train/<class>/*`, `root/val/<class>/*`) read with torchvision.

    Transforms follow the model (`image_transforms`). `ood_roots` are folders of images (any class
    layout) used as test OOD sets; `ood_val_roots` folders of validation outliers (default:
    patch-shuffled held-out images).
    """
    from torchvision.datasets import ImageFolder

    tf_eval, tf_train, cfg = image_transforms(model, overrides, augment, pretrained)
    root_p = Path(root)
    train = ImageFolder(str(root_p / "train"), transform=tf_train, loader=open_image)
    test = ImageFolder(str(root_p / "val"), transform=tf_eval, loader=open_image)
    check_files_once(root_p, [path for path, _ in train.samples + test.samples])
    notes = [note] if (note := resize_note(test.samples[0][0], cfg, crop_origin(overrides))) else []
    val_idx, tr_idx = split_indices(len(train), (val_fraction, 1 - val_fraction), seed)
    val_full = ImageFolder(str(root_p / "train"), transform=tf_eval, loader=open_image)
    ood = {Path(r).name: Unlabelled(ImageFolder(r, transform=tf_eval, loader=open_image)) for r in ood_roots}
    val = Subset(val_full, val_idx.tolist())
    if ood_val_roots:
        ood_val = ConcatDataset(
            [Unlabelled(ImageFolder(r, transform=tf_eval, loader=open_image)) for r in ood_val_roots]
        )
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
        notes=notes,
    )


def crop_origin(overrides: dict | None) -> str:
    """Where the eval crop comes from, for the size notes: the recipe's data.crop_pct or the model's config."""
    return "data.crop_pct" if (overrides or {}).get("crop_pct") is not None else "the pretrained config"


def resize_note(path: str, cfg: dict, crop_origin: str) -> str | None:
    """One line when the eval transform resizes or crops `path`'s image away from its native size."""
    return size_note(open_image(path, size_only=True), cfg, crop_origin, f"e.g. {path}")


def size_note(size: tuple[int, int], cfg: dict, crop_origin: str, example: str) -> str | None:
    """One line when the eval transform `cfg` resizes or crops images of `size` (width, height)."""
    width, height = size
    side, crop = int(cfg["input_size"][-1]), float(cfg.get("crop_pct") or 1.0)
    if (width, height) == (side, side) and crop >= 1.0:
        return None
    resized = int(side / crop) if crop < 1.0 else side
    cropping = f" and centre-crops {side} px (crop_pct {crop:g} from {crop_origin})" if crop < 1.0 else ""
    return (
        f"data: images are {width}x{height} px ({example}); evaluation resizes them to {resized} px "
        f"({cfg['interpolation']}){cropping}; set data.img_size / data.crop_pct to change it"
    )
