"""An export's manifest: every file it holds with its sha256 (`manifest.json`, written last).

`compressor.load` checks the files it reads (config, masks, weights, tokenizer) against it before
anything is parsed or built: an edited, added-to or truncated file is a one-line ExportError naming
it, and an export without a manifest is refused rather than loaded unchecked. The manifest is a
list of hashes, not a signature: it catches damage and careless edits; whoever can rewrite the
folder can also rewrite it.
"""

from __future__ import annotations

import json
from pathlib import Path

from compressor.core.errors import ExportError
from compressor.core.io import file_sha256, json_text

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "compressor.manifest/1"


def write_manifest(folder: Path) -> None:
    """Hash every file under `folder` (but the manifest itself) into `folder/manifest.json`."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {p.relative_to(folder).as_posix(): file_sha256(p) for p in files}
    (folder / MANIFEST).write_text(json_text({"format": MANIFEST_FORMAT, "files": entries}))


def verify_manifest(folder: Path, required: list[str], optional: list[str] = ()) -> dict[str, str]:
    """Check the files `required` (and those of `optional` that are there or listed) against the
    manifest: present, listed, with the listed sha256. Paths are relative to `folder`; a folder
    name covers what the manifest lists under it. Returns the manifest's file -> sha256."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ExportError(f"{path}: missing; expected an export written by this version (re-export it)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"] if manifest.get("format") == MANIFEST_FORMAT else None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        files = None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ExportError(f"{path}: files: expected a '{MANIFEST_FORMAT}' mapping of file to sha256")
    for name in [*required, *optional]:
        under = [f for f in files if f.startswith(name.rstrip("/") + "/")]
        if name in optional and name not in files and not under and not (folder / name).exists():
            continue
        for listed in [name] if name in files or not under else under:
            file = folder / listed
            if listed not in files:
                raise ExportError(f"{file}: not in {MANIFEST}; expected every file the export reads to be listed")
            if not file.is_file():
                raise ExportError(f"{file}: missing; {MANIFEST} lists it")
            if file_sha256(file) != files[listed]:
                raise ExportError(f"{file}: sha256 differs from {MANIFEST} (edited or damaged)")
        if (folder / name).is_dir():  # a file added to a folder the export reads (a tokenizer's) is refused too
            for file in sorted(p for p in (folder / name).rglob("*") if p.is_file()):
                if file.relative_to(folder).as_posix() not in files:
                    raise ExportError(f"{file}: not in {MANIFEST}; added after the export was written")
    return files
