"""Data: the `DataBundle` every step reads, and where it comes from.

Sources: the embedded digits default (`digits`), a user's image folder (`images`), the committed
Fashion-MNIST subset for pretrained image models (`fashion`), the committed text benchmarks
(`text`: sentiment, topics), each committed file checked against its sha256 (`committed`),
and validation outliers (`outliers`: never a test OOD set).
Loaders are per-rank under torch.distributed (`bundle`). This layer sits above the model
families (image transforms follow the model; text uses its tokenizer) and below everything that
evaluates or trains.
"""

from __future__ import annotations

from pathlib import Path

import torch

from compressor.data.bundle import DataBundle, batches, bootstrap, loader, sharded_batches
from compressor.data.digits import corrupt, digits_bundle, digits_preprocessing, photo_crops
from compressor.data.images import crop_origin, image_folder_bundle, image_transforms, size_note


def load_bundle(
    data_cfg: dict,
    model_name: str,
    model: torch.nn.Module | None = None,
    pretrained: bool = False,
    base: Path | None = None,
) -> DataBundle:
    """The recipe's data: digits, a user's image folder (transforms follow `model`), the committed
    text benchmark tokenised for transformers model `model_name`, or a user's dataset read with
    `datasets` (its relative file names start at `base`, the recipe's folder)."""
    if data_cfg["source"] == "dataset":
        from compressor.data.dataset_source import dataset_bundle

        return dataset_bundle(data_cfg, base or Path.cwd(), model_name, model, pretrained)
    if data_cfg["source"] == "digits":
        return digits_bundle(
            img_size=data_cfg["img_size"] or 16, in_classes=data_cfg["in_classes"] or range(8), seed=data_cfg["seed"]
        )
    if data_cfg["source"] == "text":
        from compressor.data.text import text_bundle

        return text_bundle(
            model_name,
            data_cfg["task"],
            data_cfg["max_length"],
            seed=data_cfg["seed"],
            ood_val_file=data_cfg["ood_val_file"],
            max_samples=data_cfg["max_samples"],
        )
    overrides = {k: data_cfg[k] for k in ("img_size", "mean", "std", "interpolation", "crop_pct")}
    if data_cfg["source"] == "fashion_mnist":
        from compressor.data.fashion import DEFAULT_IN_CLASSES, fashion_bundle

        tf_eval, _, cfg = image_transforms(model, overrides, "none", pretrained)
        data = fashion_bundle(tf_eval, cfg, data_cfg["in_classes"] or DEFAULT_IN_CLASSES, seed=data_cfg["seed"])
        note = size_note((28, 28), cfg, crop_origin(data_cfg), "Fashion-MNIST")
        data.notes += [note] if note else []
        return data
    return image_folder_bundle(
        data_cfg["root"],
        model,
        data_cfg["ood_roots"],
        seed=data_cfg["seed"],
        ood_val_roots=data_cfg["ood_val_roots"],
        overrides=overrides,
        augment=data_cfg["augment"],
        pretrained=pretrained,
    )


__all__ = [
    "DataBundle",
    "batches",
    "bootstrap",
    "corrupt",
    "digits_bundle",
    "digits_preprocessing",
    "image_folder_bundle",
    "image_transforms",
    "load_bundle",
    "loader",
    "photo_crops",
    "sharded_batches",
]
