"""`data.source: dataset`: a user's own dataset (compressor.data.tables reads and checks it) as the
DataBundle every step reads. Texts go through the model's own tokenizer, images through the model's
own timm preprocessing, exactly as the committed text benchmarks and image folders do.

    data:
      source: dataset
      path: csv                     # csv | json | parquet | a save_to_disk folder | a hub name
      data_files: {train: data/train.csv, test: data/test.csv}   # relative to the recipe file
      text_column: text             # or image_column: image (images or image paths)
      label_column: label           # integers, strings or a ClassLabel
      heldout_fraction: 0.1         # the held-out split when there is no validation split
      ood: [{path: json, data_files: data/ood.jsonl}]            # test OOD sets, the same keys
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from compressor.core.errors import InputError
from compressor.core.schema import NUM, Field
from compressor.data.bundle import DataBundle, split_indices
from compressor.data.tables import (
    HELDOUT_SPLITS,
    Labels,
    Source,
    check_images,
    check_no_shared_rows,
    check_texts,
    fingerprint,
    label_encoding,
    need_column,
    read_splits,
    resolved,
    row_keys,
)

DATASET_FIELDS: dict[str, Field] = {
    "path": Field((str, type(None)), None, doc="dataset: csv, json, parquet, a save_to_disk folder or a hub name"),
    "data_files": Field(
        (str, list, dict, type(None)), None, doc="dataset: file(s) or {split: file(s)}, beside the recipe"
    ),
    "text_column": Field((str, type(None)), None, doc="dataset: the column of texts"),
    "image_column": Field((str, type(None)), None, doc="dataset: the column of images (or image file paths)"),
    "label_column": Field((str,), "label", doc="dataset: the column of labels (integers, strings or a ClassLabel)"),
    "heldout_fraction": Field(
        NUM, 0.1, check=lambda v: None if 0 < v < 0.5 else "a number in (0, 0.5)", doc="dataset: held-out share"
    ),
    "ood": Field((list,), [], doc="dataset: test OOD sets, each {path, data_files, name, text_column/image_column}"),
}
OOD_KEYS = ("path", "data_files", "name", "text_column", "image_column")
TOKENIZE_CHUNK = 8192  # texts per tokenizer call: peak memory stays flat on a large corpus


@dataclass
class UserDataset:
    """What was read and checked: splits, the input column and its kind, labels, OOD sets."""

    splits: dict[str, Any]
    column: str
    kind: str  # "text" or "image"
    labels: Labels
    label_column: str
    ood: dict[str, Any]  # name -> datasets.Dataset
    ood_columns: dict[str, str]
    base: Path  # where relative image paths start


def _ood_entry(entry: Any, i: int, column: str, kind: str) -> tuple[Source, str, str]:
    where = f"data.ood[{i}]"
    if not isinstance(entry, dict) or "path" not in entry:
        raise InputError(f"{where}: expected a mapping with path (and data_files), got {entry!r}"[:200])
    unknown = sorted(set(entry) - set(OOD_KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(OOD_KEYS)}")
    col = entry.get(f"{kind}_column") or column
    files = entry.get("data_files")
    default = Path(files if isinstance(files, str) else str(entry["path"])).stem or f"ood{i}"
    return Source(str(entry["path"]), files, where), col, str(entry.get("name") or default)


def read_user_dataset(d: dict, base: Path) -> UserDataset:
    """Read and check `data` (source: dataset) before any work: every bad-data case is one line."""
    if not d["path"]:
        raise InputError("data.path: missing; expected csv, json, parquet, a save_to_disk folder or a hub name")
    if bool(d["text_column"]) == bool(d["image_column"]):
        raise InputError("data.text_column: expected exactly one of text_column or image_column")
    kind = "text" if d["text_column"] else "image"
    column = d["text_column"] or d["image_column"]
    splits = read_splits(resolved(Source(d["path"], d["data_files"], "data"), base))
    heldout = next((s for s in HELDOUT_SPLITS if s in splits), None)
    for need in ("train", "test"):
        if need not in splits:
            raise InputError(f"data.data_files: no '{need}' split; it has {', '.join(splits)} (name them train, test)")
    kept = {"train": splits["train"], "test": splits["test"], **({"val": splits[heldout]} if heldout else {})}
    shown = {"train": "train", "test": "test", "val": heldout}  # the user's own split names, for errors
    for key, split in kept.items():
        name = shown[key]
        need_column(split, column, "data", name, f"{kind}_column")
        need_column(split, d["label_column"], "data", name, "label_column")
        if len(split) == 0:
            raise InputError(f"data.data_files: split '{name}' has no rows")
        if kind == "text":
            check_texts(split[column], "data", column, name)
        else:
            check_images(split, column, "data", name, base)
    labels = label_encoding(kept["train"], d["label_column"], "data")
    for key in ("test", "val"):
        if key in kept:
            labels.encode(kept[key][d["label_column"]], "data", d["label_column"], shown[key])
    train_keys = set(row_keys(kept["train"], column, kind))
    ood, ood_columns = {}, {}
    for i, entry in enumerate(d["ood"]):
        source, col, name = _ood_entry(entry, i, column, kind)
        split = read_splits(resolved(source, base))
        table = split.get("train", next(iter(split.values())))
        need_column(table, col, source.where, "train", f"{kind}_column")
        if kind == "text":
            check_texts(table[col], source.where, col, name)
        else:
            check_images(table, col, source.where, name, base)
        check_no_shared_rows(train_keys, row_keys(table, col, kind), source.where)
        if name in ood:
            raise InputError(
                f"{source.where}.name: '{name}' is the name of an earlier OOD set; expected distinct names"
            )
        ood[name], ood_columns[name] = table, col
    return UserDataset(kept, column, kind, labels, d["label_column"], ood, ood_columns, base)


def tokenized(tok: Any, texts: list[str], max_length: int) -> torch.Tensor:
    """Token ids [N, max_length] as the model's tokenizer makes them, in chunks."""
    parts = [
        tok(
            texts[i : i + TOKENIZE_CHUNK],
            padding="max_length",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )["input_ids"]
        for i in range(0, len(texts), TOKENIZE_CHUNK)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, max_length, dtype=torch.long)


