"""A user's dataset read through Hugging Face `datasets`: CSV, JSON Lines or Parquet files, a
`save_to_disk` folder, or a hub name (with network), and the checks that stop bad data before any
work: missing columns, empty texts, labels the train split never saw, undecodable images, an OOD
set that shares rows with the train split. Arrow files are memory-mapped, so a large corpus need
not fit in memory. Every error is one line naming the file, the column and what was expected."""

from __future__ import annotations

import hashlib
import os
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressor.core.errors import InputError

FILE_BUILDERS = ("csv", "json", "parquet")
SUFFIX_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
HELDOUT_SPLITS = ("validation", "val", "valid", "dev")


@dataclass
class Source:
    """Where one dataset comes from (the recipe's data block, or one of its `ood` entries)."""

    path: str
    data_files: Any = None  # a file, a list of files, or {split: file(s)}
    where: str = "data"  # the recipe key, for errors

    def describe(self) -> str:
        files = self.data_files
        if isinstance(files, dict):
            files = ", ".join(f"{k}: {v}" for k, v in files.items())
        return f"{self.path} ({files})" if files else self.path


def _absolute(files: Any, base: Path) -> Any:
    if files is None:
        return None
    if isinstance(files, dict):
        return {k: _absolute(v, base) for k, v in files.items()}
    if isinstance(files, (list, tuple)):
        return [_absolute(f, base) for f in files]
    return str(files if Path(files).is_absolute() else base / files)


def _file_list(files: Any) -> list[str]:
    if isinstance(files, dict):
        return [f for v in files.values() for f in _file_list(v)]
    return list(files) if isinstance(files, (list, tuple)) else [files]


def resolved(source: Source, base: Path) -> Source:
    """The source with its files (and a local folder path) made absolute against `base` (the recipe's
    folder), every named file checked to exist."""
    files = _absolute(source.data_files, base)
    for f in _file_list(files) if files is not None else []:
        if not isinstance(f, str) or not Path(f).is_file():
            raise InputError(f"{source.where}.data_files: no such file '{f}'")
    path = source.path
    if path not in FILE_BUILDERS and not Path(path).is_absolute() and (base / path).exists():
        path = str(base / path)
    return Source(path, files, source.where)


