"""Atomic file writes: an interrupted run never leaves a half-written output behind.

Files and folders are written under a temporary name beside their target and renamed into place;
they end up with the permissions the user's umask gives (not the 0600/0700 of temporary files).
Also the one file hash (`file_sha256`) exports, manifests and downloaded-weight checks use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_SUFFIX = ".tmp"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read 1 MiB at a time (weights files may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _chmod_tree(path: Path) -> None:
    """Give `path` (and, for a folder, everything in it) the permissions of a normal file/folder."""
    mask = _umask()
    if path.is_dir():
        for root, _dirs, files in os.walk(path):
            os.chmod(root, 0o777 & ~mask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o666 & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary file path beside `path`; on success it is renamed to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _chmod_tree(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent))
    try:
        yield tmp
        _chmod_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old{TMP_SUFFIX}")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete temporary files and folders an interrupted earlier run left directly in `folder`."""
    removed = []
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
                removed.append(p)
    return removed


def _finite(obj):
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_text(obj, indent: int | None = 1) -> str:
    """Strict JSON: NaN and infinities become null (Python's json would write invalid NaN)."""
    return json.dumps(_finite(obj), indent=indent, allow_nan=False)