class ImageRows(Dataset):
    """Rows of an image column (PIL images or paths), decoded and transformed on read, with labels."""

    def __init__(
        self, table: Any, column: str, transform: Any, mode: str, base: Path, labels: list[int] | None
    ) -> None:
        self.table, self.column, self.transform, self.mode, self.base, self.labels = (
            table,
            column,
            transform,
            mode,
            base,
            labels,
        )

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        from compressor.data.images import open_image

        cell = self.table[int(i)][self.column]
        if isinstance(cell, str):
            image = open_image(cell if Path(cell).is_absolute() else self.base / cell, self.mode)
        else:
            image = cell.convert(self.mode)
        x = self.transform(image)
        return (x,) if self.labels is None else (x, torch.tensor(self.labels[int(i)]))


def _heldout(train: Any, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    val, rest = split_indices(len(train), (fraction, 1 - fraction), seed)
    return np.sort(rest), np.sort(val)


def dataset_bundle(
    d: dict, base: Path, model_name: str, model: torch.nn.Module | None = None, pretrained: bool = False
) -> DataBundle:
    """The DataBundle of a user's dataset: train / held-out / test splits, test OOD sets, validation
    outliers (token-shuffled texts, patch-shuffled images), the class names, the preprocessing."""
    ud = read_user_dataset(d, base)
    seed = d["seed"]
    encode = functools.partial(ud.labels.encode, where="data", column=ud.label_column)
    train, test = ud.splits["train"], ud.splits["test"]
    if "val" in ud.splits:
        train_idx, val_tab = np.arange(len(train)), ud.splits["val"]
    else:
        train_idx, val_idx = _heldout(train, d["heldout_fraction"], seed)
        val_tab = train.select(val_idx.tolist())
    train_tab = train.select(train_idx.tolist()) if len(train_idx) != len(train) else train
    labelled = {"train": train_tab, "val": val_tab, "test": test}
    ys = {name: encode(t[ud.label_column], split=name) for name, t in labelled.items()}
    if ud.kind == "text":
        bundle = _text_bundle(ud, labelled, ys, model_name, d["max_length"], seed)
    else:
        bundle = _image_bundle(ud, labelled, ys, d, model, pretrained, seed)
    bundle.fingerprint = fingerprint(ud.splits)
    return bundle


def _text_bundle(ud: UserDataset, labelled: dict, ys: dict, model_name: str, max_length: int, seed: int) -> DataBundle:
    from transformers import AutoTokenizer

    from compressor.data.outliers import shuffle_tokens, synthetic_outliers
    from compressor.data.text import resolve_model_path
    from compressor.families.hf import tokenizer_pad_id

    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_name))
    ids = {name: tokenized(tok, list(t[ud.column]), max_length) for name, t in labelled.items()}
    sets = {name: TensorDataset(ids[name], torch.tensor(ys[name])) for name in ids}
    make = functools.partial(shuffle_tokens, pad_id=tokenizer_pad_id(tok))
    ood = {n: TensorDataset(tokenized(tok, list(t[ud.ood_columns[n]]), max_length)) for n, t in ud.ood.items()}
    return DataBundle(
        train=sets["train"],
        val=sets["val"],
        test=sets["test"],
        ood=ood,
        class_names=ud.labels.names,
        in_chans=0,
        img_size=0,
        ood_val=synthetic_outliers(ids["val"], make, seed),
        make_outliers=make,
        preprocessing={"kind": "text", "tokenizer": resolve_model_path(model_name), "max_length": max_length},
    )


def _image_bundle(
    ud: UserDataset, labelled: dict, ys: dict, d: dict, model: torch.nn.Module, pretrained: bool, seed: int
) -> DataBundle:
    from compressor.data.images import image_transforms
    from compressor.data.outliers import shuffle_patches, synthetic_outliers

    overrides = {k: d[k] for k in ("img_size", "mean", "std", "interpolation", "crop_pct")}
    tf_eval, tf_train, cfg = image_transforms(model, overrides, d["augment"], pretrained)
    mode = "L" if cfg["input_size"][0] == 1 else "RGB"
    rows = functools.partial(ImageRows, column=ud.column, mode=mode, base=ud.base)
    train = rows(labelled["train"], transform=tf_train, labels=ys["train"])
    val = rows(labelled["val"], transform=tf_eval, labels=ys["val"])
    test = rows(labelled["test"], transform=tf_eval, labels=ys["test"])
    ood = {
        n: ImageRows(t, ud.ood_columns[n], tf_eval, mode, ud.base, None) for n, t in ud.ood.items()
    }  # fmt: skip
    held = torch.stack([val[i][0] for i in range(len(val))])
    return DataBundle(
        train=train,
        val=val,
        test=test,
        ood=ood,
        class_names=ud.labels.names,
        in_chans=int(cfg["input_size"][0]),
        img_size=int(cfg["input_size"][-1]),
        ood_val=synthetic_outliers(held, shuffle_patches, seed),
        make_outliers=shuffle_patches,
        preprocessing={"kind": "image", **{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}},
    )