def _online(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or os.environ.get("HF_DATASETS_OFFLINE"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def read_splits(source: Source) -> dict[str, Any]:
    """split name -> `datasets.Dataset` of the source (a single table is the 'train' split)."""
    import datasets

    datasets.disable_progress_bars()
    path, files = source.path, source.data_files
    try:
        if path in FILE_BUILDERS:
            if files is None:
                raise InputError(f"{source.where}.data_files: missing; expected the {path} file(s) to read")
            loaded = datasets.load_dataset(path, data_files=files)
        elif Path(path).is_dir():
            if not any((Path(path) / name).is_file() for name in ("dataset_dict.json", "state.json")):
                raise InputError(
                    f"{source.where}.path: '{path}' is a folder but not one written by datasets' save_to_disk "
                    "(no dataset_dict.json or state.json); expected csv, json, parquet or a save_to_disk folder"
                )
            loaded = datasets.load_from_disk(path)
        elif Path(path).suffix.lower() in SUFFIX_BUILDERS or Path(path).is_file():
            kind = SUFFIX_BUILDERS.get(Path(path).suffix.lower(), "csv|json|parquet")
            raise InputError(
                f"{source.where}.path: '{path}' is a file; expected path: {kind} with data_files naming the file(s)"
            )
        elif not _online():
            raise InputError(
                f"{source.where}.path: '{path}' is not a local folder, so it would be a Hugging Face hub name, "
                "and there is no network here (or HF_HUB_OFFLINE is set); expected csv, json, parquet or a "
                "save_to_disk folder"
            )
        else:
            loaded = datasets.load_dataset(path, data_files=files)
    except InputError:
        raise
    except Exception as e:  # a file datasets cannot parse
        message = " ".join(str(e).split())[:300] or type(e).__name__
        raise InputError(f"{source.where}: {source.describe()}: cannot be read by datasets ({message})") from e
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def fingerprint(splits: dict[str, Any]) -> str:
    """One hash of every split's content (datasets' own fingerprints, which follow the files' bytes)."""
    parts = [f"{name}:{getattr(split, '_fingerprint', '')}:{len(split)}" for name, split in sorted(splits.items())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def need_column(split: Any, column: str, where: str, name: str, key: str) -> None:
    if column not in split.column_names:
        raise InputError(
            f"{where}.{key}: no column '{column}' in split '{name}' of {where}; it has {', '.join(split.column_names)}"
        )


def check_texts(texts: Sequence[Any], where: str, column: str, split: str) -> None:
    """Every text is a non-empty string."""
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            got = "an empty text" if isinstance(t, str) else f"{type(t).__name__} {t!r}"[:80]
            raise InputError(f"{where}: column '{column}', split '{split}', row {i}: {got}; expected a non-empty text")


@dataclass
class Labels:
    """How the label column maps to class indices 0..K-1, and the class names recorded in the export."""

    names: list[str]
    kind: str  # "classlabel", "string" or "int"

    def encode(self, values: Sequence[Any], where: str, column: str, split: str) -> list[int]:
        if self.kind == "string":
            index = {n: i for i, n in enumerate(self.names)}
            unseen = sorted({str(v) for v in values if v not in index})
            if unseen:
                raise InputError(
                    f"{where}: column '{column}', split '{split}': label '{unseen[0]}' that the train split "
                    f"never has ({len(unseen)} such); expected one of {', '.join(self.names[:10])}"
                )
            return [index[v] for v in values]
        k = len(self.names)
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < k:
                what = "of the ClassLabel" if self.kind == "classlabel" else "the train split has"
                raise InputError(
                    f"{where}: column '{column}', split '{split}', row {i}: label {v!r}; expected an integer "
                    f"in 0..{k - 1} (the classes {what})"
                )
        return list(values)


def label_encoding(train: Any, column: str, where: str) -> Labels:
    """Labels from the train split: a ClassLabel's names, the sorted distinct strings, or integers
    0..max. At least 2 classes, each with at least 2 training samples."""
    import datasets

    feature = train.features[column]
    values = train[column]
    if isinstance(feature, datasets.ClassLabel):
        labels = Labels(list(feature.names), "classlabel")
    elif all(isinstance(v, str) for v in values):
        labels = Labels(sorted(set(values)), "string")
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if min(values, default=0) < 0:
            raise InputError(f"{where}: column '{column}', split 'train': label {min(values)}; expected integers >= 0")
        labels = Labels([str(i) for i in range(max(values, default=-1) + 1)], "int")
    else:
        odd = next(v for v in values if not isinstance(v, (int, str)) or isinstance(v, bool))
        raise InputError(
            f"{where}: column '{column}', split 'train': label {odd!r}; expected integers, strings or a ClassLabel"
        )
    counts = Counter(labels.encode(values, where, column, "train"))
    if len(labels.names) < 2:
        raise InputError(f"{where}: column '{column}', split 'train': {len(labels.names)} class; expected at least 2")
    few = [labels.names[c] for c in range(len(labels.names)) if counts[c] < 2]
    if few:
        raise InputError(
            f"{where}: column '{column}', split 'train': class '{few[0]}' has {counts[labels.names.index(few[0])]} "
            "training samples; expected at least 2 per class"
        )
    return labels


def row_keys(split: Any, column: str, kind: str) -> list[str]:
    """One key per row that identifies its input: the text, or a hash of the image's bytes (or its path)."""
    if kind == "text":
        return [str(t) for t in split[column]]
    return [_image_key(v) for v in image_cells(split, column)]


def image_cells(split: Any, column: str) -> list[Any]:
    """The column's cells undecoded: {'bytes', 'path'} for a datasets Image column, else the values (paths)."""
    import datasets

    if isinstance(split.features[column], datasets.Image):
        split = split.cast_column(column, datasets.Image(decode=False))
    return split[column]


def _image_key(cell: Any) -> str:
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return hashlib.sha256(cell["bytes"]).hexdigest()
        return str(cell.get("path"))
    return str(cell)


def check_images(split: Any, column: str, where: str, name: str, base: Path) -> None:
    """Every cell decodes as an image (PIL images or image paths, relative to `base`)."""
    import io

    from compressor.data.images import open_image

    for i, cell in enumerate(image_cells(split, column)):
        try:
            if isinstance(cell, dict) and cell.get("bytes"):
                open_image(io.BytesIO(cell["bytes"]))
            else:
                path = cell.get("path") if isinstance(cell, dict) else cell
                if not isinstance(path, str):
                    raise InputError(f"{type(path).__name__} {path!r}"[:60])
                open_image(path if Path(path).is_absolute() else base / path)
        except InputError as e:
            raise InputError(
                f"{where}: column '{column}', split '{name}', row {i}: not a decodable image "
                f"({str(e).split(': ', 1)[-1]}); expected an image or an image file path"
            ) from e


def check_no_shared_rows(train_keys: set[str], ood_keys: Sequence[str], where: str) -> None:
    shared = [k for k in ood_keys if k in train_keys]
    if shared:
        raise InputError(
            f"{where}: {len(shared)} of its {len(ood_keys)} rows are also in the train split "
            f"(e.g. {shared[0][:60]!r}); expected a test OOD set that shares no rows with it"
        )


TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".jsonl": "json"}


def read_column(path: Path, column: str) -> list[Any]:
    """The values of `column` of a CSV, JSON Lines or Parquet file, in the file's row order."""
    builder = TABLE_SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise InputError(f"{path}: --column reads .csv, .jsonl or .parquet files; got '{path.suffix}'")
    table = read_splits(Source(builder, str(path), str(path)))["train"]
    if column not in table.column_names:
        raise InputError(f"{path}: no column '{column}'; it has {', '.join(table.column_names)}")
    return table[column]
