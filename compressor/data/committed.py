"""The data files committed under `compressor/datasets/`, each read only after its sha256 matches
`MANIFEST.json`: a missing or edited file is a one-line error naming it (see datasets/README.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from compressor.core.errors import InputError
from compressor.core.io import file_sha256

DATASETS = Path(__file__).parents[1] / "datasets"


def record_in_manifest(path: Path) -> str:
    """Write `path`'s sha256 into the MANIFEST.json beside it (what a dataset builder does last); the hash."""
    manifest_path = path.parent / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[path.name] = file_sha256(path)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return manifest[path.name]


def verified_bytes(name: str, where: str, datasets: Path | None = None) -> bytes:
    """The bytes of committed file `name`, checked against MANIFEST.json (`where` names the recipe key)."""
    datasets = datasets or DATASETS
    path = datasets / name
    where = f"{where}: {path}"
    if not path.is_file():
        raise InputError(f"{where}: file missing (reinstall compressor, or rebuild it: see datasets/README.md)")
    expected = json.loads((datasets / "MANIFEST.json").read_text()).get(path.name)
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != expected:
        raise InputError(f"{where}: sha256 differs from MANIFEST.json (edited or damaged; reinstall or rebuild it)")
    return blob
